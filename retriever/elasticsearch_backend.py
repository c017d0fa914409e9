"""The server backend: one Elasticsearch 8 index of pages, for teams and large collections.

It stores the same records as the embedded tantivy backend (see
``es_mappings/pages.json``): a ``kind=page`` document per page and one
``kind=doc`` record per document. Each page's normalised text goes into the
language-neutral ``body`` field and into ``body_<lang>``, which Elasticsearch's
built-in analyzer for that language stems.

Replacing a document atomically
-------------------------------
Elasticsearch has no transactions, so a new version of a document is written
next to the old one and then switched on:

1. every page is written under a fresh ``generation`` value (with ``_id``
   ``{doc_id}:{generation}:{page}``), then the index is refreshed. Nothing reads
   these pages yet: readers only look at the generation the document record
   names.
2. the document record ``{doc_id}:doc`` is overwritten to name the new
   generation. That single write is the switch; searches see either the old
   pages or the new ones, never a mix.
3. the pages of older generations are deleted with ``delete_by_query``.

Page vectors (dense retrieval) travel with the pages: a page's ``windows`` are
nested documents, one ``dense_vector`` each, written in the same bulk request
under the same generation, so they switch with the pages. Dense search is a
nested kNN query filtered to the live generation of the requested documents;
a page scores its best window, as in the embedded backend.

If writing the pages fails half way, the pages of the new generation are
deleted again and the error is raised as ``BackendError``; the old version
stays as it was. Generations start with a nanosecond timestamp, so they sort by
age: two processes re-indexing the same id never delete each other's newer
pages, and the record never moves back to an older generation (the switch uses
optimistic concurrency control on the record).
"""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from contextlib import contextmanager
from importlib import resources
from typing import Iterator, Mapping, Sequence
from urllib.parse import urlsplit, urlunsplit

from elasticsearch import (
    ApiError,
    AuthenticationException,
    AuthorizationException,
    ConflictError,
    Elasticsearch,
    TransportError,
    helpers,
)

import numpy as np

from evidentia.records import Candidate, Document, DocumentInfo, Page, PageVectors
from evidentia.retriever.base import (BackendError, MissingVectorsError, SearchBackend, UnknownDocumentError,
                                      VectorModelError, NEUTRAL_FIELD, document_meta, info_from_meta, lang_field,
                                      search_fields, stored_windows, vectors_meta)
from evidentia.retriever.snippet import make_snippet
from evidentia.text import LANGUAGES

log = logging.getLogger(__name__)

MAPPING_RESOURCE = "pages.json"
# Must equal mappings._meta.evidentia_schema_version in es_mappings/pages.json;
# an index of another version is refused instead of being silently misread.
# 3: pages store how their text was obtained (text_source, ocr_confidence);
# 4: pages keep their window vectors readable (window_vectors), for the classifier
SCHEMA_VERSION = 4
_PAGE_SOURCE = ["doc_id", "page", "text", "language"]
# A page's every stored field but its vectors (read only by ``page_vectors``).
_PAGE_FIELDS = ["doc_id", "page", "char_count", "raw_text", "text", "text_source", "ocr_confidence", "language"]
VECTORS_FIELD = "window_vectors"
VECTOR_FIELD = "windows.vector"
# kNN candidates per shard: HNSW explores this many before keeping the best top_k
# (capped by Elasticsearch at 10000); with the filter to a few documents Lucene
# often switches to an exact scan anyway.
MIN_NUM_CANDIDATES = 500
_MAX_SWITCH_ATTEMPTS = 10


def load_mapping() -> dict:
    """The index definition (settings + mappings) shipped in ``evidentia.es_mappings``."""
    text = resources.files("evidentia.es_mappings").joinpath(MAPPING_RESOURCE).read_text(encoding="utf-8")
    return json.loads(text)


def new_generation() -> str:
    """A unique generation value that sorts by creation time (as a keyword string)."""
    return f"{time.time_ns():020d}-{uuid.uuid4().hex[:12]}"


def record_id(doc_id: str) -> str:
    return f"{doc_id}:doc"


def page_id(doc_id: str, generation: str, page: int) -> str:
    return f"{doc_id}:{generation}:{page}"


