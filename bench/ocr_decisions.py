"""Which pages the indexer sends to Tesseract, and why, over a set of PDFs.

For every page of every PDF under the given paths, ``indexer.ocr.ocr_reason``
(no Tesseract run): ``junk`` (a text layer of glyph junk), ``scan`` (almost no
text on a page that looks scanned), ``figure`` (a caption under a figure printed
as an image: fewer than FIGURE_CAPTION_LETTERS letters, images over half the
page), or none. Printed: the counts, and each figure page with its caption's
word count.

``--read`` then extracts, with OCR on (this machine's Tesseract), each document
that has a figure page, and prints each such page's source and word count after
reading (``ocr`` where the reading replaced the caption, ``text`` where it did
not read twice the caption's letters: a photo) and the document's extraction
time, with the figure rule and without it (``FIGURE_CAPTION_LETTERS`` set to
``SHORT_TEXT_LETTERS``, the rule before it).

    python bench/ocr_decisions.py ../shared/data --read
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path
from unittest import mock

import pymupdf

from evidentia.indexer import ocr, pdf
from evidentia.language import LanguageDetector


def pdf_paths(roots: list[Path]) -> list[Path]:
    out: list[Path] = []
    for root in roots:
        out += sorted(root.rglob("*.pdf")) if root.is_dir() else [root]
    return out


def reasons(path: Path) -> list[str | None]:
    """``ocr_reason`` of each page of ``path``."""
    with pymupdf.open(path) as doc:
        return [ocr.ocr_reason(page, page.get_text("text", sort=False)) for page in doc]


def read(path: Path, engine: ocr.OcrEngine, figures: bool) -> tuple[list, float]:
    """The document's pages extracted with OCR on, and the seconds it took;
    ``figures`` False: as before the figure rule."""
    limit = ocr.FIGURE_CAPTION_LETTERS if figures else ocr.SHORT_TEXT_LETTERS
    with mock.patch.object(ocr, "FIGURE_CAPTION_LETTERS", limit), \
            mock.patch.object(pdf, "FIGURE_CAPTION_LETTERS", limit):
        t0 = time.perf_counter()
        document = pdf.extract_pages(path, path.stem, LanguageDetector(), ocr=engine)
        return document.pages, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+", type=Path, help="PDF files or folders (searched recursively)")
    ap.add_argument("--read", action="store_true", help="extract the documents with figure pages, OCR on")
    args = ap.parse_args()
    paths = pdf_paths(args.paths)
    counts: Counter = Counter()
    figures: dict[Path, list[int]] = {}
    for path in paths:
        page_reasons = reasons(path)
        counts.update(r or "text" for r in page_reasons)
        pages = [i + 1 for i, r in enumerate(page_reasons) if r == "figure"]
        if pages:
            figures[path] = pages
    total = sum(counts.values())
    kinds = ", ".join(f"{k} {counts[k]}" for k in ("text", "scan", "junk", "figure"))
    print(f"{len(paths)} PDFs, {total} pages: {kinds}")
    for path, pages in figures.items():
        with pymupdf.open(path) as doc:
            for n in pages:
                print(f"  figure: {path.name} p{n}: caption of {len(doc[n - 1].get_text().split())} words, "
                      f"images cover {ocr.image_cover(doc[n - 1]):.0%}")
    if not args.read:
        return
    engine = ocr.OcrEngine.probe()
    if not engine.available:
        raise SystemExit(f"--read needs Tesseract: {engine.problem}")
    for path, pages in figures.items():
        before, t_before = read(path, engine, figures=False)
        after, t_after = read(path, engine, figures=True)
        print(f"{path.name}: extracted in {t_before:.1f} s without the figure rule, {t_after:.1f} s with it")
        for n in pages:
            old, new = before[n - 1], after[n - 1]
            print(f"  p{n}: {old.text_source} {len(old.text.split())} words -> {new.text_source} "
                  f"{len(new.text.split())} words: {' '.join(new.text.split()[:25])}")


if __name__ == "__main__":
    main()
