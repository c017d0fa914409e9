"""Pool-independent features of a (question, answer, page) triple, for the
feature-based relevance model (``reranker/relevance_model.py``).

Every feature is computed from the query and the page alone: no first-stage
score, rank, pool size or statistic of other pages enters, so a page gets the
same features - and the same probability - whatever pool it comes in.

- cosines of the untrained all-MiniLM-L6-v2 bi-encoder between the query
  (question + answer, and the question alone) and the page's best window:
  the signal the base model already has, kept instead of fine-tuned away;
- lexical coverage of the query keywords on the page (a BM25-like saturated
  term frequency with a fixed length norm, no IDF and no pool-relative
  normalisation) and of adjacent keyword pairs (phrases);
- the answer's figures found on the page (numbers normalised as at index time);
- the page's length and share of numeric tokens (tables vs prose);
- how much the page reads like a glossary (``GLOSSARY_PROBE``): a glossary defines
  every term of a question and answers none;
- whether the page is titled as the financial statement the question names, or as
  one whose face prints a line item the question asks about
  ("balance sheet" against "Consolidated Statements of Financial Position");
- what the model remembers of the same question asked before (the pages judged
  for it in training: ``reranker/question_memory.py``);
- the page's standing in its own document (``DOCUMENT_FEATURE_NAMES``): its rank
  among all the document's pages by the query cosine and by the domain BM25, their
  reciprocal-rank fusion, the gap to the document's best cosine. This is what made
  the hybrid first stage hard to beat (it fuses *ranks*, whose scale is the same
  for every query), computed over the whole document, never over the pool: the
  same page of the same document gets the same value whatever pool it comes in;
  and the document's mean share of numeric tokens (a filing's tables, a report's
  prose) and its coverage of the query's keywords (none when it never prints the name
  the question asks about), used only to put documents on one probability scale
  after the fit (``CALIBRATION_FEATURES``).

Window vectors come from the index when the page was embedded at indexing time
with the same model (``PageVectorSource``), else they are computed here with the
same windowing, so both ways give the same numbers.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from evidentia.reranker.query_adapter import QueryAdapter
from evidentia.reranker.question_memory import MEMORY_FEATURE_NAMES, MemoryMatch, QuestionMemory
from evidentia.reranker.statements import item_statements, named_statements, titled_statements
from evidentia.text import keywords, normalise_numbers, stop_words, tokens

log = logging.getLogger("evidentia.reranker.features")

if TYPE_CHECKING:  # pragma: no cover
    from evidentia.records import PageVectors
    from evidentia.retriever.dense import PageEmbedder

PAGE_FEATURE_NAMES = (
    "cos_query",        # cosine(question + answer, best window)
    "cos_question",     # cosine(question, best window)
    "cos_query_mean",   # cosine(question + answer, mean of the windows)
    "cos_answer",       # cosine(answer, best window); 0 without an answer
    "cov_question",     # share of the question's keywords on the page
    "cov_answer",       # share of the answer's word keywords on the page
    "tf_question",      # saturated term frequency of the question keywords, per keyword
    "idf_cov_question", # share of the question keywords' weight on the page (weight: rarity in the language)
    "idf_cov_answer",   # the same for the answer's word keywords
    "bm25_fixed",       # BM25 of question + answer keywords with fixed IDF (word frequency) and length norm
    "bm25_domain",      # BM25 with the IDF of the model's training pages (a fixed table in the model)
    "phrase_question",  # share of adjacent question-keyword pairs found adjacent on the page
    "num_answer",       # share of the answer's figures on the page (0 when it has none)
    "has_num_answer",   # 1 when the answer has figures
    "has_answer",       # 1 when an answer was given (the answer features are 0 without one)
    "log_len",          # ln(1 + page tokens)
    "num_share",        # share of numeric tokens on the page
    "statement_title",  # 1 when the question names a financial statement and the page is titled as it (reranker/statements.py)
    "statement_item",   # 1 when the page is titled as a statement printing a line item the question asks about
    "cos_query_adapted",  # cosine(question + answer moved by the model's query adapter, best window): reranker/query_adapter.py
    "glossary_cos",     # cosine(GLOSSARY_PROBE, mean of the windows): how much the page reads like a glossary
    "window_cov_question",  # share of the question keywords' weight found in the page's best PASSAGE_TOKENS window
    "window_cov_answer",    # the same for the answer's word keywords (0 without them)
    "title_page",       # 1 for a document's first or last page with fewer than TITLE_PAGE_WORDS words: a (back) cover
)
DOCUMENT_FEATURE_NAMES = (
    "doc_rank_cos",     # ln(1 + pages of the document with a higher cos_query)
    "doc_rank_bm25",    # ln(1 + pages of the document with a higher bm25_domain)
    "doc_rrf",          # 60 * (1/(60 + rank by cos_query) + 1/(60 + rank by bm25_domain)): a hybrid within the document
    "doc_gap_cos",      # cos_query minus the document's best cos_query
    "doc_rel_bm25",     # bm25_domain over the document's best (0 when no page matches)
    "doc_z_cos",        # cos_query standardised over the document's pages
    "doc_rank_cos_question",  # ln(1 + pages of the document with a higher cos_question)
    "doc_num_share",    # mean num_share of the document's pages: a filing's tables against a report's prose
    "doc_local_bm25",   # BM25 with the document's own IDF (rare in this document), over the document's best
    "doc_rank_local_bm25",  # ln(1 + pages of the document with a higher local BM25)
    "doc_cov_query",    # how far the document falls short of holding half the query keywords' weight (coverage_shortfall)
    "doc_rank_cos_adapted",  # ln(1 + pages of the document with a higher cos_query_adapted)
    "doc_len",          # mean log_len of the document's pages: a report's long prose pages against short passages
    "query_no_answer",  # 1 when the query has no answer (the question asked alone), else 0: the same for every page
    "query_no_answer_words",  # min(question words, QUESTION_WORDS_CAP) / 10 when it has no answer, else 0
)
# Signs the relevance model's weights must keep (reranker/relevance_model.py).
#
# The probability never rises as the page ranks lower in its document. With free signs
# the fit paired a negative weight on the reciprocal-rank fusion with the log ranks
# into a U: past the ranks seen in training, worse ranks scored higher.
#
# Nor does it fall as the page matches the query more: every cosine, keyword
# coverage, BM25, phrase, answer-figure, statement-title and remembered-evidence
# feature weighs >= 0.
# These features move together, and a free fit set some against the others (doc_z_cos
# -0.64 against cos_question +0.41, cov_question -0.59 against idf_cov_question +0.57,
# phrase_question -0.12). On ClimRetrieve's generated reports the contrasts paid; on
# real reports they did not. On the two BHP reports graded page by page
# (bench/report_labels.py), the free fit was behind hybrid (P@3 of the pages that
# answer -0.111 [-0.208, -0.014]; a glossary, every keyword and a lower cosine, first
# for "net zero target"), the signed one level with hybrid and ahead of the free fit
# (P@1 +0.167 [+0.042, +0.333]). Cross-fitted on the labelled queries it costs a
# little (docs/BENCHMARKS.md section 8u).
_RANK_SIGNS = {"doc_rank_cos": -1, "doc_rank_bm25": -1, "doc_rank_cos_question": -1, "doc_rank_local_bm25": -1,
               "doc_rrf": +1, "doc_rank_cos_adapted": -1}
_EVIDENCE_FEATURES = ("cos_query", "cos_question", "cos_query_mean", "cos_answer", "cos_query_adapted", "cov_question",
                      "cov_answer", "tf_question", "idf_cov_question", "idf_cov_answer", "bm25_fixed", "bm25_domain",
                      "phrase_question", "window_cov_question", "window_cov_answer", "num_answer", "statement_title",
                      "statement_item", "memory_relevant", "memory_margin", "memory_probe", "doc_gap_cos",
                      "doc_rel_bm25", "doc_z_cos", "doc_local_bm25")
FEATURE_SIGNS = {**_RANK_SIGNS, **{name: +1 for name in _EVIDENCE_FEATURES}}
# Page features left out of the relevance fit and fitted after it, with the document
# calibration, as a term that can only lower a page (reranker/relevance_model.py,
# DocumentCalibration). title_page in the relevance fit (docs/BENCHMARKS.md 8ak, C19)
# moved the length weight with it, and thin pages of real reports came first; fitted
# after it, every other weight stays as it was and only covers move.
AFTER_FIT_PAGE_FEATURES = ("title_page",)
# Features constant over a document, left out of the relevance fit and fitted after it
# on the out-of-fold logits (reranker/relevance_model.py, calibrate_documents): they move
# a document's probabilities, never the order of its pages. Without them a filing's
# pages ran high (memory dropout teaches that a page without memory is relevant as
# often as a report's: cross-validated on the training split, filings' pools averaged
# p 0.069 for a relevance rate of 0.050, ECE 0.020; 0.048 and 0.008 with it); inside the
# fit they cost a financebench P@1 query (docs/BENCHMARKS.md sections 8f, 8h).
#
# doc_cov_query: a document that cannot hold a query's evidence (another company's,
# another subject's) still has a best page, and its ranks in the document made it look
# like evidence (a filing's question searched in a climate report: best page at median
# p 0.26 on the held-out split, docs/BENCHMARKS.md section 8p). Whether the document
# names what the query names at all (the company, the line item) moves all its pages
# together; its weight is learnt from pages of such documents in training
# (training/dataset.py, foreign negatives).
#
# doc_len: which kind of report a document is. The two BHP reports (long prose pages,
# a question's evidence on one or two of them) need a steeper calibration than
# ClimRetrieve's generated reports (short pages, a quarter of a pool relevant), and
# doc_num_share alone cannot tell them apart (docs/BENCHMARKS.md 8ad, 8ae).
#
# query_no_answer, query_no_answer_words: which kind of question is asked alone. A
# question written from one page and asked without its answer (18 words on the BHP
# reports) wants its best page higher and the rest lower than the model gives; a
# questionnaire question asked of any company (11 words) about what it gives
# (docs/BENCHMARKS.md 8an: refit slopes 2.2-2.9 against 0.8-1.2). Fitted, they shift a
# query's probabilities by about 0.06 and earn no slope (8ao).
CALIBRATION_FEATURES = ("doc_num_share", "doc_cov_query", "doc_len", "query_no_answer", "query_no_answer_words")
QUESTION_WORDS_CAP = 30
# A page's own features: PAGE_FEATURE_NAMES, then the question memory's
# (reranker/question_memory.py); the document features are derived from them.
ROW_FEATURE_NAMES = PAGE_FEATURE_NAMES + MEMORY_FEATURE_NAMES
FEATURE_NAMES = ROW_FEATURE_NAMES + DOCUMENT_FEATURE_NAMES
_ADAPTED = PAGE_FEATURE_NAMES.index("cos_query_adapted")
_GLOSSARY = PAGE_FEATURE_NAMES.index("glossary_cos")
_WINDOW = PAGE_FEATURE_NAMES.index("window_cov_question")
_TITLE = PAGE_FEATURE_NAMES.index("title_page")
_QUERY_KIND = [FEATURE_NAMES.index("query_no_answer"), FEATURE_NAMES.index("query_no_answer_words")]
# A report's cover holds its title and little else ("Westpac 2023 climate report"), and
# reads, to the bi-encoder, like every sustainability question; with few words it also
# looked like the short expert passages that are evidence. Cross-fitted by company, 3 of
# the 10 printed report questions that lost their first place to hybrid put the cover
# first (p 0.36-0.55), and the cover was kept at t in 20 of the 51 held-out printed
# pools (docs/BENCHMARKS.md 8al). A first page this short is not evidence; nor is a last
# one, a back cover ("BHP Climate Transition Action Plan 27" was kept at t for "Offsets?",
# p 0.136; 8ao). A last page is known only with its document.
TITLE_PAGE_WORDS = 30
_RRF_K = 60.0
# A page whose windows read, on average, like this is a glossary: it defines the terms
# of a question and answers none. On the two graded BHP reports their glossaries score
# 0.21-0.23 on average against 0.07-0.09 for the other pages; the generated reports'
# glossaries (evaluation/climretrieve.py) teach the fit what it means (weight -0.17).
# Without them in training the weight stayed at -0.02 (docs/BENCHMARKS.md 8u).
GLOSSARY_PROBE = "Glossary. Term: definition. Abbreviation: meaning."

# BM25's term-frequency saturation with a fixed document length norm: the same
# page scores the same whatever else is indexed.
_K1 = 1.2
_B = 0.75
_AVG_TOKENS = 400.0
_PREFIX = 6  # crude stemming: "expenditures" matches "expenditure"


def _length_norm(n_tokens: int) -> float:
    return _K1 * (1 - _B + _B * n_tokens / _AVG_TOKENS)


def _bm25_term(weight: float, count: int, norm: float) -> float:
    """One term's BM25 contribution: its weight times its saturated frequency."""
    return weight * count * (_K1 + 1) / (count + norm)


