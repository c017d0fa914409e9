"""Text normalisation shared by indexing and querying.

Everything that must be identical on both sides of a BM25 match lives here:
cleaning, number normalisation, keyword extraction and the supported languages.
"""

from __future__ import annotations

import json
import re
import unicodedata
from functools import lru_cache

# Languages analysed with their own stemmer (ISO 639-1 -> Snowball / Elasticsearch name).
LANGUAGES: dict[str, str] = {
    "en": "english",
    "fr": "french",
    "de": "german",
    "es": "spanish",
    "it": "italian",
    "pt": "portuguese",
    "nl": "dutch",
    "sv": "swedish",
    "da": "danish",
    "no": "norwegian",
    "fi": "finnish",
}

# Python twin of the tantivy regex tokenizer in retriever/tantivy_backend.py:
# a number with an optional decimal part, or a run of letters/digits.
TOKEN_RE = re.compile(r"\d+(?:\.\d+)?|[^\W_]+")

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")
# A word broken across lines ("emis-\nsions") is re-joined, except before a
# conjunction, where the hyphen is a suspended compound ("Wind-\nund Solarenergie").
_HYPHEN_BREAK = re.compile(r"(\w)-\n(?!(?:und|oder|bzw|and|or|et|ou|y|o|e|en|of)\b)(\w)")
_SPACES = re.compile(r"[ \t\u00a0\u2000-\u200b\u202f\u205f\u3000]+")
_BLANK_LINES = re.compile(r"\n\s*\n+")


# French and other typesetting group digits with no-break or thin spaces ("1 577");
# NFKC turns those into plain spaces, after which "577 373" could as well be two
# table columns, so the groups are joined before normalisation.
_TYPOGRAPHIC_GROUP = re.compile(r"(?<=\d)[\u00a0\u202f\u2009](?=\d{3}(?!\d))")


def clean_text(raw: str) -> str:
    """Readable text: unicode normalised, words re-joined across line-end hyphens,
    control characters and runs of blanks removed, paragraphs kept as blank lines."""
    # The `in` checks are C-speed scans that skip most regex passes on most pages.
    text = _TYPOGRAPHIC_GROUP.sub("", raw) if ("\u00a0" in raw or "\u202f" in raw or "\u2009" in raw) else raw
    text = unicodedata.normalize("NFKC", text)
    text = _CONTROL.sub(" ", text)
    if "-\n" in text:
        text = _HYPHEN_BREAK.sub(r"\1\2", text)
    text = _SPACES.sub(" ", text)
    text = "\n".join(line.strip() for line in text.split("\n"))
    text = _BLANK_LINES.sub("\n\n", text)
    return text.strip()


# --- numbers -------------------------------------------------------------------
# Figures are written differently in answers and documents: "$1577.00" against
# "1,577", "12.5%" against "12.5 %", "12,5" (French) or "1.577.000" (German).
# Both sides are rewritten to one canonical token: no grouping, "." as decimal
# mark, no trailing zero decimals. Currency and percent signs need no work: the
# tokenizers of both backends drop them ("$1577" and "12.5%" give 1577 and 12.5).
# Only numbers with a separator are touched, in one regex pass.
_SEPARATED_NUMBER = re.compile(r"(?<![\d.,])\d+(?:[.,]\d+)+(?![\d])")
_US_GROUPED = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_EU_GROUPED = re.compile(r"\d{1,3}(?:\.\d{3})+(?:,\d+)?")
_SIMPLE_DECIMAL = re.compile(r"\d+[.,]\d+")
# Digits grouped by plain spaces ("12 450", "1 577,5"): French, and continental tables
# once NFKC or the PDF has made a no-break space plain. Read so in those languages only:
# in English text "Scope 1 450" is more likely two numbers.
_SPACE_GROUPED = re.compile(r"(?<![\d.,])\d{1,3}(?: \d{3})+(?![\d]|[.,]\d{3})")

# Languages that write forty-eight thousand three hundred "48.300" (or "48 300"), where
# English reads 48.3: every analysed language but English. German, Spanish, Italian,
# Dutch and Portuguese reports put a dot between thousands; one group alone ("48.300
# Tonnen") read as 48.3 never met an answer's "48,300".
CONTINENTAL = frozenset(LANGUAGES) - {"en"}
_ONE_GROUP = re.compile(r"\d{1,3}[.,]\d{3}")  # "48.300", "12,450": a figure whose reading is the language's


