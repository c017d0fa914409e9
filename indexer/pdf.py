"""PDF -> pages with PyMuPDF, with one clear error per kind of bad file."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pymupdf

from evidentia.language import LanguageDetector
from evidentia.records import Document, Page
from evidentia.text import clean_text


class PdfError(Exception):
    """A file that cannot be indexed; the message is one line meant for a person."""


def open_pdf(path: Path) -> pymupdf.Document:
    path = Path(path)
    if not path.is_file():
        raise PdfError(f"{path.name}: no such file")
    with open(path, "rb") as fh:
        head = fh.read(1024)
    if not head:
        raise PdfError(f"{path.name}: empty file, not a PDF")
    if b"%PDF-" not in head:
        raise PdfError(f"{path.name}: not a PDF (no %PDF- header)")
    # Reasons never quote PyMuPDF: its messages hold the server's path and internals.
    try:
        doc = pymupdf.open(path, filetype="pdf")
    except Exception:  # PyMuPDF raises several types for broken files
        raise PdfError(f"{path.name}: {_unreadable(path, head)}") from None
    try:
        needs_pass = doc.needs_pass
        page_count = 0 if needs_pass else doc.page_count
        repaired = bool(getattr(doc, "is_repaired", False))
    except Exception:  # a damaged page tree may only show here (truncated files)
        doc.close()
        raise PdfError(f"{path.name}: {_unreadable(path, head)}") from None
    if needs_pass:
        doc.close()
        raise PdfError(f"{path.name}: encrypted PDF (password required)")
    if (page_count == 0 or repaired) and _is_truncated(path):
        # MuPDF rebuilds a cut file from the objects it finds: it may open with no
        # pages, or with some pages and others silently empty; neither is indexed
        doc.close()
        raise PdfError(f"{path.name}: {TRUNCATED}")
    if page_count == 0:
        doc.close()
        raise PdfError(f"{path.name}: PDF has no pages")
    return doc


TRUNCATED = "corrupted PDF: the file is truncated (its end is missing); upload the complete file"


def _is_truncated(path: Path) -> bool:
    """No %%EOF marker in the last 1024 bytes (where readers look for it), but PDF
    objects before: the start of a real PDF whose end was cut off."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        fh.seek(max(0, size - 1024))
        tail = fh.read()
        if b"%%EOF" in tail:
            return False
        fh.seek(0)
        return b"endobj" in fh.read(min(size, 4 << 20))


def _unreadable(path: Path, head: bytes) -> str:
    """Why PyMuPDF cannot open the file, in words for a person."""
    before = head.split(b"%PDF-", 1)[0].lower()
    if b"<html" in before or b"<!doctype" in before:
        return "not a PDF (an HTML document with a %PDF- marker inside)"
    if _is_truncated(path):
        return TRUNCATED
    return "corrupted PDF (its structure cannot be read: the file is damaged or is not a PDF)"


def extract_pages(path: Path, doc_id: str, detector: LanguageDetector,
                  check_page: Callable[[int, str], None] | None = None) -> Document:
    """Read every page, or raise ``PdfError``: a document is never returned half-read.
    ``check_page(page_number, text)`` sees each page's text as soon as it is read
    and may raise ``PdfError`` to stop (the size caps of indexer/worker.py)."""
    path = Path(path)
    doc = open_pdf(path)
    raw_texts: list[str] = []
    try:
        for index in range(doc.page_count):
            try:
                raw_texts.append(doc.load_page(index).get_text("text", sort=False))
            except Exception as exc:
                raise PdfError(f"{path.name}: page {index + 1} cannot be read ({_describe(exc)})") from None
            if check_page is not None:
                check_page(index + 1, raw_texts[-1])
    finally:
        doc.close()
    cleaned = [clean_text(t) for t in raw_texts]
    languages = detector.detect_pages(cleaned)
    pages = tuple(
        Page(doc_id=doc_id, page=i + 1, raw_text=raw, text=text, language=lang, char_count=len(text))
        for i, (raw, text, lang) in enumerate(zip(raw_texts, cleaned, languages))
    )
    return Document(doc_id=doc_id, pages=pages, source=path.name)


def _describe(exc: BaseException) -> str:
    """A page error in words: out of memory (the extraction worker's limit, see
    indexer/worker.py) or damaged content; never PyMuPDF's own text."""
    text = str(exc).lower()
    if isinstance(exc, MemoryError) or any(w in text for w in ("malloc", "calloc", "realloc", "out of memory")):
        return "out of memory"
    return "damaged or unsupported page content"