def _stem(tok: str) -> str:
    return tok[:_PREFIX] if len(tok) > _PREFIX and not tok[0].isdigit() else tok


def _is_number(tok: str) -> bool:
    return tok[:1].isdigit()


def term_weight(token: str, language: str | None) -> float:
    """A fixed IDF: how rare the word is in general text of its language
    (wordfreq's Zipf scale, 8 = "the"-frequent, 0 = unseen), the same for every
    index and pool. Numbers and unknown words weigh most."""
    from wordfreq import zipf_frequency

    zipf = zipf_frequency(token, language or "en")
    if language and language != "en":
        zipf = max(zipf, zipf_frequency(token, "en"))  # English questions on other-language pages
    return max(0.5, 8.0 - zipf)


@dataclass(frozen=True)
class QueryTerms:
    question: tuple[str, ...]  # stemmed keywords of the question, in order
    answer_words: tuple[str, ...]  # stemmed word keywords of the answer not in the question
    answer_numbers: tuple[str, ...]  # canonical figures of the answer
    pairs: tuple[tuple[str, str], ...]  # adjacent question keywords
    weights: dict = None  # stem -> fixed IDF (term_weight)
    has_answer: bool = False
    statements: frozenset = frozenset()  # financial statements the question names
    item_statements: frozenset = frozenset()  # statements printing a line item the question asks about
    name: str | None = None  # stem of the question's rarest name (question_name), None without one

    @property
    def every(self) -> tuple[str, ...]:
        """The terms BM25 scores: the question's, the answer's words and figures."""
        return (*self.question, *self.answer_words, *self.answer_numbers)


