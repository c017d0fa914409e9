"""Short snippets around the query's keywords, the same for every backend."""

from __future__ import annotations

import re
from typing import Sequence

from evidentia.text import CONTINENTAL, normalise_numbers, tokens

_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+|\n+")


def make_snippet(text: str, keywords: Sequence[str], width: int = 240, language: str | None = None) -> str:
    """The ``width``-character stretch of ``text`` with the most distinct keyword
    hits (prefix match, so "emissions" also finds "emission"), its figures read as its
    ``language`` writes them (as the index reads them: text.search_text)."""
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    stems = {k[:6] for k in keywords if len(k) > 2 or k.isdigit()}
    continental = language in CONTINENTAL
    pieces = [p for p in _SENTENCE_END.split(text) if p]
    best_start, best_hits, pos = 0, -1, 0
    starts = []
    for piece in pieces:
        found = text.find(piece, pos)
        if found >= 0:
            starts.append(found)
            pos = found + len(piece)
    for start in starts or [0]:
        window = text[start : start + width]
        hits = len({t[:6] for t in tokens(normalise_numbers(window, continental))} & stems)
        if hits > best_hits:
            best_start, best_hits = start, hits
    snippet = text[best_start : best_start + width]
    cut = snippet.rfind(" ")
    if best_start + width < len(text) and cut > width // 2:
        snippet = snippet[:cut]
    prefix = "…" if best_start > 0 else ""
    suffix = "…" if best_start + len(snippet) < len(text) else ""
    return f"{prefix}{snippet}{suffix}"
