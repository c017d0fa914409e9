"""Question + answer -> the one ``Query`` record every stage reads."""

from __future__ import annotations

from evidentia.language import LanguageDetector, has_english_function_words
from evidentia.records import Query
from evidentia.text import keywords


def query_text(question: str, answer: str) -> str:
    """Question and answer as one text: what the encoders and rerankers read."""
    return f"{question.strip()} {answer.strip()}".strip()


def build_query(question: str, answer: str, detector: LanguageDetector | None = None) -> Query:
    """The query record: stop words of the detected language (and of English, unless the
    text is in another language and holds none of English's own) removed from the
    keywords, numbers normalised as at index time, no phrase matching. A question too
    short for langdetect's usual reading ("Quelle est la part des femmes ?") gets
    LanguageDetector.short_text_language's. Outside English, a figure whose reading
    depends on the language ("48.300", "12 450") is searched both ways: the pages were
    indexed in their own language's reading, and the answer may be written either way."""
    text = query_text(question, answer)
    language = None
    if detector is not None:
        language, _ = detector.detect_with_probability(text, full=True)
        if language is None:
            language = detector.short_text_language(text)
    # "part", "plus", "site" are English stop words and French content words
    english = language in (None, "en") or has_english_function_words(text)
    found = keywords(text, language, english_stops=english)
    if language != "en":
        found += [k for k in keywords(text, language, english_stops=english, continental=True) if k not in found]
    return Query(question=question.strip(), answer=answer.strip(), text=text, language=language,
                 keywords=tuple(found))