def query_terms(question: str, answer: str, language: str | None = None) -> QueryTerms:
    q_raw = keywords(question, language)
    a_all = keywords(answer, language)
    weights: dict[str, float] = {}
    for t in (*q_raw, *a_all):
        weights.setdefault(_stem(t), term_weight(t, language))
    q = [_stem(t) for t in q_raw]
    numbers = tuple(dict.fromkeys(t for t in a_all if _is_number(t)))
    qset = set(q)
    words = tuple(dict.fromkeys(_stem(t) for t in a_all if not _is_number(t) and _stem(t) not in qset))
    pairs = tuple(dict.fromkeys(zip(q, q[1:])))
    return QueryTerms(tuple(dict.fromkeys(q)), words, numbers, pairs, weights, bool(answer.strip()),
                      named_statements(question), item_statements(question), question_name(question))


_SENTENCE_BREAK = re.compile(r"(?<=[.?!:;])\s+|\n+")
_WORD = re.compile(r"[^\W\d_][\w&'’-]*")
_POSSESSIVE = re.compile(r"(?<![\w&.-])([\w&.-]+)['’]s\b")
# term_weight at or below it: a word as common as "the" or "I" (Zipf >= 6), never a name
_COMMON_WORD_WEIGHT = 2.0
# "Here's the question", "What's": an 's that is "is", not a possessive
_CONTRACTED = frozenset("here there it that what who where how when why let he she this everyone "
                        "someone something everything nothing today".split())
# capitalised, but a document may give a date in figures ("2023-07-31") or not at all
_CALENDAR_WORDS = frozenset(
    "january february march april may june july august september october november december "
    "monday tuesday wednesday thursday friday saturday sunday".split())


