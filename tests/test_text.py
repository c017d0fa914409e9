"""Text normalisation shared by indexing and querying, and query building."""

from __future__ import annotations

import json

import pytest

from evidentia.retriever.query import build_query
from evidentia.text import LANGUAGES, clean_text, keywords, normalise_numbers, search_text, stop_words, tokens


def number_tokens(text: str) -> list[str]:
    """What BM25 sees of a figure, on either side of the match."""
    return tokens(normalise_numbers(text))


# --- clean_text ------------------------------------------------------------------


def test_clean_text_rejoins_words_hyphenated_at_line_end():
    assert clean_text("total emis-\nsions of green-\nhouse gas") == "total emissions of greenhouse gas"


def test_clean_text_keeps_real_hyphens():
    assert clean_text("a science-based target\nand well- known") == "a science-based target\nand well- known"


def test_clean_text_collapses_blanks_and_keeps_paragraphs():
    raw = "  Scope 1 \t  emissions  \n   fell   \n\n\n\n  Scope   2\n \n"
    assert clean_text(raw) == "Scope 1 emissions\nfell\n\nScope 2"


def test_clean_text_nfkc_ligatures_and_width():
    assert clean_text("the ﬁnal eﬀort, ﬂows and ｆｕｌｌ－ｗｉｄｔｈ １２３") == "the final effort, flows and full-width 123"


def test_clean_text_joins_typographic_digit_groups():
    # French typesetting: narrow no-break / no-break / thin spaces between groups
    assert clean_text("1\u202f577\u00a0373 tonnes") == "1577373 tonnes"
    assert clean_text("12\u2009450 t") == "12450 t"
    # not a group of three digits: the no-break space becomes an ordinary space
    assert clean_text("en 2023\u00a012 sites") == "en 2023 12 sites"
    assert clean_text("Scope\u00a01") == "Scope 1"


def test_clean_text_removes_control_characters():
    assert clean_text("CO\x002 e\x07mis\ufffdsions\x7f") == "CO 2 e mis sions"


def test_clean_text_empty_and_idempotent():
    assert clean_text("") == ""
    assert clean_text(" \n\t\n ") == ""
    raw = "Intro-\nduction\u00a0: 1\u202f000 t\n\n\nﬁn  "
    once = clean_text(raw)
    assert once == "Introduction : 1000 t\n\nfin"
    assert clean_text(once) == once


# --- normalise_numbers: the same token on both sides ------------------------------


@pytest.mark.parametrize(
    "answer, document, token",
    [
        ("$1577.00", "1,577", "1577"),
        ("$1,577.00", "USD 1577", "1577"),
        ("12.5%", "12.5 %", "12.5"),
        ("12.5%", "12,5 %", "12.5"),  # French decimal comma
        ("12,5%", "12.50 %", "12.5"),
        ("1,577,000.50", "1.577.000,50", "1577000.5"),  # German grouping
        ("1577.5", "€1.577,50", "1577.5"),
        ("12450 tCO2e", "12,450 tonnes", "12450"),
        ("100,000.00", "100000", "100000"),
        ("20.0%", "20 %", "20"),
        ("0.50", "0.5", "0.5"),
    ],
)
def test_numbers_match_across_notations(answer, document, token):
    a, d = number_tokens(answer), number_tokens(document)
    assert token in a and token in d
    assert [t for t in a if t[0].isdigit()] == [t for t in d if t[0].isdigit()] == [token]


@pytest.mark.parametrize(
    "text, token",
    [
        ("revenue was $1,577.00, up 4 %", "1577"),
        ("revenue was $1,577.00.", "1577"),
        ("emissions fell to 12,450.5, down", "12450.5"),
        ("the total was 1,577, the year before", "1577"),
        ("Umsatz: 1.577.000,50.", "1577000.5"),
        ("Umsatz: 1.577,50, davon", "1577.5"),
        ("un taux de 12,5.", "12.5"),
        ("un taux de 12,5, en hausse", "12.5"),
    ],
)
def test_numbers_followed_by_sentence_punctuation(text, token):
    assert [t for t in number_tokens(text) if t[0].isdigit()][0] == token


