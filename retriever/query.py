"""Question + answer -> keyword query."""

from __future__ import annotations

from dataclasses import dataclass

from evidentia.indexer.language import LanguageDetector
from evidentia.text import keywords


@dataclass(frozen=True)
class KeywordQuery:
    text: str
    language: str | None
    keywords: tuple[str, ...]


def build_query(question: str, answer: str, detector: LanguageDetector | None = None) -> KeywordQuery:
    """Keywords of question and answer: stop words of the detected language (and
    English) removed, numbers normalised as at index time, no phrase matching."""
    text = f"{question} {answer}".strip()
    language = None
    if detector is not None:
        language, _ = detector.detect_with_probability(text, full=True)
    return KeywordQuery(text=text, language=language, keywords=tuple(keywords(text, language)))
