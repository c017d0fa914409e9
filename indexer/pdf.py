"""PDF -> pages with PyMuPDF, with one clear error per kind of bad file."""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path
from typing import Callable, Iterable

import pymupdf

from evidentia.indexer.ocr import (FIGURE_CAPTION_LETTERS, NONE, OCR, TEXT, UNREAD, OcrBacklog, OcrEngine, PageText,
                                   Rendered, TesseractPool, TesseractRun, ToRead, decide_page, has_letters, is_garbage,
                                   read_rendered, render_page)
from evidentia.language import CONFIDENT, LanguageDetector
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


# bytes that pad a complete file after its %%EOF (some writers and transfers add them)
_PADDING = b"\x00\t\n\x0c\r "


def _is_truncated(path: Path) -> bool:
    """No %%EOF marker in the last 1024 bytes before any trailing padding (where
    readers look for it), but PDF objects before: the start of a real PDF whose end
    was cut off."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        end = size
        while end > 0:  # back over the padding, 64 KiB at a time
            start = max(0, end - (1 << 16))
            fh.seek(start)
            kept = fh.read(end - start).rstrip(_PADDING)
            end = start + len(kept)
            if kept:
                break
        tail_start = max(0, end - 1024)
        fh.seek(tail_start)
        if b"%%EOF" in fh.read(end - tail_start):
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


def extract_pages(path: Path, doc_id: str, detector: LanguageDetector, ocr: OcrEngine | None = None,
                  on_ocr_page: Callable[[PageText], None] | None = None,
                  check_page: Callable[[int, str], None] | None = None,
                  on_ocr_backlog: Callable[[OcrBacklog], None] | None = None) -> Document:
    """Read every page, or raise ``PdfError``: a document is never returned half-read.
    Pages without a usable text layer are read by OCR when ``ocr`` is enabled
    (None: OCR off; such pages are then counted as unread). ``on_ocr_page`` is
    called after each page that went through OCR, ``on_ocr_backlog`` before the first page
    OCR looks at and after each one (for progress). ``check_page(page_number,
    text)`` sees each page's text as soon as it is read and may raise ``PdfError``
    to stop (the size caps of indexer/worker.py)."""
    path = Path(path)
    engine = ocr or OcrEngine(mode="off")
    doc = open_pdf(path)
    page_ocr_seconds = 0.0
    try:
        raw_layers: list[str] = []
        for index in range(doc.page_count):
            try:
                raw_layers.append(doc.load_page(index).get_text("text", sort=False))
            except Exception as exc:
                raise PdfError(f"{path.name}: page {index + 1} cannot be read ({_describe(exc)})") from None
            if check_page is not None:
                check_page(index + 1, raw_layers[-1])
        results: list[PageText | None] = [None] * doc.page_count
        for index, layer in enumerate(raw_layers):
            # plenty of real text: settled without looking at the page's drawings
            if engine.mode != "force" and has_letters(layer, FIGURE_CAPTION_LETTERS) and not is_garbage(layer):
                results[index] = PageText(layer, TEXT)
        # The pages left are decided now, before any is read: those that need no OCR
        # (a short text layer without a picture, a blank page) are settled, and the
        # backlog counts only the pages Tesseract will read (it counted them all: a
        # digital report of short pages said "6 to read by OCR", and read none).
        plain = [r.text for r in results if r is not None]
        queue: list[_Ahead] = []  # in page order: each page to render and read
        for index in (i for i, r in enumerate(results) if r is None):
            decided = _decide(doc, index, engine, raw_layers[index])
            if isinstance(decided.prepared, PageText):
                results[index] = decided.prepared
            else:
                queue.append(decided)
        # The document prior: the language of its readable pages guides the OCR of
        # the others; a document with none takes the first confident OCR'd page's.
        prior = _majority_language(detector, plain) if queue and engine.enabled else None
        workers = engine.parallel if engine.enabled else 1
        backlog = on_ocr_backlog if engine.enabled and queue else None
        if backlog is not None:
            backlog(OcrBacklog(doc.page_count, len(queue)))
        # Pages are rendered ahead (at most this many in memory) and read by up to
        # `workers` Tesseract processes at once; they are finished in page order, so
        # the results, check_page and on_ocr_page are those of one page after another.
        depth = 1 if workers == 1 else 2 * workers
        t_start = time.perf_counter()
        with TesseractPool(engine, workers) as pool:  # leaving it, on an error too, kills what still runs
            ahead: deque[_Ahead] = deque()
            position = 0  # in queue: the next page to render
            guessing = False  # an OCR'd page left the prior unknown: read ahead without it
            while ahead or position < len(queue):
                # Until the prior is known, the first page OCR'd goes alone (it usually
                # sets it); pages read without it are read again once it shows.
                reading = depth if prior or guessing else 1
                languages = engine.languages_for(prior) if engine.enabled else ""  # disabled: nothing is rendered
                while True:  # each page goes to Tesseract as soon as it is rendered
                    _hand_over(islice(ahead, reading), pool, languages)
                    if position == len(queue) or len(ahead) == depth:
                        break
                    ahead.append(_render(doc, queue[position], engine))
                    position += 1
                page = ahead.popleft()
                try:
                    read, lang = _read(page, engine, pool, detector, prior)
                except Exception as exc:  # loading or rendering a damaged page
                    raise PdfError(f"{path.name}: page {page.index + 1} cannot be read ({_describe(exc)})") from None
                page_ocr_seconds += read.seconds
                prior = prior or lang
                guessing = guessing or (prior is None and page.run is not None)
                results[page.index] = read
                if check_page is not None and read.source == OCR:
                    check_page(page.index + 1, read.text)
                if read.source == OCR and on_ocr_page:
                    on_ocr_page(read)
                if backlog is not None:
                    backlog(OcrBacklog(doc.page_count, len(queue) - position + len(ahead)))
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
    caption_only = [r.problem for r in results if r.source == TEXT and r.problem]
    # wall-clock time of the OCR (pages read at once count once), when any page was read
    ocr_wall = time.perf_counter() - t_start if page_ocr_seconds > 0 else 0.0
    return Document(doc_id=doc_id, pages=pages, source=path.name, ocr_seconds=ocr_wall,
                    ocr_problem=(problems or caption_only or [""])[0], caption_only_pages=len(caption_only))


@dataclass
class _Ahead:
    """A page that needs more than its text layer: decided, then rendered ahead of its turn."""

    index: int
    prepared: PageText | ToRead | Rendered | None = None  # PageText: settled without Tesseract (not queued)
    run: TesseractRun | None = None  # Tesseract's first reading of a Rendered page, once handed over
    error: Exception | None = None  # PyMuPDF failed on it: raised at its turn, after the pages before it


def _decide(doc: pymupdf.Document, index: int, engine: OcrEngine, layer: str) -> _Ahead:
    try:
        return _Ahead(index, decide_page(doc.load_page(index), engine, layer))
    except Exception as exc:  # a damaged page
        return _Ahead(index, error=exc)


def _render(doc: pymupdf.Document, page: _Ahead, engine: OcrEngine) -> _Ahead:
    if isinstance(page.prepared, ToRead):
        try:
            page.prepared = render_page(doc.load_page(page.index), engine, page.prepared)
        except Exception as exc:  # a damaged page
            page.error = exc
    return page


def _hand_over(pages: Iterable[_Ahead], pool: TesseractPool, languages: str) -> None:
    """Rendered pages go to Tesseract with ``languages``; one read with others (the
    prior was not known then) is read again."""
    for page in pages:
        if isinstance(page.prepared, Rendered) and (page.run is None or page.run.languages != languages):
            if page.run is not None:
                pool.cancel(page.run)
            page.run = pool.submit(page.prepared.image, languages)


def _read(page: _Ahead, engine: OcrEngine, pool: TesseractPool, detector: LanguageDetector,
          prior: str | None) -> tuple[PageText, str | None]:
    """The page's text, and its language where OCR read it and it is clear."""
    if page.error is not None:
        raise page.error
    assert isinstance(page.prepared, Rendered) and page.run is not None  # handed over before its turn
    read = read_rendered(page.prepared, engine, pool, page.run)
    if read.source != OCR:
        return read, None
    lang, prob = detector.detect_page(clean_text(read.text))
    lang = lang if prob >= CONFIDENT else None
    if lang and lang != prior and engine.languages_for(lang) != read.languages:
        # a page in another language than the document's (a French certificate in an
        # English report): read again in its own, from the same render, ahead of the
        # pages read ahead (they wait for this one)
        rendered = replace(page.prepared, seconds=0.0)
        run = pool.submit(rendered.image, engine.languages_for(lang), first=True)
        again = read_rendered(rendered, engine, pool, run)
        best = again if again.source == OCR and (again.confidence or 0) >= (read.confidence or 0) else read
        read = replace(best, seconds=read.seconds + again.seconds)  # the page cost both
    return read, lang


def _majority_language(detector: LanguageDetector, texts: list[str]) -> str | None:
    if not texts:
        return None
    langs = [lang for lang in detector.detect_pages([clean_text(t) for t in texts]) if lang]
    return Counter(langs).most_common(1)[0][0] if langs else None


def _final_source(source: str, cleaned: str) -> str:
    # a text layer that cleaning reduced to nothing (stray marks) is no text at all
    return NONE if source == TEXT and not cleaned else source


def _describe(exc: BaseException) -> str:
    """A page error in words: out of memory (the extraction worker's limit, see
    indexer/worker.py) or damaged content; never PyMuPDF's own text."""
    text = str(exc).lower()
    if isinstance(exc, MemoryError) or any(w in text for w in ("malloc", "calloc", "realloc", "out of memory")):
        return "out of memory"
    return "damaged or unsupported page content"
