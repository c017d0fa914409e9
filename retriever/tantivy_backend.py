"""The embedded default: a tantivy BM25 index on local disk, no server needed.

Each page's normalised text is indexed twice: in a language-neutral field
(lower-cased tokens) and in the field of its detected language, which that
language's Snowball stemmer analyses. A query is matched against both, so an
English question finds "émissions" through the neutral field and "emission"
/"emissions" through the stemmed one.

Page vectors (dense retrieval) live next to the index, one sidecar file per
document under ``vectors/``: ``<key>-<generation>.npz`` with the window vectors
(float16, normalised) and the page number of each row. A file is written
completely under a temporary name and renamed before the commit that makes the
document's new record name it, so readers see the old pages with the old file
or the new pages with the new one, never a mix; files no record names (older
generations, a run that failed) are removed after the commit. Dense search is
exact: a cosine over every window of the requested documents with numpy.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import tantivy
from tantivy import Filter, Occur, Query, TextAnalyzerBuilder, Tokenizer

from evidentia.records import Candidate, Document, DocumentInfo, Page, PageVectors
from evidentia.retriever.base import (BackendError, MissingVectorsError, SearchBackend, UnknownDocumentError,
                                      VectorModelError, NEUTRAL_FIELD, document_meta, info_from_meta, lang_field,
                                      search_fields, stored_windows, vectors_meta)
from evidentia.retriever.snippet import make_snippet
from evidentia.text import LANGUAGES

# Rust-regex twin of evidentia.text.TOKEN_RE.
TOKEN_PATTERN = r"\p{N}+(?:\.\p{N}+)?|[\p{L}\p{N}]+"
# Bumped whenever the schema or the analysis changes; an index of another
# version is refused with a message instead of being silently misread.
SCHEMA_VERSION = 3  # 3: pages store how their text was obtained (text_source, ocr_confidence)


VECTORS_DIR = "vectors"
# Rows of page vectors kept in memory between searches (float16: ~0.75 kB a row at 384 dims).
VECTOR_CACHE_ROWS = 200_000


def vector_file_key(doc_id: str) -> str:
    """File-name prefix of a document's vector files: any doc id is safe on disk."""
    return hashlib.sha1(doc_id.encode("utf-8")).hexdigest()[:24]


def check_vectors(document: Document) -> None:
    """Refuse vectors that do not fit the document's pages (a programming error)."""
    v = document.vectors
    pages = np.asarray(v.pages)
    vectors = np.asarray(v.vectors)
    if vectors.ndim != 2 or len(pages) != vectors.shape[0]:
        raise ValueError(f"{document.doc_id}: {len(pages)} page numbers for vectors of shape {vectors.shape}")
    if len(pages) and (np.any(np.diff(pages) < 0) or not set(pages.tolist()) <= {p.page for p in document.pages}):
        raise ValueError(f"{document.doc_id}: vector rows must be grouped by page, in page order, for its pages")


def _build_schema() -> tantivy.Schema:
    sb = tantivy.SchemaBuilder()
    sb.add_text_field("kind", stored=True, tokenizer_name="raw")  # "page" or "doc"
    sb.add_text_field("doc_id", stored=True, tokenizer_name="raw", fast=True)
    sb.add_integer_field("page", stored=True, indexed=True, fast=True)
    sb.add_text_field("language", stored=True, tokenizer_name="raw")
    sb.add_integer_field("char_count", stored=True)
    sb.add_text_field("text_source", stored=True, tokenizer_name="raw")  # text, ocr, unread, none
    sb.add_float_field("ocr_confidence", stored=True)  # OCR'd pages only
    sb.add_bytes_field("raw_text", stored=True)
    sb.add_bytes_field("text", stored=True)
    sb.add_bytes_field("meta", stored=True)  # document records: JSON summary
    sb.add_text_field(NEUTRAL_FIELD, stored=False, tokenizer_name="ev_neutral")
    for lang in LANGUAGES:
        sb.add_text_field(lang_field(lang), stored=False, tokenizer_name=f"ev_{lang}")
    return sb.build()


# tantivy drops tokens of this many UTF-8 bytes or more, in pages and in queries alike
MAX_TOKEN_BYTES = 60


