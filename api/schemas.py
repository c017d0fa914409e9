"""Request and response models of the validation API (they are its OpenAPI schema)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from evidentia.config import STAGES
from evidentia.indexer.ocr import SOURCES
from evidentia.reranker.registry import reranker_names
from evidentia.store import DOCUMENT_ID_RE

Status = Literal["queued", "indexing", "ready", "failed"]
Stage = Literal[STAGES]  # the same tuple the engine checks; a Literal so OpenAPI lists the values
TextSource = Literal[SOURCES]  # how a page's text was obtained: indexer/ocr.py


# Characters that make a short text shown to people say something else than it is: C0/C1
# controls (NUL, CR, LF, ESC), the Unicode line and paragraph separators, the bidi
# controls that reorder what follows them ("\u202egpj.exe" shows as "exe.jpg"), and the
# invisible ones no script writes with (zero-width space, word joiner, BOM: "ann" and
# "ann\u200b" were two analysts). ZWJ and ZWNJ stay: Persian and Indic names use them.
UNSAFE_TEXT_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b\u200e\u200f\u2028\u2029\u202a-\u202e"
                               "\u2060\u2066-\u2069\ufeff]")


def unencodable_text_problem(text: str) -> str | None:
    """Why a text cannot be stored or searched (a lone UTF-16 surrogate, which JSON's
    "\\udfff" escape can send and UTF-8 cannot hold), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"contains the lone surrogate U+{ord(text[exc.start]):04X} at position {exc.start}; a JSON \\u "
                "escape of a character beyond U+FFFF must pair a high and a low surrogate")
    return None


def unsafe_text_problem(text: str) -> str | None:
    """Why a name or label cannot be shown as sent (its first unsafe character), or None."""
    m = UNSAFE_TEXT_CHARS.search(text)
    if m is None:
        return None
    return (f"contains the control, bidi or invisible character U+{ord(m.group()):04X} at position {m.start()}; "
            "send plain text on one line")


class ErrorDetail(BaseModel):
    code: str = Field(..., description="Stable machine-readable code, e.g. `not_found`, `rate_limited`.",
                      examples=["document_not_ready"])
    message: str = Field(..., description="What went wrong and what to do about it, for a person.",
                         examples=["document acme-2023 is still indexing; poll GET /v1/documents/acme-2023"])
    details: Any = Field(None, description="Structured context (offending fields, limits, document ids), or null.")


class ErrorResponse(BaseModel):
    """Every error of the API has this one shape."""

    error: ErrorDetail


# -- documents ----------------------------------------------------------------
class DocumentAccepted(BaseModel):
    document_id: str
    status: Status = Field(..., examples=["queued"], description="`queued`; `ready` when a ready document was "
                           "uploaded again: it is served as it was until the new file is indexed.")
    reindex_status: str | None = Field(None, description="`queued` when this upload re-indexes a ready document.")


class IndexingProgress(BaseModel):
    pages_done: int = Field(..., description="Pages read and embedded so far.")
    pages_total: int = Field(..., description="Pages in the document (0 while its pages are still being counted).")
    ocr_pages: int = Field(0, description="Scanned pages read by OCR so far (OCR takes seconds a page).")
    ocr_pages_left: int | None = Field(None, description="Pages without a usable text layer that OCR has still to "
                                       "look at (null for a document that needs no OCR, or before its text layers "
                                       "are read); 0 once OCR is done.")


class DocumentOut(BaseModel):
    document_id: str
    status: Status
    reason: str | None = Field(None, description="Why indexing failed (status `failed`), else null.")
    progress: IndexingProgress | None = Field(None, description="While `indexing`: pages done of the document's "
                                              "pages (null before its pages are counted, and otherwise).")
    filename: str = Field(..., description="Name of the uploaded file.")
    size_bytes: int
    pages: int | None = Field(None, description="Page count, once indexed.")
    empty_pages: int | None = Field(None, description="Pages without text (blank pages, and scans that were "
                                    "not read: see unread_pages).")
    languages: dict[str, int] = Field(default_factory=dict, description="Detected language -> number of pages.")
    ocr_pages: int | None = Field(None, description="Pages whose text was read by OCR (scans, junk text layers).")
    ocr_confidence: float | None = Field(None, description="Mean OCR word confidence over the OCR'd pages, 0-100.")
    unread_pages: int | None = Field(None, description="Pages that show something (a scan) but whose text could "
                                     "not be obtained: their evidence cannot be found.")
    caption_only_pages: int | None = Field(None, description="Pages showing a scan or a figure printed as an image "
                                           "that OCR could not read (see unread_reason): only their short text layer "
                                           "(a caption, a stamp) is searched.")
    unread_reason: str | None = Field(None, description="Why pages were left unread (OCR off, Tesseract missing, "
                                      "OCR failed), and how to fix it.")
    created: str
    updated: str
    reindex_status: str | None = Field(None, description="A re-upload of this ready document: `queued`, "
                                       "`indexing` (the previous version is served meanwhile), `failed` (the "
                                       "previous version stays; see `reindex_reason`), or null.")
    reindex_reason: str | None = Field(None, description="Why the re-upload failed (`reindex_status` `failed`).")