def page_windows(document: Document) -> dict[int, np.ndarray]:
    """page number -> its window vectors, (windows, dim) (none without vectors)."""
    v = document.vectors
    if v is None or v.rows == 0:
        return {}
    pages = np.asarray(v.pages)
    vectors = np.asarray(v.vectors)
    return {int(n): vectors[pages == n] for n in np.unique(pages)}


def encode_windows(windows: np.ndarray) -> str:
    """Window vectors as stored in ``window_vectors``: float16 bytes (what the
    embedded index stores too, so both give the classifier the same numbers), base64."""
    return base64.b64encode(np.ascontiguousarray(windows, dtype="<f2").tobytes()).decode("ascii")


def decode_windows(encoded: str, dim: int) -> np.ndarray:
    return np.frombuffer(base64.b64decode(encoded), dtype="<f2").reshape(-1, dim)


def page_source(page: Page, generation: str, windows: np.ndarray | None = None) -> dict:
    src: dict = {
        "kind": "page",
        "doc_id": page.doc_id,
        "generation": generation,
        "page": page.page,
        "char_count": page.char_count,
        "raw_text": page.raw_text,
        "text": page.text,
        "text_source": page.text_source,
    }
    if page.ocr_confidence is not None:
        src["ocr_confidence"] = page.ocr_confidence
    if page.language:
        src["language"] = page.language
    src.update(search_fields(page))
    if windows is not None and len(windows):
        # the kNN field (indexed, kept out of _source) and a compact readable copy
        src["windows"] = [{"vector": w} for w in np.asarray(windows, dtype=np.float64).round(7).tolist()]
        src[VECTORS_FIELD] = encode_windows(windows)
    return src


def page_actions(index: str, document: Document, generation: str) -> list[dict]:
    """``helpers.bulk`` actions writing every page of ``document`` (with its window
    vectors, if any) under ``generation``."""
    windows = page_windows(document)
    return [
        {
            "_op_type": "index",
            "_index": index,
            "_id": page_id(document.doc_id, generation, page.page),
            "_source": page_source(page, generation, windows.get(page.page)),
        }
        for page in document.pages
    ]


def record_source(document: Document, generation: str) -> dict:
    return {
        "kind": "doc",
        "doc_id": document.doc_id,
        "generation": generation,
        "source": document.source,
        "meta": document_meta(document, vectors_meta(document)),
    }


def info_from_record(doc_id: str, source: Mapping) -> DocumentInfo:
    return info_from_meta(doc_id, source.get("meta") or {})


def page_from_source(source: Mapping) -> Page:
    return Page(
        doc_id=source["doc_id"],
        page=source["page"],
        raw_text=source.get("raw_text", ""),
        text=source.get("text", ""),
        language=source.get("language") or None,
        char_count=source.get("char_count", 0),
        text_source=source.get("text_source", ""),
        ocr_confidence=source.get("ocr_confidence"),
    )


def search_request(keywords: Sequence[str], generations: Mapping[str, str], top_k: int,
                   neutral_boost: float = 1.0, language_boost: float = 1.0) -> dict:
    """Keyword arguments for ``Elasticsearch.search``: the pages of the current
    generation of the given documents, scored by BM25 on the neutral field plus
    the language fields (keywords OR-ed, no phrases), best first."""
    terms = " ".join(keywords)
    return {
        "query": {
            "bool": {
                "filter": [
                    {"term": {"kind": "page"}},
                    {"terms": {"doc_id": sorted(generations)}},
                    # A generation value belongs to one doc_id only, so this picks
                    # exactly the live pages of each requested document.
                    {"terms": {"generation": sorted(set(generations.values()))}},
                ],
                "should": [
                    {"match": {NEUTRAL_FIELD: {"query": terms, "operator": "or", "boost": neutral_boost}}},
                    {
                        "multi_match": {
                            "query": terms,
                            "fields": [lang_field(lang) for lang in LANGUAGES],
                            # Only one language field of a page has text, so the
                            # sum equals that field's score (as in tantivy).
                            "type": "most_fields",
                            "operator": "or",
                            "boost": language_boost,
                        }
                    },
                ],
                "minimum_should_match": 1,
            }
        },
        "size": top_k,
        # Ties broken the same way as the result list is sorted, also at the top_k cut.
        "sort": [{"_score": {"order": "desc"}}, {"doc_id": {"order": "asc"}}, {"page": {"order": "asc"}}],
        "track_total_hits": False,
        "source": _PAGE_SOURCE,
    }


