"""PDF -> pages with PyMuPDF, with one clear error per kind of bad file."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Callable

import pymupdf

from evidentia.indexer.ocr import (NONE, OCR, SHORT_TEXT_LETTERS, TEXT, UNREAD, OcrEngine, PageText, has_letters,
                                   is_garbage, read_page)
from evidentia.language import CONFIDENT, LanguageDetector
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


def extract_pages(path: Path, doc_id: str, detector: LanguageDetector, ocr: OcrEngine | None = None,
                  on_ocr_page: Callable[[PageText], None] | None = None) -> Document:
    """Read every page, or raise ``PdfError``: a document is never returned half-read.
    Pages without a usable text layer are read by OCR when ``ocr`` is enabled
    (None: OCR off; such pages are then counted as unread). ``on_ocr_page`` is
    called after each page that went through OCR (for progress)."""
    path = Path(path)
    engine = ocr or OcrEngine(mode="off")
    doc = open_pdf(path)
    t_ocr = 0.0
    try:
        raw_layers: list[str] = []
        for index in range(doc.page_count):
            try:
                raw_layers.append(doc.load_page(index).get_text("text", sort=False))
            except Exception as exc:
                raise PdfError(f"{path.name}: page {index + 1} cannot be read ({_first_line(exc)})") from None
        results: list[PageText | None] = [None] * doc.page_count
        for index, layer in enumerate(raw_layers):
            # plenty of real text: settled without looking at the page's drawings
            if engine.mode != "force" and has_letters(layer, SHORT_TEXT_LETTERS) and not is_garbage(layer):
                results[index] = PageText(layer, TEXT)
        # The document prior: the language of its readable pages guides the OCR of
        # the others; a document with none takes the first confident OCR'd page's.
        pending = [i for i, r in enumerate(results) if r is None]
        prior = (_majority_language(detector, [r.text for r in results if r is not None])
                 if pending and engine.enabled else None)
        for index in pending:
            try:
                page = doc.load_page(index)
                read = read_page(page, engine, prior, raw_layers[index])
                t_ocr += read.seconds
                if read.source == OCR:
                    lang, prob = detector.detect_page(clean_text(read.text))
                    lang = lang if prob >= CONFIDENT else None
                    if lang and lang != prior and engine.languages_for(lang) != read.languages:
                        # a page in another language than the document's (a French
                        # certificate in an English report): read again in its own
                        again = read_page(page, engine, lang, raw_layers[index])
                        t_ocr += again.seconds
                        best = again if again.source == OCR and (again.confidence or 0) >= (read.confidence or 0) \
                            else read
                        read = replace(best, seconds=read.seconds + again.seconds)  # the page cost both
                    prior = prior or lang
            except Exception as exc:  # rendering a damaged page
                raise PdfError(f"{path.name}: page {index + 1} cannot be read ({_first_line(exc)})") from None
            results[index] = read
            if read.source == OCR and on_ocr_page:
                on_ocr_page(read)
    finally:
        doc.close()
    raw_texts = [r.text for r in results]
    cleaned = [clean_text(t) for t in raw_texts]
    languages = detector.detect_pages(cleaned)
    pages = tuple(
        Page(doc_id=doc_id, page=i + 1, raw_text=raw, text=text, language=lang, char_count=len(text),
             text_source=_final_source(r.source, text), ocr_confidence=r.confidence if r.source == OCR else None)
        for i, (raw, text, lang, r) in enumerate(zip(raw_texts, cleaned, languages, results))
    )
    problems = [r.problem for r in results if r.source == UNREAD and r.problem]
    return Document(doc_id=doc_id, pages=pages, source=path.name, ocr_seconds=t_ocr,
                    ocr_problem=problems[0] if problems else "")


def _majority_language(detector: LanguageDetector, texts: list[str]) -> str | None:
    if not texts:
        return None
    langs = [lang for lang in detector.detect_pages([clean_text(t) for t in texts]) if lang]
    return Counter(langs).most_common(1)[0][0] if langs else None


def _final_source(source: str, cleaned: str) -> str:
    # a text layer that cleaning reduced to nothing (stray marks) is no text at all
    return NONE if source == TEXT and not cleaned else source


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