def question_name(question: str) -> str | None:
    """The stem of the rarest (highest ``term_weight``) name of an English question: a
    capitalised word that does not open a sentence ("Boeing", "Mills" of "General
    Mills", "Paris"), or a capitalised word in the possessive ("AMCOR's"): a name the
    question's evidence must print. None for a question without one ("Does the
    company ...", the usual questionnaire), for a question not in English, where
    capitals mark nouns (German) rather than names, and for one written in title case.
    Other all-capital words are left out: they are as often acronyms a document may
    spell out ("USD", "COGS", "IPCC") as names; so are common words ("I", "The") and
    months and weekdays. A possessive is preferred to another capitalised word."""
    english = stop_words("en")
    words = _WORD.findall(question)
    if len(words) < 3 or sum(w.lower() in english for w in words) < max(2, 0.2 * len(words)):
        return None
    content = [w for w in words if w.lower() not in english and not w.isupper()]
    if len(content) >= 3 and sum(w[0].isupper() for w in content) >= 0.8 * len(content):
        return None  # a question in title case ("Does The Company Report Scope 3 Emissions?"): capitals mark nothing
    # a possessive is the surer sign of a name ("American Express's Balance Sheet": the
    # company, not the statement), so it is taken first
    possessives = [m.group(1) for m in _POSSESSIVE.finditer(question)
                   if not m.group(1).islower() and m.group(1).lower() not in _CONTRACTED]
    capitalised = []
    for sentence in _SENTENCE_BREAK.split(question):
        for i, word in enumerate(_WORD.findall(sentence)):
            word = re.sub(r"['’]s$", "", word).strip("'’-")
            if i > 0 and len(word) >= 2 and word[0].isupper() and any(c.islower() for c in word[1:]):
                capitalised.append(word)
    for names in (possessives, capitalised):
        best: tuple[float, str] | None = None
        for name in names:
            # a page's tokens split "3M" into "3" and "m": a name is checked by its words
            # of two letters or more
            for tok in tokens(normalise_numbers(name)):
                if len(tok) < 2 or _is_number(tok) or tok in _CALENDAR_WORDS:
                    continue
                weight = term_weight(tok, "en")
                if weight > _COMMON_WORD_WEIGHT and (best is None or weight > best[0]):
                    best = (weight, _stem(tok))
        if best is not None:
            return best[1]
    return None


def name_missing(terms: QueryTerms, pages: Sequence[list[str]]) -> bool:
    """Whether the question has a name (``question_name``) that none of the document's
    pages (``page_stems`` of each) prints."""
    return terms.name is not None and not _found({terms.name}, pages)


def _found(wanted: set[str], pages: Sequence[list[str]]) -> set[str]:
    """The ``wanted`` stems that any of the pages (``page_stems`` of each) holds."""
    found: set[str] = set()
    for toks in pages:
        found.update(wanted.intersection(toks))
    return found


@dataclass(frozen=True)
class TermStatistics:
    """Document frequencies of the training pages, stored with the model: a
    domain IDF ("climate" is common in sustainability reports, rare in general
    text) that is fixed once trained, unlike an index's, which changes with what
    else is indexed."""

    pages: int
    df: dict

    def idf(self, stem: str) -> float:
        return math.log((self.pages + 1) / (self.df.get(stem, 0) + 0.5))

    @classmethod
    def from_texts(cls, texts, min_df: int = 2) -> "TermStatistics":
        df: Counter = Counter()
        n = 0
        for text in texts:
            df.update({_stem(t) for t in tokens(normalise_numbers(text or ""))})
            n += 1
        return cls(n, {t: c for t, c in sorted(df.items()) if c >= min_df})

    def to_dict(self) -> dict:
        return {"pages": self.pages, "df": self.df}

    @classmethod
    def from_dict(cls, data: dict) -> "TermStatistics":
        return cls(int(data["pages"]), dict(data["df"]))


def page_stems(page_text: str) -> list[str]:
    """The page's tokens as the lexical features match them (numbers normalised, crude stems)."""
    return [_stem(t) for t in tokens(normalise_numbers(page_text or ""))]


def lexical_features(terms: QueryTerms, page_text: str, stats: TermStatistics | None = None,
                     stems: list[str] | None = None) -> list[float]:
    """cov_question .. statement_item of FEATURE_NAMES; ``stems``: ``page_stems(page_text)``
    when already at hand."""
    toks = page_stems(page_text) if stems is None else stems
    n = len(toks)
    counts = Counter(toks)
    cov = lambda ts: sum(1 for t in ts if counts.get(t)) / len(ts) if ts else 0.0  # noqa: E731
    norm = _length_norm(n)
    tf = (sum(_bm25_term(1.0, counts[t], norm) for t in terms.question if counts.get(t))
          / len(terms.question)) if terms.question else 0.0
    if terms.pairs and n > 1:
        bigrams = set(zip(toks, toks[1:]))
        phrase = sum(1 for p in terms.pairs if p in bigrams) / len(terms.pairs)
    else:
        phrase = 0.0
    numbers = sum(1 for t in toks if _is_number(t))
    w = terms.weights or {}

    def weighted_cov(ts) -> float:
        total = sum(w.get(t, 1.0) for t in ts)
        return sum(w.get(t, 1.0) for t in ts if counts.get(t)) / total if total else 0.0

    every = terms.every
    total = sum(w.get(t, 1.0) for t in every)
    bm25 = (sum(_bm25_term(w.get(t, 1.0), counts[t], norm) for t in every if counts.get(t))
            / total) if total else 0.0
    titled = titled_statements(page_text) if terms.statements or terms.item_statements else frozenset()
    domain = 0.0
    if stats is not None:
        domain = sum(_bm25_term(stats.idf(t), counts[t], norm) for t in every if counts.get(t))
    return [
        cov(terms.question),
        cov(terms.answer_words),
        tf,
        weighted_cov(terms.question),
        weighted_cov(terms.answer_words),
        bm25,
        domain,
        phrase,
        cov(terms.answer_numbers),
        1.0 if terms.answer_numbers else 0.0,
        1.0 if terms.has_answer else 0.0,
        math.log1p(n),
        numbers / n if n else 0.0,
        1.0 if terms.statements & titled else 0.0,
        1.0 if terms.item_statements & titled else 0.0,
    ]