def test_currency_and_percent_signs_do_not_stick_to_numbers():
    assert number_tokens("$1577") == ["1577"]
    assert number_tokens("€12,50") == ["12.5"]
    assert number_tokens("£1,577.00") == ["1577"]
    assert number_tokens("12.5%") == ["12.5"]
    assert number_tokens("(12,5 %)") == ["12.5"]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2023", ["2023"]),
        ("in 2022 and 2023", ["in", "2022", "and", "2023"]),
        ("2022, 2023", ["2022", "2023"]),
        ("100 sites", ["100", "sites"]),
        ("0.8 per million", ["0.8", "per", "million"]),
        ("3.14159", ["3.14159"]),
        ("page 12, 13 and 14", ["page", "12", "13", "and", "14"]),
        ("ISO 50001", ["iso", "50001"]),
        ("1,5", ["1.5"]),
        ("12.05", ["12.05"]),
    ],
)
def test_normalise_numbers_keeps_years_and_ordinary_numbers(text, expected):
    assert number_tokens(text) == expected


def test_trailing_zeros_removed_but_not_integer_zeros():
    assert number_tokens("12.50 and 3.0 and 10.00 and 2020 and 100") == ["12.5", "and", "3", "and", "10", "and",
                                                                          "2020", "and", "100"]


def test_search_text_is_number_normalised():
    assert tokens(search_text("12,450 tonnes, 12.5 %")) == ["12450", "tonnes", "12.5"]


# --- keywords -----------------------------------------------------------------------


def test_keywords_drop_english_stop_words_and_keep_order():
    assert keywords("What were the total emissions of the company in 2023?", "en") == [
        "total", "emissions", "company", "2023"]


def test_keywords_drop_detected_language_stop_words():
    question = "Quelles étaient les émissions de gaz à effet de serre du groupe en 2023 ?"
    french = keywords(question, "fr")
    assert french == ["émissions", "gaz", "effet", "serre", "groupe", "2023"]
    # without the language only the English list applies: French function words stay
    neutral = keywords(question, None)
    assert {"les", "du", "quelles"} <= set(neutral)


@pytest.mark.parametrize("text, language, token", [
    ("Die direkten Emissionen betrugen 48.300 Tonnen CO2e.", "de", "48300"),
    ("Consumo de agua: 845.000 m3 en 2023.", "es", "845000"),
    ("Émissions totales : 12 450 tCO2e, soit 1 577,5 t par site.", "fr", "12450"),
    ("Émissions totales : 12 450 tCO2e, soit 1 577,5 t par site.", "fr", "1577.5"),
    ("Die direkten Emissionen betrugen 48.300 Tonnen CO2e.", "en", "48.3"),  # English reads a decimal
])
def test_a_page_s_figures_are_read_as_its_language_writes_them(text, language, token):
    """German, Spanish, Italian, Dutch and Portuguese write 48,300 as "48.300", French as "12 450":
    read as 48.3 and as 12 and 450, they never met an answer's 48,300 or 12,450."""
    assert token in search_text(text, language).split() or token in tokens(search_text(text, language))


def test_a_continental_figure_of_one_group_is_both_its_readings():
    """An English answer copying a German page's "1.250 m3" (read 1.25) met the page before the
    page was read in German; "12,450" on a French page is a decimal. Both readings, where a
    figure of one group could be either; "2.000" is not also 2 (it would meet every "Scope 2")."""
    assert tokens(search_text("Verbrauch: 1.250 Kubikmeter, 2.000 t, 1.577.000 EUR", "de")) == [
        "verbrauch", "1250", "1.25", "kubikmeter", "2000", "t", "1577000", "eur"]
    assert tokens(search_text("12,450 accidents par million d'heures", "fr"))[:2] == ["12450", "12.45"]


def test_spaced_digit_groups_stay_apart_in_english_and_in_years():
    assert tokens(search_text("Scope 1 450 t in 2022 2023", "en")) == ["scope", "1", "450", "t", "in", "2022", "2023"]
    assert tokens(search_text("En 2022 2023 : 12 450 t", "fr")) == ["en", "2022", "2023", "12450", "t"]


