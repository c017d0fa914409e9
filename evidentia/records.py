"""Plain typed records passed between the stages (indexer -> retriever -> reranker -> api)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Page:
    """One PDF page as the indexer produced it."""

    doc_id: str
    page: int  # 1-based, as a PDF viewer numbers it
    raw_text: str
    text: str  # cleaned text: what is shown, searched and reranked
    language: str | None  # ISO 639-1 code, None for empty or too-short pages
    char_count: int

    @property
    def is_empty(self) -> bool:
        return self.char_count == 0


@dataclass(frozen=True)
class Document:
    """A whole indexed document: metadata plus its pages, written all at once."""

    doc_id: str
    pages: tuple[Page, ...]
    source: str = ""  # file name it came from

    @property
    def page_count(self) -> int:
        return len(self.pages)

    @property
    def empty_pages(self) -> int:
        return sum(1 for p in self.pages if p.is_empty)

    @property
    def languages(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for p in self.pages:
            if p.language:
                counts[p.language] = counts.get(p.language, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


@dataclass(frozen=True)
class DocumentInfo:
    """What a backend knows about an indexed document without loading its pages."""

    doc_id: str
    pages: int
    empty_pages: int
    languages: dict[str, int] = field(default_factory=dict)
    source: str = ""


@dataclass(frozen=True)
class Candidate:
    """A page returned by first-stage retrieval, with the text a reranker needs."""

    doc_id: str
    page: int
    score: float
    text: str
    language: str | None = None
    snippet: str = ""


@dataclass(frozen=True)
class RankedPage:
    """A page a reranker kept, best first."""

    doc_id: str
    page: int
    score: float
    probability: float | None = None
    snippet: str = ""
    text: str = ""