# A passage: about a paragraph. A real report's page holds 900 words (BHP's, median),
# several subjects; the index embeds its first 2 x 256 tokens only, and the page-wide
# counts above cannot tell the question's words standing together in one paragraph from
# the same words spread over the page's other subjects (docs/BENCHMARKS.md section 8x).
PASSAGE_TOKENS = 64


def passage_coverage(terms: QueryTerms, stems: list[str], window: int = PASSAGE_TOKENS) -> list[float]:
    """window_cov_question, window_cov_answer of FEATURE_NAMES: the largest share of the
    question's (answer words') keyword weight that one run of ``window`` consecutive page
    tokens (``page_stems``) holds."""
    w = terms.weights or {}
    question, answer = set(terms.question), set(terms.answer_words)
    # one pass over the page (every page of a searched document is scored)
    hits = [(i, t) for i, t in enumerate(stems) if t in question or t in answer]
    return [_best_window_share(terms.question, w, [h for h in hits if h[1] in question], window),
            _best_window_share(terms.answer_words, w, [h for h in hits if h[1] in answer], window)]


def _best_window_share(wanted: Sequence[str], weights: dict, hits: list[tuple[int, str]], window: int) -> float:
    """``hits``: the (position, stem) of the page's tokens that are ``wanted``, in page order."""
    total = sum(weights.get(t, 1.0) for t in wanted)
    if not total:
        return 0.0
    inside: Counter = Counter()
    weight = best = 0.0
    start = 0
    for i, t in hits:  # two pointers over the matching positions: O(matches)
        inside[t] += 1
        if inside[t] == 1:
            weight += weights.get(t, 1.0)
        while hits[start][0] <= i - window:
            old = hits[start][1]
            inside[old] -= 1
            if inside[old] == 0:
                weight -= weights.get(old, 1.0)
            start += 1
        best = max(best, weight)
    return best / total


# A source of a page's window vectors: (doc_id, page, text) -> (windows, dim) array or None.
PageVectorSource = Callable[[str, int, str], "np.ndarray | None"]
# A source of a document's pages: doc_id -> [(page number, text), ...] in page order, or None.
DocumentSource = Callable[[str], "list[tuple[int, str]] | None"]


def stored_document_source(backend) -> DocumentSource:
    """Every page of a document as indexed (``SearchBackend.stored_document``); None
    for a document the index does not hold. One source serves one query: documents
    are read once per source (the classifier makes one per query, training one per run),
    so a replaced document is read afresh by the next query."""
    documents: dict[str, list[tuple[int, str]] | None] = {}

    def lookup(doc_id: str) -> list[tuple[int, str]] | None:
        if doc_id not in documents:
            try:
                document = backend.stored_document(doc_id)
            except Exception:  # a document being replaced, a backend down: the page alone stands for it
                # logged: the page's document features are then missing, and its probability moves
                log.warning("cannot read document %s for its pages' document features", doc_id, exc_info=True)
                document = None
            documents[doc_id] = None if document is None else [(p.page, p.text or "") for p in document.pages]
        return documents[doc_id]

    return lookup


def _higher_count(values: np.ndarray) -> np.ndarray:
    """For each value, how many values are strictly higher (a rank in which ties
    share the best place, so page order never decides)."""
    ordered = np.sort(values)
    return len(values) - np.searchsorted(ordered, values, side="right")


def local_bm25(terms: QueryTerms, pages: Sequence[list[str]]) -> np.ndarray:
    """BM25 of every page of one document (``page_stems`` of each) with the
    document's own IDF: a term on few of this document's pages weighs most, whatever
    else is indexed (a filing's "cyclical" is rare in it, "revenue" is not)."""
    every = list(dict.fromkeys(terms.every))
    if not every or not pages:
        return np.zeros(len(pages))
    wanted = set(every)
    counts = [Counter(t for t in toks if t in wanted) for toks in pages]
    lengths = [len(toks) for toks in pages]
    n = len(pages)
    df = Counter(t for c in counts for t in c)
    idf = {t: math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) for t in every}
    out = np.zeros(n)
    for j, (c, length) in enumerate(zip(counts, lengths)):
        norm = _length_norm(length)
        out[j] = sum(_bm25_term(idf[t], c[t], norm) for t in c)
    return out


# A document holding at least this share of the keywords' weight is not judged by it:
# on the training split, half of the filings' own documents held 0.78 of it and 9 % less
# than one half, while their questions' keywords in climate reports reached a median
# 0.20 (93 % below one half). Below it, the shortfall counts in log terms.
COVERAGE_ENOUGH = 0.5
_COVERAGE_FLOOR = 0.05  # keeps ln finite for a document holding no keyword


