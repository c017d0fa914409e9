"""Marks the query's keywords on a rendered page (``?highlight=`` of the PNG endpoint).

The terms arrive already chosen by the caller (the analysts' page sends the
keywords of question + answer); here they are only tokenised and normalised
like the index (``12,450`` ~ ``12450``) and matched against the page's words with
the snippet's rule: numbers exactly, words by their first six characters (so
"emission" marks "emissions"). Bounded: at most ``MAX_TERMS`` terms and
``MAX_MARKS`` marked words per page; nothing is written back to the PDF.
"""

from __future__ import annotations

import unicodedata

from evidentia.text import normalise_numbers, tokens

MAX_HIGHLIGHT_CHARS = 500
MAX_TERMS = 32
MAX_MARKS = 500
STEM = 6


def highlight_terms(raw: str | None) -> list[str]:
    """Distinct tokens of ``raw`` (single letters dropped), at most MAX_TERMS. Of a
    word that holds a figure only the figure counts: ``US$100`` marks 100, not
    every ``US$`` amount on the page."""
    seen: dict[str, None] = {}
    for word in normalise_numbers((raw or "")[:MAX_HIGHLIGHT_CHARS]).split():
        found = tokens(word)
        figures = [t for t in found if t[:1].isdigit()]
        for tok in figures or found:
            if len(tok) == 1 and not tok.isdigit():
                continue
            seen.setdefault(tok, None)
            if len(seen) >= MAX_TERMS:
                return list(seen)
    return list(seen)


def _folded(word: str) -> str:
    """Accents off (the web page's keywords.js does the same): "ecart" marks "écart"."""
    return "".join(c for c in unicodedata.normalize("NFD", word) if not unicodedata.combining(c))


def _matcher(terms: list[str]):
    numbers = {t for t in terms if t[:1].isdigit()}
    stems = {_folded(t)[:STEM] for t in terms if not t[:1].isdigit()}

    def matches(word: str) -> bool:
        # "48.300" is 48300 on a German page, 48.3 on an English one: either reading marks it
        readings = {normalise_numbers(word), normalise_numbers(word, continental=True)}
        for tok in (t for reading in readings for t in tokens(reading)):
            if (tok in numbers) if tok[:1].isdigit() else (_folded(tok)[:STEM] in stems):
                return True
        return False

    return matches


def mark_page(page, terms: list[str]) -> int:
    """Adds one highlight annotation covering the page's words that match
    ``terms`` (a PyMuPDF page, in memory only); returns the number of words marked."""
    if not terms:
        return 0
    import pymupdf

    matches = _matcher(terms)
    rects = []
    for x0, y0, x1, y1, word, *_ in page.get_text("words"):
        if matches(word):
            rects.append(pymupdf.Rect(x0, y0, x1, y1))
            if len(rects) >= MAX_MARKS:
                break
    if rects:
        page.add_highlight_annot(rects)
    return len(rects)
