"""The search-backend interface: every first-stage engine implements this."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Iterable, Mapping, Sequence

from evidentia.records import Candidate, Document, DocumentInfo, Page, PageVectors
from evidentia.text import LANGUAGES, listed, search_text


class BackendError(RuntimeError):
    """The search engine failed or is unreachable; the message says what to do."""


class UnknownDocumentError(KeyError):
    """A requested document id is not in the index."""

    def __init__(self, doc_ids: Sequence[str]):
        self.doc_ids = list(doc_ids)
        super().__init__(", ".join(self.doc_ids))

    def __str__(self) -> str:
        return f"unknown document id(s): {', '.join(self.doc_ids)}"


def embed_command_line(document_ids: Sequence[str], tenant: str | None = None) -> str:
    """The `evidentia embed` command line that adds page embeddings to these documents of ``tenant``."""
    tenant_flag = f"--tenant {tenant} " if tenant else ""
    return f"evidentia embed {tenant_flag}{' '.join('--doc ' + d for d in document_ids)}"


class MissingVectorsError(BackendError):
    """Dense search on documents that were indexed without page embeddings."""

    def __init__(self, doc_ids: Sequence[str], tenant: str | None = None):
        """``tenant``: the documents' tenant, named in the command that embeds them."""
        self.doc_ids = list(doc_ids)
        shown = listed(self.doc_ids)
        super().__init__(
            f"no page embeddings for document(s) {shown}: they were indexed with EVIDENTIA_DENSE=off "
            f"(or before dense retrieval existed), so the dense and hybrid stages cannot search them; "
            f"`{embed_command_line(self.doc_ids[:10], tenant)}` adds them from the indexed "
            f"page text (no re-extraction), or index them again "
            f"with EVIDENTIA_DENSE=on, or use the bm25 stage")


class VectorModelError(BackendError):
    """The query was embedded with another model than the document's pages."""

    def __init__(self, doc_ids: Sequence[str], indexed_with: str, query_model: str):
        self.doc_ids = list(doc_ids)
        self.indexed_with, self.query_model = indexed_with, query_model
        super().__init__(
            f"document(s) {', '.join(self.doc_ids[:10])} were embedded with model {indexed_with!r}, but the "
            f"query with {query_model!r} (EVIDENTIA_DENSE_MODEL): set EVIDENTIA_DENSE_MODEL back to "
            f"{indexed_with!r}, or index the documents again with the new model")


NEUTRAL_FIELD = "body"  # every page's text, analysed without a language


def lang_field(lang: str) -> str:
    """The field of a page's text analysed as ``lang`` (stemming, stop words)."""
    return f"body_{lang}"


def search_fields(page: Page) -> dict[str, str]:
    """The searchable text fields of a page, the same in every backend: the neutral
    one, and its language's where that language is analysed (text.LANGUAGES)."""
    if not page.text:
        return {}
    normalised = search_text(page.text, page.language)
    fields = {NEUTRAL_FIELD: normalised}
    if page.language in LANGUAGES:
        fields[lang_field(page.language)] = normalised
    return fields


def stored_windows(vectors_meta: dict) -> tuple[int, int, int] | None:
    """The windows a record's ``vectors_meta`` says its vectors were made with (None: not recorded)."""
    windows = vectors_meta.get("windows")
    return tuple(int(n) for n in windows) if windows else None


def vectors_meta(document: Document) -> dict | None:
    """What a document's record says of its page vectors (None without them)."""
    v = document.vectors
    if v is None:
        return None
    meta = {"model": v.model, "dim": v.dim, "rows": v.rows}
    if v.windows is not None:
        meta["windows"] = list(v.windows)
    return meta


def document_meta(document: Document, vectors: dict | None = None) -> dict:
    """The summary every backend keeps in a document's record, the same JSON in each
    (``vectors``: ``vectors_meta``, plus where the backend keeps them)."""
    meta = {
        "pages": document.page_count,
        "empty_pages": document.empty_pages,
        "languages": document.languages,
        "source": document.source,
        "ocr_pages": document.ocr_pages,
        "unread_pages": document.unread_pages,
        "ocr_confidence": document.ocr_confidence,
    }
    if vectors:
        meta["vectors"] = vectors
    return meta