def document_coverage(terms: QueryTerms, pages: Sequence[list[str]]) -> float | None:
    """Share of the keywords' weight found on any of the document's pages (``page_stems``
    of each): of the question's, or of the whole query's (question, answer words and
    figures), whichever is larger, so that a long answer (a narrative, a definition) or
    an answer's computed figures never make the document look foreign. None for a
    query without keywords ("How much is it?"): nothing tells whether the document
    could hold its evidence, so it is not judged (as 0.0 it lowered every page as
    if the document held none of a query's words).

    0.0 for a document that never prints the name the question asks about
    (``question_name``): "What was Boeing's FY2022 revenue?" in another company's
    report. The name is one keyword of three there, and "revenue" and "FY2022" are in
    any annual report: the coverage was above one half and 15 of a BHP report's pages
    passed the threshold (docs/BENCHMARKS.md section 8t)."""
    every = set(terms.every)
    if not every:
        return None
    found = _found(every | ({terms.name} if terms.name else set()), pages)
    if terms.name is not None and terms.name not in found:
        return 0.0
    w = terms.weights or {}

    def share(keywords) -> float:
        distinct = list(dict.fromkeys(keywords))  # in the query's order: the same sum on every run
        total = sum(w.get(t, 1.0) for t in distinct)
        return sum(w.get(t, 1.0) for t in distinct if t in found) / total if total else 0.0

    return max(share(terms.question), share(terms.every))


def coverage_shortfall(coverage: float | None) -> float:
    """doc_cov_query: ln((coverage + floor) / (COVERAGE_ENOUGH + floor)) below
    COVERAGE_ENOUGH, 0 above it and for a document that is not known (None)."""
    if coverage is None:
        return 0.0
    return min(0.0, math.log((coverage + _COVERAGE_FLOOR) / (COVERAGE_ENOUGH + _COVERAGE_FLOOR)))


def document_features(page_features: np.ndarray, local: np.ndarray | None = None,
                      coverage: float | None = None) -> np.ndarray:
    """DOCUMENT_FEATURE_NAMES of every page of one document, from the page
    features (PAGE_FEATURE_NAMES) of all its pages, their ``local_bm25`` (None: 0)
    and the document's ``document_coverage`` (None: unknown)."""
    cos = page_features[:, PAGE_FEATURE_NAMES.index("cos_query")]
    cos_question = page_features[:, PAGE_FEATURE_NAMES.index("cos_question")]
    bm25 = page_features[:, PAGE_FEATURE_NAMES.index("bm25_domain")]
    rank_cos = _higher_count(cos)
    rank_bm25 = _higher_count(bm25)
    out = np.zeros((len(page_features), len(DOCUMENT_FEATURE_NAMES)))
    out[:, 0] = np.log1p(rank_cos)
    out[:, 1] = np.log1p(rank_bm25)
    out[:, 2] = _RRF_K * (1.0 / (_RRF_K + rank_cos) + 1.0 / (_RRF_K + rank_bm25))
    out[:, 3] = cos - cos.max()
    out[:, 4] = bm25 / bm25.max() if bm25.max() > 0 else 0.0
    out[:, 5] = (cos - cos.mean()) / (cos.std() + 1e-6)
    out[:, 6] = np.log1p(_higher_count(cos_question))
    out[:, 7] = page_features[:, PAGE_FEATURE_NAMES.index("num_share")].mean()
    if local is not None:
        out[:, 8] = local / local.max() if local.max() > 0 else 0.0
        out[:, 9] = np.log1p(_higher_count(local))
    out[:, 10] = coverage_shortfall(coverage)
    out[:, 11] = np.log1p(_higher_count(page_features[:, PAGE_FEATURE_NAMES.index("cos_query_adapted")]))
    out[:, 12] = page_features[:, PAGE_FEATURE_NAMES.index("log_len")].mean()
    return out


def query_kind(question: str, answer: str) -> tuple[float, float]:
    """query_no_answer and query_no_answer_words of a query (constant over its pages)."""
    if (answer or "").strip():
        return 0.0, 0.0
    return 1.0, min(len((question or "").split()), QUESTION_WORDS_CAP) / 10.0


def stored_vector_source(backend, model_name: str, windows: tuple[int, int, int] | None = None) -> PageVectorSource:
    """Window vectors stored at indexing time (``SearchBackend.page_vectors``), when
    they were made by ``model_name`` with ``windows`` (max_tokens, window_overlap,
    max_windows); None otherwise (the caller computes them). A page's features read
    its best windows: vectors indexed with other EVIDENTIA_DENSE_* windows than the
    model was trained on would shift them. A page's windows are its first tokens, so
    more windows of the same size and overlap hold the wanted ones first: those are
    taken. Vectors indexed before their windows were recorded are taken as if cut the
    same way (a page's first windows)."""
    documents: dict[str, PageVectors | None] = {}

    def lookup(doc_id: str, page: int, text: str) -> np.ndarray | None:
        if doc_id not in documents:
            try:
                vectors = backend.page_vectors(doc_id)
            except Exception:  # a document being replaced, a backend down: compute instead
                log.warning("cannot read the stored vectors of %s: computing them", doc_id, exc_info=True)
                vectors = None
            usable = vectors is not None and vectors.model == model_name and (
                windows is None or vectors.windows is None
                or (tuple(vectors.windows[:2]) == tuple(windows[:2]) and vectors.windows[2] >= windows[2]))
            documents[doc_id] = vectors if usable else None
        vectors = documents[doc_id]
        if vectors is None:
            return None
        rows = np.flatnonzero(np.asarray(vectors.pages) == page)
        if windows is not None:
            rows = rows[:windows[2]]
        if len(rows) == 0:
            return None
        return np.asarray(vectors.vectors[rows], dtype=np.float32)

    return lookup