def canonical_number(token: str, continental: bool = False) -> str:
    """One number with separators -> its canonical form (see above); ``continental``:
    the text is in a CONTINENTAL language, where "48.300" is 48300. There a figure of one
    group ("48.300", "12,450") is both its readings, "48300 48.3": German prints 48.300 for
    thousands, a French "12,450" is a decimal, and an English answer copied from either
    ("1.250 m3" for the German page's 1.250 Kubikmeter) meets the page either way."""
    if continental and _ONE_GROUP.fullmatch(token):
        whole, frac = token[:-4], token[-3:]
        # "2.000" is two thousand: its reading as 2 would meet every "Scope 2"
        return f"{whole}{frac}" if frac == "000" else f"{whole}{frac} {canonical_number(f'{whole}.{frac}')}"
    if _US_GROUPED.fullmatch(token):
        value = token.replace(",", "")
    elif _EU_GROUPED.fullmatch(token) and (token.count(".") >= 2 or "," in token):
        value = token.replace(".", "").replace(",", ".")
    elif _SIMPLE_DECIMAL.fullmatch(token):
        # "1,577" is a thousands group (three digits after one comma); "12,5" a decimal comma
        whole, _, frac = token.replace(",", ".").partition(".")
        value = whole + frac if ("," in token and len(frac) == 3) else f"{whole}.{frac}"
    else:
        return token  # dates, versions, section numbers: leave alone
    if "." in value:
        value = value.rstrip("0").rstrip(".")
    return value


def normalise_numbers(text: str, continental: bool = False) -> str:
    """Numbers with separators in their canonical form; ``continental`` (the text is in a
    CONTINENTAL language): "48.300" and "12 450" are thousands, 48300 and 12450."""
    if continental and " " in text:
        text = _SPACE_GROUPED.sub(lambda m: m.group(0).replace(" ", ""), text)
    return _SEPARATED_NUMBER.sub(lambda m: canonical_number(m.group(0), continental), text)


def search_text(clean: str, language: str | None = None) -> str:
    """The form of a page's text that goes into the BM25 index, its figures read as its
    ``language`` writes them."""
    return normalise_numbers(clean, language in CONTINENTAL)


def tokens(text: str) -> list[str]:
    """Lower-cased word and number tokens of already-normalised text."""
    return TOKEN_RE.findall(text.lower())


# langdetect's codes that the stop-words package spells differently.
_STOP_WORD_CODES = {"no": "nb"}


@lru_cache(maxsize=None)
def stop_words(language: str) -> frozenset[str]:
    from stop_words import StopWordError, get_stop_words

    try:
        return frozenset(w.lower() for w in get_stop_words(_STOP_WORD_CODES.get(language, language)))
    except StopWordError:
        return frozenset()


def keywords(text: str, language: str | None, english_stops: bool = True, continental: bool = False) -> list[str]:
    """Distinct non-stop-word tokens of ``text`` in first-seen order.

    English stop words are removed as well (``english_stops``): questions are often
    English even when the answer or the documents are not. ``continental``: figures
    read as a CONTINENTAL language writes them (normalise_numbers).
    """
    stops = (stop_words("en") if english_stops else frozenset()) | (stop_words(language) if language else frozenset())
    seen: dict[str, None] = {}
    for tok in tokens(normalise_numbers(text, continental)):
        if tok in stops or (len(tok) == 1 and not tok.isdigit()):
            continue
        seen.setdefault(tok, None)
    return list(seen)


def listed(items, limit: int = 10, sep: str = ", ") -> str:
    """The first ``limit`` of ``items`` for a message, the rest counted: "a, b and 3 more"
    (``sep`` "; ": "a; b; and 3 more")."""
    items = list(items)
    head = sep.join(items[:limit])
    if len(items) <= limit:
        return head
    joint = " and" if sep == ", " else f"{sep.rstrip()} and"
    return f"{head}{joint} {len(items) - limit} more"


# JSON leaves these raw with ensure_ascii=False, and a reader that splits lines the
# way str.splitlines() does (most do, outside the JSON Lines spec) breaks a record
# on them; escaped, a line is one record for every reader (control characters below
# U+0020 are escaped by JSON itself).
_LINE_BREAKS_JSON_KEEPS = {"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def json_line(obj) -> str:
    """``obj`` as one line of a JSON Lines file, UTF-8 text kept readable."""
    line = json.dumps(obj, ensure_ascii=False)
    for raw, escaped in _LINE_BREAKS_JSON_KEEPS.items():
        line = line.replace(raw, escaped)
    return line