class DocumentList(BaseModel):
    documents: list[DocumentOut]


class PageOut(BaseModel):
    document_id: str
    page: int = Field(..., description="1-based page number.")
    text: str = Field(..., description="The page's cleaned text, as searched and reranked.")
    language: str | None = Field(None, description="ISO 639-1 code; null for empty or very short pages.")
    char_count: int
    text_source: TextSource = Field("text", description="How the text was obtained: `text` (the PDF's text layer), "
                                     "`ocr` (read from the page image), `unread` (a scan that was not read), "
                                     "`none` (blank page).")
    ocr_confidence: float | None = Field(None, description="Mean OCR word confidence, 0-100 (OCR'd pages only).")


# -- validation ---------------------------------------------------------------
# Ids are checked before they are looked up: one of a megabyte came back twice in its 404
DOCUMENT_ID_PATTERN = DOCUMENT_ID_RE.pattern.replace("\\Z", "$")  # pydantic's regex: "$" ends the text
DocumentIdField = Annotated[str, Field(pattern=DOCUMENT_ID_PATTERN, description="A document id: 1-128 ASCII "
                                       "letters, digits, '.', '_' or '-', starting with a letter or digit.")]
VALIDATION_ID_PATTERN = r"^val_[0-9a-f]{32}$"


class ValidateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    question: str = Field(..., min_length=1, description="The questionnaire question (EVIDENTIA_MAX_QUESTION_CHARS, "
                          "default 2000 characters at most).",
                          examples=["What were the company's Scope 1 and 2 greenhouse gas emissions in 2023?"])
    answer: str = Field("", description="The supplier's answer (EVIDENTIA_MAX_ANSWER_CHARS, default 5000 "
                        "characters at most).", examples=["12450 tCO2e, down 12.5% on 2022."])
    document_ids: list[DocumentIdField] = Field(..., min_length=1, description="Documents to search (yours, status "
                                                "`ready`; EVIDENTIA_MAX_DOCUMENTS_PER_VALIDATION, default 20 at "
                                                "most).", examples=[["acme-2023"]])
    top_k: int | None = Field(None, ge=1, description="Candidate pool handed to the reranker, and the number of "
                              "pages returned by `none` (default EVIDENTIA_POOL_SIZE; EVIDENTIA_MAX_TOP_K, "
                              "default 100 at most).")
    reranker: str | None = Field(None, description=f"One of {', '.join(reranker_names())} "
                                 "(default EVIDENTIA_DEFAULT_RERANKER).", examples=["none"])
    threshold: float | None = Field(None, ge=0.0, le=1.0, allow_inf_nan=False,
                                    description="Rerankers with probabilities (classifier): drop pages below this "
                                    "probability (default EVIDENTIA_CLASSIFIER_THRESHOLD).")
    stage: Stage | None = Field(None, description="First stage that builds the candidate pool: `bm25` (keywords), "
                                "`dense` (embedding similarity of the question + answer to the pages) or `hybrid` "
                                "(both, fused by reciprocal-rank fusion). Default EVIDENTIA_STAGE. `dense` and "
                                "`hybrid` need the server to run with EVIDENTIA_DENSE=on (else 422) and documents "
                                "uploaded while it was on, so that their pages have embeddings (else 409 "
                                "`missing_vectors`: upload them again, or use `bm25`).", examples=["hybrid"])

    @field_validator("question", "answer")
    @classmethod
    def _text_is_encodable(cls, value: str) -> str:
        # the answer (no other constraint on it) reached the tokenizer and the store: a 500 each
        problem = unencodable_text_problem(value)
        if problem:
            raise ValueError(problem)
        return value


class RerankerOption(BaseModel):
    name: str
    available: bool = Field(..., description="false when the server lacks what it needs (the LLM: no endpoint key "
                            "configured); a request naming it still answers, in the first stage's order, with a "
                            "`fallback_reason`.")
    note: str | None = Field(None, description="Why it is not available, and what the server needs.")


