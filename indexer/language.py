"""Page language detection with langdetect, fast and deterministic.

langdetect costs about 8 ms on a full page (its cost grows with the text: every
character n-gram is extracted before sampling), more than PyMuPDF takes to
extract the page. A few hundred letters are enough to tell the languages we
index apart, so each page is probed on a short excerpt of its letters; pages
whose probe is inconclusive take the document's majority language (the
per-document prior), since mixed-language PDFs are rare and mostly bilingual by
section, not by line.
"""

from __future__ import annotations

import re
from collections import Counter

from langdetect.detector_factory import PROFILES_DIRECTORY, DetectorFactory
from langdetect.lang_detect_exception import LangDetectException

# Fewer letters than this and langdetect's answer is noise.
MIN_LETTERS = 40
# Probes whose best language is less likely than this fall back to the document prior.
CONFIDENT = 0.80

_NON_LETTERS = re.compile(r"[^\w\s]|[\d_]+")
_WS = re.compile(r"\s+")


class LanguageDetector:
    """A seeded langdetect factory of our own, so results are reproducible and no
    global state of the langdetect module is touched."""

    def __init__(self, probe_chars: int = 400, seed: int = 0) -> None:
        self.probe_chars = probe_chars
        self._factory = DetectorFactory()
        self._factory.load_profile(PROFILES_DIRECTORY)
        self._factory.set_seed(seed)

    def probe(self, text: str) -> str:
        """Letters-only excerpt from the middle of the page, where headers,
        footers and tables of figures are least likely."""
        letters = _WS.sub(" ", _NON_LETTERS.sub(" ", text)).strip()
        if len(letters) <= self.probe_chars:
            return letters
        start = (len(letters) - self.probe_chars) // 2
        # start on a word boundary so the probe holds no word fragments
        space = letters.find(" ", start)
        start = space + 1 if 0 <= space < start + 40 else start
        return letters[start : start + self.probe_chars]

    def detect_with_probability(self, text: str, full: bool = False) -> tuple[str | None, float]:
        sample = _WS.sub(" ", _NON_LETTERS.sub(" ", text)).strip() if full else self.probe(text)
        if sum(ch.isalpha() for ch in sample) < MIN_LETTERS:
            return None, 0.0
        detector = self._factory.create()
        detector.append(sample)
        try:
            best = detector.get_probabilities()
        except LangDetectException:
            return None, 0.0
        if not best:
            return None, 0.0
        return _short_code(best[0].lang), float(best[0].prob)

    def detect(self, text: str) -> str | None:
        return self.detect_with_probability(text)[0]

    def detect_pages(self, texts: list[str]) -> list[str | None]:
        """Languages of a document's pages, with the document prior applied."""
        guesses = [self.detect_with_probability(t) for t in texts]
        confident = Counter(lang for lang, prob in guesses if lang and prob >= CONFIDENT)
        prior = confident.most_common(1)[0][0] if confident else None
        out: list[str | None] = []
        for lang, prob in guesses:
            if lang is not None and prob < CONFIDENT and prior is not None:
                lang = prior
            out.append(lang)
        return out


def _short_code(lang: str) -> str:
    # langdetect says "zh-cn"/"zh-tw"; keep the ISO 639-1 part
    return lang.split("-")[0]
