"""The embedded default: a tantivy BM25 index on local disk, no server needed.

Each page's normalised text is indexed twice: in a language-neutral field
(lower-cased tokens) and in the field of its detected language, which that
language's Snowball stemmer analyses. A query is matched against both, so an
English question finds "émissions" through the neutral field and "emission"
/"emissions" through the stemmed one.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Iterable, Sequence

import tantivy
from tantivy import Filter, Occur, Query, TextAnalyzerBuilder, Tokenizer

from evidentia.records import Candidate, Document, DocumentInfo, Page
from evidentia.retriever.base import BackendError, SearchBackend, UnknownDocumentError
from evidentia.retriever.snippet import make_snippet
from evidentia.text import LANGUAGES, search_text

# Rust-regex twin of evidentia.text.TOKEN_RE.
TOKEN_PATTERN = r"\p{N}+(?:\.\p{N}+)?|[\p{L}\p{N}]+"
NEUTRAL_FIELD = "body"
# Bumped whenever the schema or the analysis changes; an index of another
# version is refused with a message instead of being silently misread.
SCHEMA_VERSION = 2


def _lang_field(lang: str) -> str:
    return f"body_{lang}"


def _build_schema() -> tantivy.Schema:
    sb = tantivy.SchemaBuilder()
    sb.add_text_field("kind", stored=True, tokenizer_name="raw")  # "page" or "doc"
    sb.add_text_field("doc_id", stored=True, tokenizer_name="raw", fast=True)
    sb.add_integer_field("page", stored=True, indexed=True, fast=True)
    sb.add_text_field("language", stored=True, tokenizer_name="raw")
    sb.add_integer_field("char_count", stored=True)
    sb.add_bytes_field("raw_text", stored=True)
    sb.add_bytes_field("text", stored=True)
    sb.add_bytes_field("meta", stored=True)  # document records: JSON summary
    sb.add_text_field(NEUTRAL_FIELD, stored=False, tokenizer_name="ev_neutral")
    for lang in LANGUAGES:
        sb.add_text_field(_lang_field(lang), stored=False, tokenizer_name=f"ev_{lang}")
    return sb.build()


def _register_analyzers(index: tantivy.Index) -> None:
    index.register_tokenizer(
        "ev_neutral",
        TextAnalyzerBuilder(Tokenizer.regex(TOKEN_PATTERN)).filter(Filter.remove_long(60)).filter(Filter.lowercase()).build(),
    )
    for lang, name in LANGUAGES.items():
        index.register_tokenizer(
            f"ev_{lang}",
            TextAnalyzerBuilder(Tokenizer.regex(TOKEN_PATTERN))
            .filter(Filter.remove_long(60))
            .filter(Filter.lowercase())
            .filter(Filter.stemmer(name))
            .build(),
        )


class TantivyBackend(SearchBackend):
    def __init__(self, directory: Path, neutral_boost: float = 1.0, language_boost: float = 1.0,
                 writer_heap_bytes: int = 64_000_000, lock_timeout_s: float = 30.0) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
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
        per batch instead of per document saves the fsyncs (about 0.1 s each)."""
        with self._write_lock:
            writer = self._writer()
            try:
                pending = 0
                for document in documents:
                    self._add(writer, document)
                    pending += document.page_count
                    if pending >= commit_every_pages:
                        writer.commit()
                        pending = 0
                writer.commit()
            except BaseException:
                writer.rollback()
                raise
            finally:
                writer.wait_merging_threads()
        self._index.reload()

    def _add(self, writer: tantivy.IndexWriter, document: Document) -> None:
        docs = [self._page_doc(p) for p in document.pages]
        meta = {
            "pages": document.page_count,
            "empty_pages": document.empty_pages,
            "languages": document.languages,
            "source": document.source,
        }
        writer.delete_documents_by_term("doc_id", document.doc_id)
        writer.add_document(tantivy.Document(kind="doc", doc_id=document.doc_id, meta=json.dumps(meta).encode()))
        for doc in docs:
            writer.add_document(doc)

    def _page_doc(self, page: Page) -> tantivy.Document:
        fields: dict = dict(
            kind="page",
            doc_id=page.doc_id,
            page=page.page,
            char_count=page.char_count,
            raw_text=page.raw_text.encode("utf-8", "replace"),
            text=page.text.encode("utf-8", "replace"),
        )
        if page.language:
            fields["language"] = page.language
        if page.text:
            normalised = search_text(page.text)
            fields[NEUTRAL_FIELD] = normalised
            if page.language in LANGUAGES:
                fields[_lang_field(page.language)] = normalised
        return tantivy.Document(**fields)

    def delete_document(self, doc_id: str) -> bool:
        if self._doc_record(doc_id) is None:
            return False
        with self._write_lock:
            writer = self._writer()
            try:
                writer.delete_documents_by_term("doc_id", doc_id)
                writer.commit()
            finally:
                writer.wait_merging_threads()
        self._index.reload()
        return True

    # -- reading -------------------------------------------------------------
    def _searcher(self) -> tantivy.Searcher:
        self._index.reload()
        return self._index.searcher()

    def _doc_records(self, doc_ids: Sequence[str] | None = None) -> list[tuple[str, dict]]:
        searcher = self._searcher()
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
        return [
            DocumentInfo(doc_id=d, pages=m["pages"], empty_pages=m["empty_pages"],
                         languages=m.get("languages", {}), source=m.get("source", ""))
            for d, m in self._doc_records()
        ]

    def get_document(self, doc_id: str) -> DocumentInfo | None:
        m = self._doc_record(doc_id)
        if m is None:
            return None
        return DocumentInfo(doc_id=doc_id, pages=m["pages"], empty_pages=m["empty_pages"],
                            languages=m.get("languages", {}), source=m.get("source", ""))

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
        )

    def search(self, keywords: Sequence[str], doc_ids: Sequence[str], top_k: int) -> list[Candidate]:
        doc_ids = list(dict.fromkeys(doc_ids))
        known = {d for d, _ in self._doc_records(doc_ids)}
        missing = [d for d in doc_ids if d not in known]
        if missing:
            raise UnknownDocumentError(missing)
        if not keywords or not doc_ids or top_k <= 0:
            return []
        terms = " ".join(keywords)
        text_query = Query.boolean_query([
            (Occur.Should, Query.boost_query(self._index.parse_query(terms, [NEUTRAL_FIELD]), self.neutral_boost)),
            (Occur.Should, Query.boost_query(
                self._index.parse_query(terms, [_lang_field(lang) for lang in LANGUAGES]), self.language_boost)),
        ])
        query = Query.boolean_query([
            (Occur.Must, Query.term_query(self._schema, "kind", "page")),
            (Occur.Must, Query.term_set_query(self._schema, "doc_id", doc_ids)),
            (Occur.Must, text_query),
        ])
        searcher = self._searcher()
        results = []
        for score, address in searcher.search(query, top_k, count=False).hits:
            page = self._to_page(searcher.doc(address))
            results.append(Candidate(
                doc_id=page.doc_id, page=page.page, score=float(score), text=page.text,
                language=page.language, snippet=make_snippet(page.text, keywords),
            ))
        # tantivy breaks score ties by segment order; make ties reproducible
        results.sort(key=lambda c: (-c.score, c.doc_id, c.page))
        return results
