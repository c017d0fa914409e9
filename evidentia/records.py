"""Plain typed records passed between the stages (indexer -> retriever -> reranker -> api)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Page:
    """One PDF page as the indexer produced it."""

    doc_id: str
    page: int  # 1-based, as a PDF viewer numbers it
    raw_text: str
    text: str  # cleaned text: what is shown, searched and reranked
    language: str | None  # ISO 639-1 code, None for empty or too-short pages
    char_count: int
    # How the text was obtained (see indexer/ocr.py): "text" (the PDF's text layer),
    # "ocr", "unread" (shows something but was not read: OCR off, no Tesseract, OCR
    # failed) or "none" (blank). Empty: derived, "text" when there is text, else "none".
    text_source: str = ""
    ocr_confidence: float | None = None  # mean Tesseract word confidence (0-100), OCR'd pages only

    def __post_init__(self) -> None:
        if not self.text_source:
            object.__setattr__(self, "text_source", "text" if self.char_count else "none")

    @property
    def is_empty(self) -> bool:
        return self.char_count == 0


@dataclass(frozen=True, eq=False)
class PageVectors:
    """Dense vectors of a document's pages: one row per window of a page (see
    ``retriever.dense``), rows grouped by page in page order; empty pages have none.
    Vectors are L2-normalised, so a dot product is a cosine."""

    model: str  # the embedding model's name (``retriever.dense.canonical_model_name``)
    pages: Any  # numpy int32 array (rows,): the page number of each row
    vectors: Any  # numpy float array (rows, dim)
    # (max_tokens, window_overlap, max_windows) they were made with; None for vectors
    # indexed before it was recorded
    windows: tuple[int, int, int] | None = None

    @property
    def rows(self) -> int:
        return len(self.pages)

    @property
    def dim(self) -> int:
        shape = getattr(self.vectors, "shape", (0, 0))
        return int(shape[1]) if len(shape) == 2 else 0


@dataclass(frozen=True)
class Document:
    """A whole indexed document: metadata plus its pages, written all at once."""

    doc_id: str
    pages: tuple[Page, ...]
    source: str = ""  # file name it came from
    # Page embeddings computed at indexing time; None when indexed without (EVIDENTIA_DENSE=off).
    vectors: PageVectors | None = field(default=None, compare=False, repr=False)
    ocr_seconds: float = field(default=0.0, compare=False)  # time spent in OCR while extracting
    ocr_problem: str = field(default="", compare=False)  # why pages were left unread (first reason), if any
    # pages of a figure printed as an image (or a scan under a stamp) that OCR could not
    # read: they keep their short text layer, a caption, and are not counted unread
    caption_only_pages: int = field(default=0, compare=False)

    @property
    def page_count(self) -> int:
        return len(self.pages)

    @property
    def empty_pages(self) -> int:
        return sum(1 for p in self.pages if p.is_empty)

    @property
    def ocr_pages(self) -> int:
        return sum(1 for p in self.pages if p.text_source == "ocr")

    @property
    def unread_pages(self) -> int:
        """Pages that show something but whose text was not obtained."""
        return sum(1 for p in self.pages if p.text_source == "unread")

    @property
    def ocr_confidence(self) -> float | None:
        """Mean OCR confidence over the OCR'd pages that have one."""
        values = [p.ocr_confidence for p in self.pages if p.ocr_confidence is not None]
        return round(sum(values) / len(values), 1) if values else None

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
    ocr_pages: int = 0  # pages whose text comes from OCR
    unread_pages: int = 0  # pages that show something but were not read (see Page.text_source)
    ocr_confidence: float | None = None  # mean over the OCR'd pages (0-100)


@dataclass(frozen=True)
class Query:
    """A question and its answer, built once (``retriever.query.build_query``) and
    handed unchanged to the first stage and the reranker."""

    question: str
    answer: str
    text: str  # question and answer joined, stripped: what encoders and rerankers read
    keywords: tuple[str, ...]  # BM25 terms: stop words removed, figures normalised
    language: str | None  # detected language of ``text`` (ISO 639-1), None when unsure


@dataclass(frozen=True)
class Candidate:
    """A page returned by first-stage retrieval, with the text a reranker needs."""

    doc_id: str
    page: int
    score: float
    text: str
    language: str | None = None
    snippet: str = ""
    # the first stages whose ranking held the page ("bm25", "dense"): a hybrid pool without
    # a "bm25" page matched none of the query's words (SearchResult.meaning_only_note)
    found_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class RankedPage:
    """A page a reranker kept, best first."""

    doc_id: str
    page: int
    score: float
    probability: float | None = None
    snippet: str = ""
    text: str = ""
