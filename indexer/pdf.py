"""PDF -> pages with PyMuPDF, with one clear error per kind of bad file."""

from __future__ import annotations

from pathlib import Path

import pymupdf

from evidentia.language import LanguageDetector
from evidentia.records import Document, Page
from evidentia.text import clean_text


class PdfError(Exception):
    """A file that cannot be indexed; the message is one line meant for a person."""


def open_pdf(path: Path) -> pymupdf.Document:
    path = Path(path)
    if not path.is_file():
        raise PdfError(f"{path}: no such file")
    with open(path, "rb") as fh:
        head = fh.read(1024)
    if not head:
        raise PdfError(f"{path.name}: empty file, not a PDF")
    if b"%PDF-" not in head:
        raise PdfError(f"{path.name}: not a PDF (no %PDF- header)")
    try:
        doc = pymupdf.open(path, filetype="pdf")
    except Exception as exc:  # PyMuPDF raises several types for broken files
        raise PdfError(f"{path.name}: corrupted PDF ({_first_line(exc)})") from None
    try:
        needs_pass = doc.needs_pass
        page_count = 0 if needs_pass else doc.page_count
    except Exception as exc:  # a damaged page tree may only show here (truncated files)
        doc.close()
        raise PdfError(f"{path.name}: corrupted PDF ({_first_line(exc)})") from None
    if needs_pass:
        doc.close()
        raise PdfError(f"{path.name}: encrypted PDF (password required)")
    if page_count == 0:
        doc.close()
        raise PdfError(f"{path.name}: PDF has no pages")
    return doc


def extract_pages(path: Path, doc_id: str, detector: LanguageDetector) -> Document:
    """Read every page, or raise ``PdfError``: a document is never returned half-read."""
    path = Path(path)
    doc = open_pdf(path)
    raw_texts: list[str] = []
    try:
        for index in range(doc.page_count):
            try:
                raw_texts.append(doc.load_page(index).get_text("text", sort=False))
            except Exception as exc:
                raise PdfError(f"{path.name}: page {index + 1} cannot be read ({_first_line(exc)})") from None
    finally:
        doc.close()
    cleaned = [clean_text(t) for t in raw_texts]
    languages = detector.detect_pages(cleaned)
    pages = tuple(
        Page(doc_id=doc_id, page=i + 1, raw_text=raw, text=text, language=lang, char_count=len(text))
        for i, (raw, text, lang) in enumerate(zip(raw_texts, cleaned, languages))
    )
    return Document(doc_id=doc_id, pages=pages, source=path.name)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