@dataclass
class PoolFeatures:
    """The features of a pool's pages (``rows``, FEATURE_NAMES) and of every page of
    their documents (``documents``: doc_id -> one row per page), the document of each
    row in ``document_of`` (None: the page stands alone, its document unknown)."""

    rows: np.ndarray
    document_of: list[str | None]
    documents: dict[str, np.ndarray]


class FeatureExtractor:
    """Features of (question, answer, page) as FEATURE_NAMES orders them.

    ``embedder``: the bi-encoder (a ``PageEmbedder``; its model loads on first
    use). Page window vectors computed here are kept in a small LRU cache keyed
    by the text's hash (training scores the same page for many questions)."""

    def __init__(self, embedder: "PageEmbedder", stats: TermStatistics | None = None,
                 cache_size: int = 4096, memory: QuestionMemory | None = None,
                 adapter: QueryAdapter | None = None) -> None:
        self.embedder = embedder
        self.stats = stats
        self.memory = memory
        self.adapter = adapter
        self.cache_size = cache_size
        self._windows: OrderedDict[str, np.ndarray] = OrderedDict()
        self._glossary: np.ndarray | None = None

    def window_vectors(self, text: str) -> np.ndarray:
        key = hashlib.sha1((text or "").encode("utf-8", "surrogatepass")).hexdigest()
        hit = self._windows.get(key)
        if hit is not None:
            self._windows.move_to_end(key)
            return hit
        windows = self.embedder.windows(text)
        vectors = self.embedder._encode(windows) if windows else np.zeros((0, 1), dtype=np.float32)
        self._windows[key] = vectors
        if len(self._windows) > self.cache_size:
            self._windows.popitem(last=False)
        return vectors

    def features(self, question: str, answer: str, pages: Sequence[tuple[str, int | None, str]],
                 language: str | None = None, vector_source: PageVectorSource | None = None,
                 document_source: DocumentSource | None = None) -> np.ndarray:
        """(len(pages), len(FEATURE_NAMES)) array; ``pages``: (doc_id, page, text).

        The document features of a page are computed over every page of its
        document (``document_source``); a page whose document is unknown (no
        source, no doc_id, not in the index) stands alone, as a one-page document."""
        return self.pool_features(question, answer, pages, language, vector_source, document_source).rows

    def pool_features(self, question: str, answer: str, pages: Sequence[tuple[str, int | None, str]],
                      language: str | None = None, vector_source: PageVectorSource | None = None,
                      document_source: DocumentSource | None = None) -> "PoolFeatures":
        """``features`` of the pages, with the features of every page of their documents."""
        out = np.zeros((len(pages), len(FEATURE_NAMES)), dtype=np.float64)
        pool = PoolFeatures(out, [None] * len(pages), {})
        if not pages:
            return pool
        vecs = self._encode_queries(question, answer)
        terms = query_terms(question, answer, language)
        match = self.memory.match(vecs[1], question) if self.memory is not None else None
        # The adapter moves only a remembered question's query: it was learnt on those.
        # Applied to every question, it cost the filings' one-off questions (cross-fitted
        # P@1 0.28 against 0.36 with this gate) and the cross-fitted gains in both
        # domains were smaller (docs/BENCHMARKS.md 8s).
        adapted = self.adapter.adapt(vecs[0]) if self.adapter is not None and match is not None else vecs[0]
        vecs = (*vecs, adapted)
        n_page = len(ROW_FEATURE_NAMES)
        stems: dict[str, list[str]] = {}  # page text -> page_stems, for this query's pages and documents
        out[:, :n_page] = self._page_features(vecs, terms, pages, vector_source, match=match, stems=stems)

        def stand_alone(i: int) -> None:
            # its document unknown: one page is no measure of what the document holds
            local = local_bm25(terms, [stems[pages[i][2] or ""]])
            out[i, n_page:] = document_features(out[i:i + 1, :n_page], local)[0]

        by_doc: dict[str, list[int]] = {}
        for i, (doc_id, page, _text) in enumerate(pages):
            if doc_id is not None and page is not None and document_source is not None:
                by_doc.setdefault(doc_id, []).append(i)
            else:
                stand_alone(i)
        for doc_id, rows in by_doc.items():
            document = document_source(doc_id)
            numbers = [n for n, _t in document] if document else []
            in_document = set(numbers)
            known = {pages[i][1]: out[i, :n_page] for i in rows if pages[i][1] in in_document}
            rest = [(doc_id, n, t) for n, t in document or () if n not in known]
            # With stored vectors, the other pages are scored from them; a document
            # indexed without vectors is not embedded whole at query time: its pages
            # stand alone. Without a vector source (a benchmark, a test), every
            # page is embedded here.
            # (with the memory: the model scores these pages too, for the document's best page)
            rest_features = (self._page_features(vecs, terms, rest, vector_source, match=match,
                                                 stored_only=vector_source is not None, stems=stems)
                             if known else None)
            if rest_features is None:
                for i in rows:
                    stand_alone(i)
                continue
            rest_rows = iter(rest_features)
            page_rows = np.vstack([known[n] if n in known else next(rest_rows) for n in numbers])
            document_stems = [stems.get(t or "") or page_stems(t) for _n, t in document]
            last = max(numbers)
            at = numbers.index(last)
            if last > 1 and len(document_stems[at]) < TITLE_PAGE_WORDS:  # a back cover
                page_rows[at, _TITLE] = 1.0
                for i in rows:
                    if pages[i][1] == last:
                        out[i, _TITLE] = 1.0
            standing = document_features(page_rows[:, :len(PAGE_FEATURE_NAMES)], local_bm25(terms, document_stems),
                                         document_coverage(terms, document_stems))
            pool.documents[doc_id] = np.hstack([page_rows, standing])
            position = {n: j for j, n in enumerate(numbers)}
            for i in rows:
                page = pages[i][1]
                if page in position:
                    out[i, n_page:] = standing[position[page]]
                    pool.document_of[i] = doc_id
                else:
                    stand_alone(i)
        kind = query_kind(question, answer)
        out[:, _QUERY_KIND] = kind
        for rows in pool.documents.values():
            rows[:, _QUERY_KIND] = kind
        return pool

    def page_windows(self, doc_id: str | None, page: int | None, text: str,
                     vector_source: PageVectorSource | None = None, stored_only: bool = False) -> np.ndarray | None:
        """The page's window vectors: stored at indexing time when the source has
        them, else computed (and cached) here; with ``stored_only``, None instead of
        computing them for a page with text."""
        vectors = None
        if vector_source is not None and doc_id is not None and page is not None:
            vectors = vector_source(doc_id, page, text)
        if vectors is None:
            if stored_only and (text or "").strip():
                return None
            vectors = self.window_vectors(text)
        return vectors

    def glossary_vector(self) -> np.ndarray:
        if self._glossary is None:
            self._glossary = self.embedder._encode([GLOSSARY_PROBE], role="query")[0]
        return self._glossary

    def question_vector(self, question: str) -> np.ndarray:
        return self.embedder._encode([question.strip()], role="query")[0]

    def query_vector(self, question: str, answer: str) -> np.ndarray:
        """The vector of question + answer, as the cosine features read it (not adapted)."""
        return self._encode_queries(question, answer)[0]

    def _page_features(self, vecs, terms: QueryTerms, pages: Sequence[tuple[str | None, int | None, str]],
                       vector_source: PageVectorSource | None, match: MemoryMatch | None = None,
                       stored_only: bool = False, stems: dict[str, list[str]] | None = None) -> np.ndarray | None:
        """ROW_FEATURE_NAMES of ``pages``; with ``stored_only``, None as soon as a
        page with text has no stored vectors (instead of embedding it here).
        ``stems`` (page text -> ``page_stems``) is filled for the pages read."""
        stems = {} if stems is None else stems
        q_vec, question_vec, answer_vec, adapted_vec = vecs
        n_page = len(PAGE_FEATURE_NAMES)
        out = np.zeros((len(pages), len(ROW_FEATURE_NAMES)), dtype=np.float64)
        for i, (doc_id, page, text) in enumerate(pages):
            vectors = self.page_windows(doc_id, page, text, vector_source, stored_only)
            if vectors is None:
                return None
            cosines = cosine_features(q_vec, question_vec, answer_vec, vectors, self.glossary_vector())
            out[i, :4], out[i, _GLOSSARY] = cosines[:4], cosines[4]
            key = text or ""
            if key not in stems:
                stems[key] = page_stems(key)
            out[i, 4:_ADAPTED] = lexical_features(terms, key, self.stats, stems[key])
            out[i, _WINDOW:_WINDOW + 2] = passage_coverage(terms, stems[key])
            out[i, _TITLE] = float(page == 1 and len(stems[key]) < TITLE_PAGE_WORDS)
            if vectors.size and vectors.shape[1] == len(adapted_vec):
                out[i, _ADAPTED] = float((vectors @ adapted_vec).max())
            if match is not None and vectors.size and vectors.shape[1] == len(q_vec):
                out[i, n_page:] = match.features(vectors)
        return out

    def _encode_queries(self, question: str, answer: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Vectors of question + answer, the question (the query without one), and the
        answer (None when empty)."""
        question, answer = question.strip(), answer.strip()
        query_text = f"{question} {answer}".strip()
        texts = [query_text, question or query_text] + ([answer] if answer else [])
        vecs = self.embedder._encode(texts, role="query")
        return vecs[0], vecs[1], (vecs[2] if answer else None)


def cosine_features(query_vec: np.ndarray, question_vec: np.ndarray, answer_vec: np.ndarray | None,
                    windows: np.ndarray, glossary_vec: np.ndarray) -> list[float]:
    """Best-window cosine of the query, of the question; the cosine of the query
    with the page's mean window; the answer's best-window cosine (0 without an
    answer); the cosine of ``glossary_vec`` (GLOSSARY_PROBE's) with the mean window.
    A page without text scores 0."""
    if windows.size == 0 or windows.shape[1] != len(query_vec):
        return [0.0, 0.0, 0.0, 0.0, 0.0]
    sims = windows @ query_vec
    mean = windows.mean(axis=0)
    norm = float(np.linalg.norm(mean))
    return [float(sims.max()), float((windows @ question_vec).max()),
            float(mean @ query_vec / norm) if norm > 0 else 0.0,
            float((windows @ answer_vec).max()) if answer_vec is not None else 0.0,
            float(mean @ glossary_vec) / norm if norm > 0 else 0.0]
