"""The search-backend interface: every first-stage engine implements this."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Iterable, Sequence

from evidentia.records import Candidate, Document, DocumentInfo, Page


class BackendError(RuntimeError):
    """The search engine failed or is unreachable; the message says what to do."""


class UnknownDocumentError(KeyError):
    """A requested document id is not in the index."""

    def __init__(self, doc_ids: Sequence[str]):
        self.doc_ids = list(doc_ids)
        super().__init__(", ".join(self.doc_ids))

    def __str__(self) -> str:
        return f"unknown document id(s): {', '.join(self.doc_ids)}"


class SearchBackend(ABC):
    """A BM25 page index. Implementations return the same records for the same data."""

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

    def get_document(self, doc_id: str) -> DocumentInfo | None:
        return next((d for d in self.list_documents() if d.doc_id == doc_id), None)

    def close(self) -> None:
        """Release files or connections."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