def _register_analyzers(index: tantivy.Index) -> None:
    index.register_tokenizer(
        "ev_neutral",
        TextAnalyzerBuilder(Tokenizer.regex(TOKEN_PATTERN)).filter(Filter.remove_long(MAX_TOKEN_BYTES)).filter(Filter.lowercase()).build(),
    )
    for lang, name in LANGUAGES.items():
        index.register_tokenizer(
            f"ev_{lang}",
            TextAnalyzerBuilder(Tokenizer.regex(TOKEN_PATTERN))
            .filter(Filter.remove_long(MAX_TOKEN_BYTES))
            .filter(Filter.lowercase())
            .filter(Filter.stemmer(name))
            .build(),
        )


class TantivyBackend(SearchBackend):
    def __init__(self, directory: Path, neutral_boost: float = 1.0, language_boost: float = 1.0,
                 writer_heap_bytes: int = 64_000_000, lock_timeout_s: float = 30.0,
                 dense_pooling: str = "max") -> None:
        self.directory = Path(directory)
        self.dense_pooling = dense_pooling  # how window scores make a page score: see retriever.dense.page_scores
        self._vector_cache: OrderedDict[str, PageVectors] = OrderedDict()  # file name -> vectors (files never change)
        self._cached_rows = 0
        self._cache_lock = threading.Lock()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BackendError(f"cannot create the index folder {self.directory}: {exc.strerror or exc}; "
                               "set EVIDENTIA_DATA_DIR to a folder you can write") from None
        self.neutral_boost = neutral_boost
        self.language_boost = language_boost
        self.writer_heap_bytes = writer_heap_bytes
        self.lock_timeout_s = lock_timeout_s
        self._check_version()
        self._schema = _build_schema()
        try:
            self._index = tantivy.Index(self._schema, path=str(self.directory), reuse=True)
        except ValueError as exc:
            raise BackendError(f"cannot open the index in {self.directory}: {exc}") from None
        _register_analyzers(self._index)
        # tantivy allows one writer per index; serialise writers of this process,
        # and wait (bounded) for another process's writer to finish.
        self._write_lock = threading.Lock()

    def _check_version(self) -> None:
        marker = self.directory / "evidentia-schema.json"
        if marker.exists():
            found = json.loads(marker.read_text()).get("version")
            if found != SCHEMA_VERSION:
                raise BackendError(
                    f"the index in {self.directory} has schema version {found}, this Evidentia needs "
                    f"{SCHEMA_VERSION}: delete the directory and index the PDFs again"
                )
        else:
            marker.write_text(json.dumps({"version": SCHEMA_VERSION}))

    # -- writing -------------------------------------------------------------
    def _writer(self) -> tantivy.IndexWriter:
        deadline = time.monotonic() + self.lock_timeout_s
        while True:
            try:
                return self._index.writer(heap_size=self.writer_heap_bytes, num_threads=1)
            except ValueError as exc:
                if "lock" not in str(exc).lower() or time.monotonic() > deadline:
                    raise BackendError(f"cannot write to the index in {self.directory}: {exc}") from None
                time.sleep(0.2)

    def index_document(self, document: Document) -> None:
        self.index_documents([document])

    def index_documents(self, documents: Iterable[Document], commit_every_pages: int = 20_000) -> None:
        """One writer for the lot; a document's deletion and pages always go into the
        same commit, so each document appears whole or not at all. Committing once
        per batch instead of per document saves the fsyncs (about 0.1 s each).
        Vector files are written (while the writer lock is held) before the commit
        that names them; on failure the files of the uncommitted documents go."""
        with self._write_lock:
            writer = self._writer()
            uncommitted: list[str] = []  # vector files written since the last commit
            live: dict[str, str | None] = {}  # doc id -> its vector file in the pending commit
            try:
                pending = 0
                for document in documents:
                    vector_meta = self._write_vectors(document)
                    if vector_meta:
                        uncommitted.append(vector_meta["file"])
                    self._add(writer, document, vector_meta)
                    live[document.doc_id] = vector_meta["file"] if vector_meta else None
                    pending += document.page_count
                    if pending >= commit_every_pages:
                        writer.commit()
                        uncommitted = []
                        self._drop_stale_vectors(live)
                        live = {}
                        pending = 0
                writer.commit()
                uncommitted = []
                self._drop_stale_vectors(live)
            except BaseException:
                writer.rollback()
                for name in uncommitted:
                    self._remove_vector_file(name)
                raise
            finally:
                writer.wait_merging_threads()
        self._index.reload()

    def _add(self, writer: tantivy.IndexWriter, document: Document, vector_meta: dict | None = None) -> None:
        meta = document_meta(document, vector_meta)
        writer.delete_documents_by_term("doc_id", document.doc_id)
        writer.add_document(tantivy.Document(kind="doc", doc_id=document.doc_id, meta=json.dumps(meta).encode()))
        # one page's fields at a time: building them all first held every page's text twice
        # more (77 MB for 2,000 pages of 9,800 characters); a page that fails still rolls
        # back the whole commit (index_documents)
        for page in document.pages:
            writer.add_document(self._page_doc(page))

    # -- vector files ----------------------------------------------------------
    @property
    def vectors_dir(self) -> Path:
        return self.directory / VECTORS_DIR

    def _write_vectors(self, document: Document) -> dict | None:
        """Write the document's vectors to a new file (temp name, fsync, rename);
        the meta that its record will carry, or None without vectors."""
        v = document.vectors
        if v is None:
            return None
        check_vectors(document)
        self.vectors_dir.mkdir(parents=True, exist_ok=True)
        name = f"{vector_file_key(document.doc_id)}-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.npz"
        tmp = self.vectors_dir / f".{name}.tmp"
        try:
            with open(tmp, "wb") as fh:
                np.savez(fh, vectors=np.asarray(v.vectors, dtype=np.float16),
                         pages=np.asarray(v.pages, dtype=np.int32),
                         doc_id=np.array(document.doc_id), model=np.array(v.model))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.vectors_dir / name)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return {"file": name, **vectors_meta(document)}

    def _remove_vector_file(self, name: str) -> None:
        try:
            (self.vectors_dir / name).unlink(missing_ok=True)
        except OSError:
            pass  # never read again: no record names it

    def _drop_stale_vectors(self, live: dict[str, str | None]) -> None:
        """After a commit: remove every vector file of these documents but the live one."""
        if not self.vectors_dir.is_dir():
            return
        for doc_id, keep in live.items():
            for path in self.vectors_dir.glob(f"{vector_file_key(doc_id)}-*.npz"):
                if path.name != keep:
                    self._remove_vector_file(path.name)

    def _page_doc(self, page: Page) -> tantivy.Document:
        fields: dict = dict(
            kind="page",
            doc_id=page.doc_id,
            page=page.page,
            char_count=page.char_count,
            raw_text=page.raw_text.encode("utf-8", "replace"),
            text=page.text.encode("utf-8", "replace"),
            text_source=page.text_source,
        )
        if page.ocr_confidence is not None:
            fields["ocr_confidence"] = float(page.ocr_confidence)
        if page.language:
            fields["language"] = page.language
        fields.update(search_fields(page))
        return tantivy.Document(**fields)

    def delete_document(self, doc_id: str) -> bool:
        if self._doc_record(doc_id) is None:
            return False
        with self._write_lock:
            writer = self._writer()
            try:
                writer.delete_documents_by_term("doc_id", doc_id)
                writer.commit()
                self._drop_stale_vectors({doc_id: None})
            finally:
                writer.wait_merging_threads()
        self._index.reload()
        return True

    # -- reading -------------------------------------------------------------
    def _searcher(self) -> tantivy.Searcher:
        self._index.reload()
        return self._index.searcher()

    def _doc_records(self, doc_ids: Sequence[str] | None = None,
                     searcher: tantivy.Searcher | None = None) -> list[tuple[str, dict]]:
        searcher = searcher or self._searcher()
        query = Query.term_query(self._schema, "kind", "doc")
        if doc_ids is not None:
            query = Query.boolean_query(
                [(Occur.Must, query), (Occur.Must, Query.term_set_query(self._schema, "doc_id", list(doc_ids)))]
            )
        limit = max(1, searcher.num_docs)
        out = []
        for _, address in searcher.search(query, limit, count=False).hits:
            doc = searcher.doc(address)
            out.append((doc["doc_id"][0], json.loads(bytes(doc["meta"][0]))))
        return sorted(out)

    def _doc_record(self, doc_id: str) -> dict | None:
        found = self._doc_records([doc_id])
        return found[0][1] if found else None

    def list_documents(self) -> list[DocumentInfo]:
        return [info_from_meta(d, m) for d, m in self._doc_records()]

    def get_document(self, doc_id: str) -> DocumentInfo | None:
        m = self._doc_record(doc_id)
        return None if m is None else info_from_meta(doc_id, m)

    def get_page(self, doc_id: str, page: int) -> Page | None:
        searcher = self._searcher()
        query = Query.boolean_query([
            (Occur.Must, Query.term_query(self._schema, "doc_id", doc_id)),
            (Occur.Must, Query.term_query(self._schema, "page", page)),
            (Occur.Must, Query.term_query(self._schema, "kind", "page")),
        ])
        hits = searcher.search(query, 1, count=False).hits
        if not hits:
            return None
        return self._to_page(searcher.doc(hits[0][1]))

    @staticmethod
    def _to_page(doc: tantivy.Document) -> Page:
        language = doc["language"][0] if doc["language"] else None
        return Page(
            doc_id=doc["doc_id"][0],
            page=doc["page"][0],
            raw_text=bytes(doc["raw_text"][0]).decode("utf-8"),
            text=bytes(doc["text"][0]).decode("utf-8"),
            language=language,
            char_count=doc["char_count"][0],
            text_source=doc["text_source"][0] if doc["text_source"] else "",
            ocr_confidence=doc["ocr_confidence"][0] if doc["ocr_confidence"] else None,
        )

    def search(self, keywords: Sequence[str], doc_ids: Sequence[str], top_k: int) -> list[Candidate]:
        doc_ids = list(dict.fromkeys(doc_ids))
        # one searcher (one index snapshot) for the id check and the search
        searcher = self._searcher()
        known = {d for d, _ in self._doc_records(doc_ids, searcher)}
        missing = [d for d in doc_ids if d not in known]
        if missing:
            raise UnknownDocumentError(missing)
        # a word the analyser drops can match no page; and a query of only such words made the
        # query parser raise ("Only excluding terms given"): a 500 for two 60-digit numbers
        keywords = [k for k in keywords if len(k.encode("utf-8")) < MAX_TOKEN_BYTES]
        if not keywords or not doc_ids or top_k <= 0:
            return []
        terms = " ".join(keywords)
        text_query = Query.boolean_query([
            (Occur.Should, Query.boost_query(self._index.parse_query(terms, [NEUTRAL_FIELD]), self.neutral_boost)),
            (Occur.Should, Query.boost_query(
                self._index.parse_query(terms, [lang_field(lang) for lang in LANGUAGES]), self.language_boost)),
        ])
        query = Query.boolean_query([
            (Occur.Must, Query.term_query(self._schema, "kind", "page")),
            (Occur.Must, Query.term_set_query(self._schema, "doc_id", doc_ids)),
            (Occur.Must, text_query),
        ])
        results = []
        for score, address in searcher.search(query, top_k, count=False).hits:
            page = self._to_page(searcher.doc(address))
            results.append(Candidate(
                doc_id=page.doc_id, page=page.page, score=float(score), text=page.text,
                language=page.language, snippet=make_snippet(page.text, keywords, language=page.language),
            ))
        # tantivy breaks score ties by segment order; make ties reproducible
        results.sort(key=lambda c: (-c.score, c.doc_id, c.page))
        return results

    # -- dense search ----------------------------------------------------------
    def vector_models(self, doc_ids: Sequence[str]) -> dict[str, str | None]:
        return {d: (m.get("vectors") or {}).get("model") for d, m in self._doc_records(list(doc_ids))}

    def page_vectors(self, doc_id: str) -> PageVectors | None:
        """The stored vectors of a document (float16 as stored), None without any."""
        meta = self._doc_record(doc_id)
        if meta is None or not meta.get("vectors"):
            return None
        return self._load_vectors(doc_id, meta["vectors"])

    def _load_vectors(self, doc_id: str, vmeta: dict) -> PageVectors:
        name = vmeta["file"]
        with self._cache_lock:
            cached = self._vector_cache.get(name)
            if cached is not None:
                self._vector_cache.move_to_end(name)
                return cached
        path = self.vectors_dir / name
        try:
            with np.load(path, allow_pickle=False) as data:
                loaded = PageVectors(model=str(data["model"]), pages=data["pages"], vectors=data["vectors"],
                                     windows=stored_windows(vmeta))
        except FileNotFoundError:
            raise FileNotFoundError(name) from None
        except (OSError, ValueError, KeyError) as exc:
            raise BackendError(f"the vectors of {doc_id!r} in {path} cannot be read ({exc}): "
                               f"index the document again") from None
        with self._cache_lock:
            self._vector_cache[name] = loaded
            self._cached_rows += loaded.rows
            while self._cached_rows > VECTOR_CACHE_ROWS and len(self._vector_cache) > 1:
                _, old = self._vector_cache.popitem(last=False)
                self._cached_rows -= old.rows
        return loaded

    def search_dense(self, query_vector, doc_ids: Sequence[str], top_k: int,
                     model: str | None = None) -> list[Candidate]:
        from evidentia.retriever.dense import page_scores

        doc_ids = list(dict.fromkeys(doc_ids))
        for attempt in range(3):
            records = dict(self._doc_records(doc_ids))
            missing = [d for d in doc_ids if d not in records]
            if missing:
                raise UnknownDocumentError(missing)
            if not doc_ids or top_k <= 0:
                return []
            without = [d for d in doc_ids if not records[d].get("vectors")]
            if without:
                raise MissingVectorsError(without)
            if model is not None:
                for d in doc_ids:
                    if records[d]["vectors"]["model"] != model:
                        raise VectorModelError([x for x in doc_ids if records[x]["vectors"]["model"] != model],
                                               records[d]["vectors"]["model"], model)
            try:
                loaded = [(d, self._load_vectors(d, records[d]["vectors"])) for d in doc_ids]
                break
            except FileNotFoundError:
                # a writer replaced the document between reading its record and its file
                if attempt == 2:
                    raise BackendError("the page vectors kept changing during the search: try again") from None
        q = np.asarray(query_vector, dtype=np.float32).reshape(-1)
        scored: list[tuple[float, str, int]] = []
        for doc_id, vectors in loaded:
            if vectors.rows and vectors.dim != len(q):
                raise VectorModelError([doc_id], f"{vectors.model} ({vectors.dim} dims)", f"a {len(q)}-dim query")
            pages, scores = page_scores(q, vectors, self.dense_pooling)
            scored.extend((float(sc), doc_id, int(p)) for p, sc in zip(pages, scores))
        scored.sort(key=lambda t: (-t[0], t[1], t[2]))
        best = scored[:top_k]
        texts = self._pages_by_key([(d, p) for _, d, p in best])
        results = []
        for score, doc_id, page_no in best:
            page = texts.get((doc_id, page_no))
            if page is None:  # replaced since the record was read: leave it out
                continue
            results.append(Candidate(doc_id=doc_id, page=page_no, score=score, text=page.text,
                                     language=page.language, snippet=""))
        return results

    def _pages_by_key(self, keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], Page]:
        if not keys:
            return {}
        searcher = self._searcher()
        clauses = [
            (Occur.Should, Query.boolean_query([
                (Occur.Must, Query.term_query(self._schema, "doc_id", d)),
                (Occur.Must, Query.term_query(self._schema, "page", p)),
            ]))
            for d, p in keys
        ]
        query = Query.boolean_query([
            (Occur.Must, Query.term_query(self._schema, "kind", "page")),
            (Occur.Must, Query.boolean_query(clauses)),
        ])
        out = {}
        for _, address in searcher.search(query, len(keys), count=False).hits:
            page = self._to_page(searcher.doc(address))
            out[(page.doc_id, page.page)] = page
        return out