def knn_request(query_vector, generations: Mapping[str, str], top_k: int,
                num_candidates: int = MIN_NUM_CANDIDATES) -> dict:
    """Keyword arguments for ``Elasticsearch.search``: nested kNN over the window
    vectors of the live pages of the given documents; each page is scored by its
    nearest window (Elasticsearch's cosine score is (1 + cosine) / 2)."""
    vector = np.asarray(query_vector, dtype=np.float64).reshape(-1).tolist()
    return {
        "knn": {
            "field": VECTOR_FIELD,
            "query_vector": vector,
            "k": top_k,
            "num_candidates": min(10_000, max(num_candidates, top_k)),
            "filter": {"bool": {"filter": [
                {"term": {"kind": "page"}},
                {"terms": {"doc_id": sorted(generations)}},
                {"terms": {"generation": sorted(set(generations.values()))}},
            ]}},
        },
        "size": top_k,
        "track_total_hits": False,
        "source": _PAGE_SOURCE,
    }


def _safe_url(url: str) -> str:
    """``url`` without user name or password, for error messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.username or parts.password:
        netloc = parts.hostname or ""
        if parts.port:
            netloc += f":{parts.port}"
        return urlunsplit(parts._replace(netloc=netloc))
    return url


class ElasticsearchBackend(SearchBackend):
    def __init__(self, url: str, index: str = "evidentia-pages", api_key: str | None = None,
                 client: Elasticsearch | None = None, refresh: bool = True,
                 neutral_boost: float = 1.0, language_boost: float = 1.0,
                 request_timeout: float = 60.0) -> None:
        self.url = _safe_url(url)
        self.index = index
        self.refresh = refresh
        self.neutral_boost = neutral_boost
        self.language_boost = language_boost
        if client is None:
            try:
                client = Elasticsearch(url, api_key=api_key, request_timeout=request_timeout)
            except ValueError as exc:  # malformed URL
                raise BackendError(f"EVIDENTIA_ES_URL {self.url!r} is not usable: {exc}") from None
        self._client = client
        self._dims: int | None = None
        self._ensure_index()

    # -- errors --------------------------------------------------------------
    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """Turn client exceptions into ``BackendError`` with a hint on what to check."""
        try:
            yield
        except (BackendError, UnknownDocumentError):
            raise
        except (AuthenticationException, AuthorizationException) as exc:
            raise BackendError(
                f"Elasticsearch at {self.url} refused to {action} (HTTP {exc.status_code}): "
                f"check EVIDENTIA_ES_API_KEY and its privileges on index {self.index!r}"
            ) from exc
        except helpers.BulkIndexError as exc:
            first = exc.errors[0] if exc.errors else {}
            raise BackendError(
                f"Elasticsearch at {self.url} rejected {len(exc.errors)} page(s) while trying to {action}; "
                f"first error: {first}"
            ) from exc
        except ApiError as exc:
            raise BackendError(
                f"Elasticsearch at {self.url} failed to {action} (index {self.index!r}): {exc}"
            ) from exc
        except TransportError as exc:  # connection refused, timeout, TLS, ...
            raise BackendError(
                f"cannot reach Elasticsearch at {self.url} to {action}: {exc}. Check that the server is "
                f"running (e.g. `docker compose up -d elasticsearch`) and that EVIDENTIA_ES_URL points at it"
            ) from exc

    # -- index setup ---------------------------------------------------------
    def _ensure_index(self) -> None:
        with self._errors(f"open index {self.index!r}"):
            if not self._client.indices.exists(index=self.index):
                mapping = load_mapping()
                try:
                    self._client.indices.create(index=self.index, settings=mapping["settings"],
                                                mappings=mapping["mappings"])
                except ApiError as exc:
                    # another process created it between exists() and create()
                    if exc.error != "resource_already_exists_exception":
                        raise
            resp = self._client.indices.get_mapping(index=self.index)
        mappings = next(iter(dict(resp).values()), {}).get("mappings", {})
        found = (mappings.get("_meta") or {}).get("evidentia_schema_version")
        if found != SCHEMA_VERSION:
            raise BackendError(
                f"index {self.index!r} at {self.url} has Evidentia schema version {found}, this Evidentia "
                f"needs {SCHEMA_VERSION}: delete the index (or set EVIDENTIA_ES_INDEX to a new name) "
                f"and index the PDFs again"
            )

    # -- writing -------------------------------------------------------------
    def _vector_dims(self) -> int | None:
        """Dimensions of the index's vectors (set by the first vector ever written), or None."""
        if self._dims is None:
            resp = self._client.indices.get_mapping(index=self.index)
            mappings = next(iter(dict(resp).values()), {}).get("mappings", {})
            field = mappings.get("properties", {}).get("windows", {}).get("properties", {}).get("vector", {})
            self._dims = field.get("dims")
        return self._dims

    def index_document(self, document: Document) -> None:
        doc_id = document.doc_id
        if document.vectors is not None and document.vectors.rows:
            with self._errors(f"index document {doc_id!r}"):
                dims = self._vector_dims()
            if dims is not None and dims != document.vectors.dim:
                raise BackendError(
                    f"index {self.index!r} at {self.url} holds {dims}-dim page vectors, but model "
                    f"{document.vectors.model!r} gives {document.vectors.dim}: use a new index for the new model "
                    f"(EVIDENTIA_ES_INDEX), or set EVIDENTIA_DENSE_MODEL back")
        generation = new_generation()
        switching = False
        try:
            with self._errors(f"index document {doc_id!r}"):
                helpers.bulk(self._client, page_actions(self.index, document, generation),
                             chunk_size=500, max_retries=2, refresh=False)
                # the new pages become searchable, though nothing points at them yet
                self._client.indices.refresh(index=self.index)
                switching = True
                switched = self._switch(document, generation)
        except BaseException:
            # Writing failed part way: drop what was written of the new generation.
            # The old version (if any) is untouched and still live. A failed switch
            # may still have reached the server, so then the record is checked first.
            if not switching or self._points_to(doc_id, generation) is False:
                self._discard(doc_id, generation)
            raise
        if switched:
            self._drop_older(doc_id, generation)
        else:
            # A newer version of this document went live while ours was written.
            self._discard(doc_id, generation)

    def _switch(self, document: Document, generation: str) -> bool:
        """Point the document record at ``generation``; False when the record
        already names a newer one."""
        rid = record_id(document.doc_id)
        source = record_source(document, generation)
        for _ in range(_MAX_SWITCH_ATTEMPTS):
            current = self._client.options(ignore_status=404).get(
                index=self.index, id=rid, source_includes=["generation"])
            if current.get("found"):
                if current["_source"].get("generation", "") > generation:
                    return False
                guard = {"if_seq_no": current["_seq_no"], "if_primary_term": current["_primary_term"]}
            else:
                guard = {"op_type": "create"}
            try:
                self._client.index(index=self.index, id=rid, document=source,
                                   refresh="wait_for" if self.refresh else False, **guard)
                return True
            except ConflictError:
                continue  # another writer switched the record meanwhile: look again
        raise BackendError(
            f"could not update the record of {document.doc_id!r} in index {self.index!r} at {self.url}: "
            f"it kept changing under concurrent writers; index the document again"
        )

    def _points_to(self, doc_id: str, generation: str) -> bool | None:
        """Whether the record names ``generation`` (the switch may have happened even
        when its response was lost); None when that cannot be found out, in which
        case the pages are kept: an unreferenced generation is never read."""
        try:
            current = self._client.options(ignore_status=404).get(
                index=self.index, id=record_id(doc_id), source_includes=["generation"])
            return bool(current.get("found")) and current["_source"].get("generation") == generation
        except Exception:
            return None

    def _discard(self, doc_id: str, generation: str) -> None:
        """Best-effort removal of the pages of one generation; never raises."""
        try:
            self._client.indices.refresh(index=self.index)  # delete_by_query only sees refreshed pages
            self._client.delete_by_query(
                index=self.index, conflicts="proceed", refresh=True,
                query={"bool": {"filter": [{"term": {"doc_id": doc_id}}, {"term": {"generation": generation}}]}},
            )
        except Exception as exc:  # the original error matters more
            log.warning("could not remove the unfinished pages of %r (generation %s) from %s: %s; "
                        "they are never searched and go away when the document is indexed again",
                        doc_id, generation, self.url, exc)

    def _drop_older(self, doc_id: str, generation: str) -> None:
        """Delete the pages of generations older than ``generation``. The new version
        is already live, so a failure here only leaves invisible pages behind."""
        try:
            self._client.delete_by_query(
                index=self.index, conflicts="proceed", refresh=self.refresh,
                query={"bool": {"filter": [
                    {"term": {"doc_id": doc_id}},
                    {"term": {"kind": "page"}},
                    {"range": {"generation": {"lt": generation}}},
                ]}},
            )
        except Exception as exc:
            log.warning("document %r was replaced but the pages of its old version could not be removed "
                        "from %s: %s; they are never searched and go away when it is indexed again",
                        doc_id, self.url, exc)

    def delete_document(self, doc_id: str) -> bool:
        with self._errors(f"delete document {doc_id!r}"):
            resp = self._client.options(ignore_status=404).delete(
                index=self.index, id=record_id(doc_id), refresh="wait_for" if self.refresh else False)
            if resp.get("result") != "deleted":
                return False
            # The document is gone for readers; now remove its pages (all generations).
            self._client.indices.refresh(index=self.index)
            self._client.delete_by_query(index=self.index, conflicts="proceed", refresh=self.refresh,
                                         query={"term": {"doc_id": doc_id}})
        return True

    # -- reading -------------------------------------------------------------
    def _generations(self, doc_ids: Sequence[str]) -> dict[str, str]:
        """doc_id -> live generation, for the ids that have a record (real-time get)."""
        if not doc_ids:
            return {}
        resp = self._client.mget(index=self.index, ids=[record_id(d) for d in doc_ids],
                                 source_includes=["generation"])
        out = {}
        for doc_id, hit in zip(doc_ids, resp["docs"]):
            if hit.get("found"):
                out[doc_id] = hit["_source"]["generation"]
        return out

    def _records(self, doc_ids: Sequence[str]) -> dict[str, dict]:
        """doc_id -> {"generation", "vectors"} of the ids that have a record."""
        if not doc_ids:
            return {}
        resp = self._client.mget(index=self.index, ids=[record_id(d) for d in doc_ids],
                                 source_includes=["generation", "meta.vectors"])
        out = {}
        for doc_id, hit in zip(doc_ids, resp["docs"]):
            if hit.get("found"):
                src = hit["_source"]
                out[doc_id] = {"generation": src["generation"], "vectors": (src.get("meta") or {}).get("vectors")}
        return out

    def vector_models(self, doc_ids: Sequence[str]) -> dict[str, str | None]:
        with self._errors("read documents"):
            records = self._records(list(dict.fromkeys(doc_ids)))
        return {d: (r["vectors"] or {}).get("model") for d, r in records.items()}

    def search_dense(self, query_vector, doc_ids: Sequence[str], top_k: int,
                     model: str | None = None) -> list[Candidate]:
        doc_ids = list(dict.fromkeys(doc_ids))
        with self._errors("search"):
            records = self._records(doc_ids)
            missing = [d for d in doc_ids if d not in records]
            if missing:
                raise UnknownDocumentError(missing)
            if not doc_ids or top_k <= 0:
                return []
            without = [d for d in doc_ids if not records[d]["vectors"]]
            if without:
                raise MissingVectorsError(without)
            if model is not None:
                wrong = [d for d in doc_ids if records[d]["vectors"]["model"] != model]
                if wrong:
                    raise VectorModelError(wrong, records[wrong[0]]["vectors"]["model"], model)
            if not any(records[d]["vectors"].get("rows") for d in doc_ids):
                return []  # only empty pages: nothing has a vector
            generations = {d: r["generation"] for d, r in records.items()}
            resp = self._client.search(index=self.index, **knn_request(query_vector, generations, top_k))
        results = []
        for hit in resp["hits"]["hits"]:
            src = hit["_source"]
            results.append(Candidate(
                doc_id=src["doc_id"], page=src["page"], score=2.0 * float(hit["_score"]) - 1.0,
                text=src.get("text", ""), language=src.get("language") or None, snippet="",
            ))
        results.sort(key=lambda c: (-c.score, c.doc_id, c.page))
        return results

    def list_documents(self) -> list[DocumentInfo]:
        with self._errors("list documents"):
            hits = list(helpers.scan(
                self._client, index=self.index, size=1000,
                query={"query": {"term": {"kind": "doc"}}, "_source": ["doc_id", "meta"]},
            ))
        infos = [info_from_record(h["_source"]["doc_id"], h["_source"]) for h in hits]
        return sorted(infos, key=lambda d: d.doc_id)

    def get_document(self, doc_id: str) -> DocumentInfo | None:
        with self._errors(f"read document {doc_id!r}"):
            resp = self._client.options(ignore_status=404).get(
                index=self.index, id=record_id(doc_id), source_includes=["doc_id", "meta"])
        if not resp.get("found"):
            return None
        return info_from_record(doc_id, resp["_source"])

    def get_page(self, doc_id: str, page: int) -> Page | None:
        with self._errors(f"read page {page} of {doc_id!r}"):
            generation = self._generations([doc_id]).get(doc_id)
            if generation is None:
                return None
            resp = self._client.search(
                index=self.index, size=1, track_total_hits=False, source=_PAGE_FIELDS,
                query={"bool": {"filter": [
                    {"term": {"kind": "page"}},
                    {"term": {"doc_id": doc_id}},
                    {"term": {"generation": generation}},
                    {"term": {"page": page}},
                ]}},
            )
        hits = resp["hits"]["hits"]
        return page_from_source(hits[0]["_source"]) if hits else None

    def _live_pages(self, doc_id: str, generation: str, fields: Sequence[str]) -> list[dict]:
        """The ``fields`` of every page of one generation of a document, in page
        order: one scroll instead of a request per page."""
        hits = helpers.scan(self._client, index=self.index, size=1000, query={
            "query": {"bool": {"filter": [
                {"term": {"kind": "page"}},
                {"term": {"doc_id": doc_id}},
                {"term": {"generation": generation}},
            ]}},
            "_source": list(fields),
        })
        return sorted((h["_source"] for h in hits), key=lambda src: src["page"])

    def stored_document(self, doc_id: str) -> Document | None:
        with self._errors(f"read document {doc_id!r}"):
            record = self._client.options(ignore_status=404).get(
                index=self.index, id=record_id(doc_id), source_includes=["doc_id", "meta", "generation"])
            if not record.get("found"):
                return None
            info = info_from_record(doc_id, record["_source"])
            sources = self._live_pages(doc_id, record["_source"]["generation"], _PAGE_FIELDS)
        if [src["page"] for src in sources] != list(range(1, info.pages + 1)):
            return None  # replaced or deleted meanwhile
        return Document(doc_id=doc_id, pages=tuple(page_from_source(src) for src in sources), source=info.source)

    def page_vectors(self, doc_id: str) -> PageVectors | None:
        """The document's window vectors (float16, as stored), None without any
        (indexed with EVIDENTIA_DENSE=off) or when it is being replaced."""
        with self._errors(f"read the vectors of {doc_id!r}"):
            record = self._records([doc_id]).get(doc_id)
            if record is None or not record["vectors"]:
                return None
            sources = self._live_pages(doc_id, record["generation"], ["page", VECTORS_FIELD])
        dim = int(record["vectors"]["dim"])
        pages, blocks = [], []
        for src in sources:
            if src.get(VECTORS_FIELD):
                block = decode_windows(src[VECTORS_FIELD], dim)
                pages += [src["page"]] * len(block)
                blocks.append(block)
        if len(pages) != record["vectors"].get("rows", len(pages)):
            return None  # replaced meanwhile
        vectors = np.vstack(blocks) if blocks else np.zeros((0, dim), dtype=np.float16)
        return PageVectors(model=record["vectors"]["model"], pages=np.asarray(pages, dtype=np.int32), vectors=vectors,
                           windows=stored_windows(record["vectors"]))

    def search(self, keywords: Sequence[str], doc_ids: Sequence[str], top_k: int) -> list[Candidate]:
        doc_ids = list(dict.fromkeys(doc_ids))
        with self._errors("search"):
            generations = self._generations(doc_ids)
            missing = [d for d in doc_ids if d not in generations]
            if missing:
                raise UnknownDocumentError(missing)
            if not keywords or not doc_ids or top_k <= 0:
                return []
            resp = self._client.search(
                index=self.index,
                **search_request(keywords, generations, top_k, self.neutral_boost, self.language_boost),
            )
        results = []
        for hit in resp["hits"]["hits"]:
            src = hit["_source"]
            text = src.get("text", "")
            results.append(Candidate(
                doc_id=src["doc_id"], page=src["page"], score=float(hit["_score"]), text=text,
                language=src.get("language") or None,
                snippet=make_snippet(text, keywords, language=src.get("language") or None),
            ))
        results.sort(key=lambda c: (-c.score, c.doc_id, c.page))
        return results

    def close(self) -> None:
        self._client.close()
