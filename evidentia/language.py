"""Page language detection with langdetect, fast and deterministic.

langdetect costs about 5-8 ms on a full page (every character n-gram is
extracted, then up to thousands of sampling steps), more than PyMuPDF takes to
extract the page. Three measures keep it from dominating indexing:

1. a stop-word vote first: a page with enough function words that belong to
   one indexed language and to no other ("the", "und", "les", "het") is that
   language. A set lookup per word costs microseconds and settles nearly every
   page of running text;
2. pages the vote cannot settle (tables, short or unusual text, languages we do
   not stem) go to langdetect on a short probe of their letters, not the full page;
3. pages whose probe is still inconclusive take the document's majority
   language (the per-document prior).

bench/bench_bm25.py reports the agreement with full-page langdetect and the cost.
"""

from __future__ import annotations

import re
from collections import Counter

from langdetect.detector_factory import PROFILES_DIRECTORY, DetectorFactory
from langdetect.lang_detect_exception import LangDetectException

from evidentia.text import LANGUAGES, stop_words, tokens

# Fewer letters than this and langdetect's answer is noise.
MIN_LETTERS = 40
# Probes whose best language is less likely than this fall back to the document prior.
CONFIDENT = 0.80

# A text shorter than MIN_LETTERS (a question asked alone) is read by langdetect only
# with this many letters and this sure of the answer (short_text_language).
SHORT_MIN_LETTERS = 15
SHORT_CONFIDENT = 0.99

# Stop-word vote: at least this many distinctive stop words, and this many times
# more than the runner-up language.
VOTE_MIN_HITS = 6
VOTE_MARGIN = 3.0
VOTE_CHARS = 1500

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
        self._distinctive = _distinctive_stop_words()

    def vote(self, text: str) -> str | None:
        """The language whose distinctive stop words dominate, or None if unclear."""
        counts: Counter[str] = Counter()
        for tok in tokens(text[:VOTE_CHARS]):
            lang = self._distinctive.get(tok)
            if lang:
                counts[lang] += 1
        if not counts:
            return None
        (best, n), *rest = counts.most_common(2) + [("", 0)]
        runner_up = rest[0][1]
        if n >= VOTE_MIN_HITS and n >= VOTE_MARGIN * runner_up:
            return best
        return None

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

    def short_text_language(self, text: str) -> str | None:
        """The language of a text too short for detect_with_probability (a questionnaire
        question: "Quelle est la part des femmes ?"), where langdetect is sure of it: at
        least SHORT_MIN_LETTERS letters, probability SHORT_CONFIDENT, an analysed language,
        and none of English's own function words for another language. Keyword-style
        English ("Net zero target") is the risk: langdetect read it as Dutch at 0.99996;
        it has too few letters here, and a misread one loses only stop words."""
        sample = _WS.sub(" ", _NON_LETTERS.sub(" ", text)).strip()
        if sum(ch.isalpha() for ch in sample) < SHORT_MIN_LETTERS:
            return None
        detector = self._factory.create()
        detector.append(sample)
        try:
            best = detector.get_probabilities()
        except LangDetectException:
            return None
        if not best or best[0].prob < SHORT_CONFIDENT:
            return None
        lang = _short_code(best[0].lang)
        if lang not in LANGUAGES or (lang != "en" and has_english_function_words(text)):
            return None
        return lang

    def detect(self, text: str) -> str | None:
        return self.detect_with_probability(text)[0]

    def detect_page(self, text: str) -> tuple[str | None, float]:
        """Vote first, langdetect on a probe when the vote is unclear."""
        voted = self.vote(text)
        if voted is not None:
            return voted, 1.0
        return self.detect_with_probability(text)

    def detect_pages(self, texts: list[str]) -> list[str | None]:
        """Languages of a document's pages, with the document prior applied."""
        guesses = [self.detect_page(t) for t in texts]
        confident = Counter(lang for lang, prob in guesses if lang and prob >= CONFIDENT)
        prior = confident.most_common(1)[0][0] if confident else None
        out: list[str | None] = []
        for lang, prob in guesses:
            # a page too short to read (lang None) keeps none: given the document's language,
            # covers and title pages ("2023 Lloyds sustainability report") matched in the stemmed
            # field too and came first, hybrid's P@1 on the printed reports 0.843 -> 0.745
            # (docs/BENCHMARKS.md 8ar)
            if lang is not None and prob < CONFIDENT and prior is not None:
                lang = prior
            out.append(lang)
        return out


def _distinctive_stop_words() -> dict[str, str]:
    """Stop word -> language, for words that are stop words of one indexed language only."""
    owner: dict[str, str] = {}
    shared: set[str] = set()
    for lang in LANGUAGES:
        for word in stop_words(lang):
            if len(word) < 2:
                continue
            if word in owner and owner[word] != lang:
                shared.add(word)
            owner.setdefault(word, lang)
    return {w: lang for w, lang in owner.items() if w not in shared}


# Function words only English writes. Not the English stop list's words that are content
# words elsewhere ("part", "plus", "site" in French), nor those other analysed languages
# share ("was", "will", "an" German; "of", "had" Dutch; "for", "by" Danish and Norwegian).
ENGLISH_FUNCTION_WORDS = frozenset(
    "the and with from what which who how does did are were have been there would should this that these those "
    "their our your its any".split())


def has_english_function_words(text: str) -> bool:
    """Whether ``text`` holds a word of ENGLISH_FUNCTION_WORDS ("the", "what", "were")."""
    return any(tok in ENGLISH_FUNCTION_WORDS for tok in tokens(text))


def _short_code(lang: str) -> str:
    # langdetect says "zh-cn"/"zh-tw"; keep the ISO 639-1 part
    return lang.split("-")[0]