def info_from_meta(doc_id: str, meta: Mapping) -> DocumentInfo:
    """The DocumentInfo of a record written with ``document_meta``."""
    return DocumentInfo(doc_id=doc_id, pages=meta["pages"], empty_pages=meta["empty_pages"],
                        languages=meta.get("languages", {}), source=meta.get("source", ""),
                        ocr_pages=meta.get("ocr_pages", 0), unread_pages=meta.get("unread_pages", 0),
                        ocr_confidence=meta.get("ocr_confidence"))


class SearchBackend(ABC):
    """A page index: BM25 over the page text, and (when the documents were indexed
    with embeddings) exact cosine search over the page vectors. Implementations
    return the same records for the same data."""

    @abstractmethod
    def index_document(self, document: Document) -> None:
        """Store all pages of ``document`` at once, replacing any earlier version
        with the same id. Either every page becomes visible or none does."""

    def index_documents(self, documents: Iterable[Document]) -> None:
        """Index many documents; each one still all or nothing. Backends may
        batch writes (one commit for the lot) where that is much faster."""
        for document in documents:
            self.index_document(document)

    @abstractmethod
    def delete_document(self, doc_id: str) -> bool:
        """Remove a document; False when it was not there."""

    @abstractmethod
    def list_documents(self) -> list[DocumentInfo]:
        """Indexed documents, sorted by id."""

    @abstractmethod
    def get_page(self, doc_id: str, page: int) -> Page | None: ...

    @abstractmethod
    def search(self, keywords: Sequence[str], doc_ids: Sequence[str], top_k: int) -> list[Candidate]:
        """Best ``top_k`` pages of the given documents for the analysed ``keywords``
        (see ``retriever.query``), best first. Unknown ids raise ``UnknownDocumentError``."""

    def search_dense(self, query_vector, doc_ids: Sequence[str], top_k: int,
                     model: str | None = None) -> list[Candidate]:
        """Best ``top_k`` pages of the given documents by cosine similarity between
        ``query_vector`` (normalised) and the page's best window vector, best
        first; ties by doc id, then page. Empty pages have no vector and never
        match. Unknown ids raise ``UnknownDocumentError``; documents indexed
        without vectors raise ``MissingVectorsError``; when ``model`` is given and
        differs from the one the pages were embedded with, ``VectorModelError``.
        Candidates carry no snippet (there are no keywords to centre it on)."""
        raise BackendError(f"{type(self).__name__} has no dense search")

    def get_document(self, doc_id: str) -> DocumentInfo | None:
        return next((d for d in self.list_documents() if d.doc_id == doc_id), None)

    def vector_models(self, doc_ids: Sequence[str]) -> dict[str, str | None]:
        """The embedding model of each indexed document's page vectors (None: indexed
        without vectors); ids that are not indexed are left out."""
        raise BackendError(f"{type(self).__name__} does not store page vectors")

    def page_vectors(self, doc_id: str) -> PageVectors | None:
        """The window vectors stored with the document at indexing time (rows grouped
        by page, as ``PageVectors``); None for a document indexed without them or not
        indexed. The classifier reads them for a candidate's whole document."""
        return None

    def stored_document(self, doc_id: str) -> Document | None:
        """The document as indexed (all its pages, from the index, without vectors):
        what ``evidentia embed`` embeds without extracting the PDF again."""
        info = self.get_document(doc_id)
        if info is None:
            return None
        pages = []
        for n in range(1, info.pages + 1):
            page = self.get_page(doc_id, n)
            if page is None:  # replaced or deleted meanwhile
                return None
            pages.append(page)
        return Document(doc_id=doc_id, pages=tuple(pages), source=info.source)

    def close(self) -> None:
        """Release files or connections."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