class ValidateOptions(BaseModel):
    rerankers: list[RerankerOption]
    default_reranker: str = Field(..., description="Used when a request names none (EVIDENTIA_DEFAULT_RERANKER).")
    stage: Stage = Field(..., description="The default first stage (EVIDENTIA_STAGE).")
    top_k: int = Field(..., description="The default candidate pool (EVIDENTIA_POOL_SIZE).")
    max_top_k: int = Field(..., description="The largest `top_k` accepted (EVIDENTIA_MAX_TOP_K).")
    threshold: float = Field(..., description="The classifier's default threshold (EVIDENTIA_CLASSIFIER_THRESHOLD).")


class EarlierVerdict(BaseModel):
    relevant: bool
    analyst: str | None = Field(None, description="As the analyst signed it; null when unsigned.")
    created: str


class ValidatedPage(BaseModel):
    document_id: str
    page: int
    score: float = Field(..., description="Rank score (for `none` the first stage's: BM25, cosine similarity "
                         "for `dense`, fused reciprocal rank for `hybrid`; the probability for the classifier).")
    probability: float | None = Field(None, description="Calibrated relevance probability, if the reranker has one.")
    snippet: str
    earlier_verdicts: list[EarlierVerdict] = Field(default_factory=list, description="Verdicts analysts gave this "
                                                   "page for the same question and answer (case, spacing and the "
                                                   "writing of figures aside) in earlier validations, on the same "
                                                   "page text: each analyst's latest, latest first (at most 5).")


class ValidateResponse(BaseModel):
    validation_id: str = Field(..., description="Quote it in POST /v1/feedback.")
    pages: list[ValidatedPage] = Field(..., description="Supporting pages, best first.")
    reranker: str
    stage: Stage = Field(..., description="The first stage that built the candidate pool.")
    stage_note: str | None = Field(None, description="Set when the server's default stage (hybrid) searched with "
                                   "`bm25` because a document has no page embeddings (says how to add them), or "
                                   "when no page of a hybrid pool holds any of the query's words (found by meaning "
                                   "alone, they may not be evidence).")
    fallback_reason: str | None = Field(None, description="Set when the reranker failed and the first-stage order "
                                        "was returned instead.")
    timings_ms: dict[str, float]
    model_version: str | None = Field(None, description="Identifies the classifier model (name@created+data hash); "
                                      "null for other rerankers.")
    candidates: int = Field(0, description="Pages in the first-stage pool the reranker saw.")
    threshold: float | None = Field(None, description="The relevance threshold the classifier applied (the "
                                    "request's, else the server's EVIDENTIA_CLASSIFIER_THRESHOLD); null for "
                                    "other rerankers.")
    note: str | None = Field(None, description="When no page came back: why (no searchable word, no page with "
                             "the words, every candidate below the threshold) and what to do.")


# -- feedback -----------------------------------------------------------------
class FeedbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    validation_id: str = Field(..., pattern=VALIDATION_ID_PATTERN)
    document_id: DocumentIdField
    page: int = Field(..., ge=1)
    relevant: bool = Field(..., description="Does this page support the answer?")
    analyst: str | None = Field(None, max_length=200, description="Who judged (free text on one line, e.g. an "
                                "e-mail; no control or bidi characters).")

    @field_validator("analyst")
    @classmethod
    def _analyst_is_plain_text(cls, value: str | None) -> str | None:
        # it is exported with the training data and shown to people: it must read as it is
        problem = None if value is None else unsafe_text_problem(value)
        if problem:
            raise ValueError(problem)
        return value


class FeedbackOut(BaseModel):
    feedback_id: int
    validation_id: str
    document_id: str
    page: int
    relevant: bool
    analyst: str | None
    created: str


# -- admin --------------------------------------------------------------------
class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    tenant: str = Field(..., pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", examples=["acme"],
                        description="1-64 letters, digits, '.', '_' or '-'; created on first use.")


class KeyInfo(BaseModel):
    key_id: str
    tenant: str
    created: str


class KeyCreated(KeyInfo):
    key: str = Field(..., description="The API key. Shown this once: only its salted hash is stored.")


class KeyList(BaseModel):
    keys: list[KeyInfo]


# -- health -------------------------------------------------------------------
class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Ready(BaseModel):
    status: Literal["ready"] = "ready"
    checks: dict[str, str]
