"""Question + answer -> the one ``Query`` record every stage reads."""

from __future__ import annotations

from evidentia.language import LanguageDetector
from evidentia.records import Query
from evidentia.text import keywords


def query_text(question: str, answer: str) -> str:
    """Question and answer as one text: what the encoders and rerankers read."""
    return f"{question.strip()} {answer.strip()}".strip()


def build_query(question: str, answer: str, detector: LanguageDetector | None = None) -> Query:
    """The query record: stop words of the detected language (and English)
    removed from the keywords, numbers normalised as at index time, no phrase matching."""
    text = query_text(question, answer)
    language = None
    if detector is not None:
        language, _ = detector.detect_with_probability(text, full=True)
    return Query(question=question.strip(), answer=answer.strip(), text=text, language=language,
                 keywords=tuple(keywords(text, language)))