def test_keywords_keep_english_stop_words_that_are_words_elsewhere_when_asked():
    assert keywords("Quelle est la part des femmes ?", "fr", english_stops=False) == ["part", "femmes"]
    assert keywords("Quelle est la part des femmes ?", "fr") == ["femmes"]  # "part" is an English stop word


def test_keywords_always_drop_english_stop_words():
    kw = keywords("What was der Anteil erneuerbarer Energien in the year?", "de")
    assert kw == ["anteil", "erneuerbarer", "energien"]


def test_keywords_dedupe_case_insensitively():
    assert keywords("Emissions emissions EMISSIONS of the Emissions; 2023, 2023", "en") == ["emissions", "2023"]


def test_keywords_normalise_numbers_and_keep_single_digits():
    assert keywords("Scope 1 and 2: $1,577.00, 12.5% x y", "en") == ["scope", "1", "2", "1577", "12.5"]


def test_keywords_unknown_language_does_not_crash():
    assert keywords("emissions totales", "zz") == ["emissions", "totales"]
    assert keywords("", "en") == []


@pytest.mark.parametrize("language", sorted(LANGUAGES))
def test_every_supported_language_has_stop_words(language):
    words = stop_words(language)
    assert len(words) > 50, f"no stop-word list for {language!r}: its function words would be searched"


# --- query building ------------------------------------------------------------------


def test_build_query_english(detector):
    q = build_query("What were the company's Scope 1 and 2 greenhouse gas emissions in 2023?",
                    "12,450 tCO2e, down 12.5% on 2022.", detector)
    assert q.language == "en"
    assert q.keywords == ("company", "scope", "1", "2", "greenhouse", "gas", "emissions", "2023",
                          "12450", "tco2e", "12.5", "2022")


def test_build_query_french_removes_french_stop_words(detector):
    q = build_query("Quelle proportion des fournisseurs a été auditée sur les droits humains en 2023 ?",
                    "87 % des fournisseurs", detector)
    assert q.language == "fr"
    assert q.keywords == ("proportion", "fournisseurs", "auditée", "droits", "humains", "2023", "87")


def test_build_query_reads_a_short_question_s_language(detector):
    """Too short for langdetect's usual reading (40 letters): no language, so French function
    words stayed and the English stop list took "part" (share) away."""
    q = build_query("Quelle est la part des femmes ?", "38 %", detector)
    assert q.language == "fr" and q.keywords == ("part", "femmes", "38")
    assert build_query("Wie hoch sind die Scope-1-Emissionen?", "", detector).language == "de"
    # keyword-style English is not given another language (langdetect said Dutch, sure of it)
    assert build_query("Net zero target?", "", detector).language is None
    assert build_query("What is the share of women?", "38 %", detector).language == "en"


def test_build_query_searches_a_figure_both_ways_outside_english(detector):
    """A page is indexed in its language's reading ("48.300" is 48300 in German); an answer
    whose language is unknown or not English is searched in both readings."""
    q = build_query("Scope 1?", "48.300 t CO2e", detector)
    assert q.language is None and {"48.3", "48300"} <= set(q.keywords)
    french = build_query("Quelles sont les émissions totales du groupe ?", "12 450 tCO2e", detector)
    assert french.language == "fr" and {"12", "450", "12450"} <= set(french.keywords)
    english = build_query("What were the group's total emissions in 2023?", "48.300 t", detector)
    assert english.language == "en" and "48300" not in english.keywords  # English: a decimal, as before


def test_build_query_without_detector_or_answer():
    q = build_query("  Total water withdrawal in 2023? ", "")
    assert q.language is None
    assert q.text == "Total water withdrawal in 2023?"
    assert q.keywords == ("total", "water", "withdrawal", "2023")


def test_json_line_escapes_the_line_breaks_json_leaves_raw():
    from evidentia.text import json_line

    value = {"q": "a\u2028b\x85c\u2029d\ne\x0bf é"}
    line = json_line(value)
    assert line == '{"q": "a\\u2028b\\u0085c\\u2029d\\ne\\u000bf é"}'
    assert json.loads(line) == value and len(line.splitlines()) == 1
