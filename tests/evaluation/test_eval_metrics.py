"""Evaluation metrics against hand-worked examples and independent implementations,
and the queries-file parser's errors."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, brier_score_loss, ndcg_score, roc_auc_score

from evidentia.evaluation import metrics as m
from evidentia.evaluation.queries import (MISSING_CATEGORY, QueriesFileError, category_fields, load_queries,
                                          parse_queries)
from evidentia.evaluation.runner import UnknownDocumentsError, apply_threshold, parse_compare
from evidentia.config import ConfigError
from evidentia.records import RankedPage


def keys(*pages, doc="d"):
    return [(doc, p) for p in pages]


# --------------------------------------------------------------------------- precision / recall


def test_precision_at_k_hand_examples():
    ranking = keys(1, 2, 3, 4)
    relevant = set(keys(2, 4))
    assert m.precision_at_k(ranking, relevant, 1) == 0.0  # [1] holds no relevant page: 0/1
    assert m.precision_at_k(ranking, relevant, 2) == 0.5  # [1, 2]: page 2 relevant -> 1/2
    assert m.precision_at_k(ranking, relevant, 3) == pytest.approx(1 / 3)  # [1, 2, 3]: 1/3
    assert m.precision_at_k(ranking, relevant, 4) == 0.5  # [1, 2, 3, 4]: 2/4


def test_precision_divides_by_k_when_fewer_pages_returned():
    # One page returned, and it is relevant: P@1 = 1/1, P@3 = 1/3 (not 1/1), P@10 = 1/10.
    assert m.precision_at_k(keys(7), set(keys(7)), 1) == 1.0
    assert m.precision_at_k(keys(7), set(keys(7)), 3) == pytest.approx(1 / 3)
    assert m.precision_at_k(keys(7), set(keys(7)), 10) == pytest.approx(0.1)


def test_recall_at_k_several_relevant_pages():
    ranking = keys(5, 2, 9, 4)
    relevant = set(keys(2, 4, 8))  # page 8 never returned
    assert m.recall_at_k(ranking, relevant, 1) == 0.0  # [5]: 0 of 3
    assert m.recall_at_k(ranking, relevant, 2) == pytest.approx(1 / 3)  # [5, 2]: 1 of 3
    assert m.recall_at_k(ranking, relevant, 4) == pytest.approx(2 / 3)  # [5, 2, 9, 4]: 2 of 3
    assert m.recall_at_k(ranking, relevant, 20) == pytest.approx(2 / 3)  # fewer than k returned: still 2 of 3


def test_no_relevant_page_returned():
    ranking = keys(1, 2, 3)
    relevant = set(keys(9))
    assert m.precision_at_k(ranking, relevant, 3) == 0.0
    assert m.recall_at_k(ranking, relevant, 3) == 0.0
    assert m.reciprocal_rank(ranking, relevant) == 0.0
    assert m.ndcg_at_k(ranking, relevant, 10) == 0.0
    assert m.average_precision(ranking, relevant) == 0.0


def test_empty_ranking():
    relevant = set(keys(1, 2))
    assert m.precision_at_k([], relevant, 1) == 0.0
    assert m.recall_at_k([], relevant, 3) == 0.0
    assert m.reciprocal_rank([], relevant) == 0.0
    assert m.ndcg_at_k([], relevant, 10) == 0.0
    assert m.average_precision([], relevant) == 0.0


def test_query_without_relevant_pages_is_undefined_for_recall_type_metrics():
    ranking = keys(1, 2)
    assert m.precision_at_k(ranking, set(), 1) == 0.0  # defined: nothing relevant returned
    assert m.recall_at_k(ranking, set(), 1) is None
    assert m.reciprocal_rank(ranking, set()) is None
    assert m.ndcg_at_k(ranking, set(), 10) is None
    assert m.average_precision(ranking, set()) is None


def test_pages_of_other_documents_do_not_match():
    ranking = [("a", 1), ("b", 1)]
    relevant = {("b", 1)}
    assert m.precision_at_k(ranking, relevant, 1) == 0.0  # ("a", 1) is not ("b", 1)
    assert m.reciprocal_rank(ranking, relevant) == 0.5


def test_repeated_page_counts_once():
    ranking = keys(3, 3, 3)
    relevant = set(keys(3))
    # Only the first occurrence is a hit: P@3 = 1/3, AP = (1/1) / 1 = 1.
    assert m.precision_at_k(ranking, relevant, 3) == pytest.approx(1 / 3)
    assert m.average_precision(ranking, relevant) == 1.0


def test_bad_k():
    for k in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            m.precision_at_k(keys(1), set(), k)


# --------------------------------------------------------------------------- rank metrics


def test_reciprocal_rank_hand_examples():
    assert m.reciprocal_rank(keys(1, 2, 3), set(keys(1))) == 1.0  # first hit at rank 1
    assert m.reciprocal_rank(keys(1, 2, 3), set(keys(3, 2))) == 0.5  # first hit at rank 2 -> 1/2
    assert m.reciprocal_rank(keys(1, 2, 3, 4), set(keys(4))) == 0.25  # rank 4 -> 1/4


def test_ndcg_hand_examples():
    # Relevant pages at ranks 2 and 3, two relevant pages in all:
    # DCG  = 1/log2(3) + 1/log2(4) = 0.630930 + 0.5 = 1.130930
    # IDCG = 1/log2(2) + 1/log2(3) = 1 + 0.630930 = 1.630930
    # nDCG@3 = 1.130930 / 1.630930 = 0.693426
    assert m.ndcg_at_k(keys(1, 2, 3), set(keys(2, 3)), 3) == pytest.approx(0.693426, abs=1e-6)
    # nDCG@1 of the same: DCG@1 = 0, so 0.
    assert m.ndcg_at_k(keys(1, 2, 3), set(keys(2, 3)), 1) == 0.0
    # Three relevant pages, k = 2: the ideal only has 2 slots, IDCG@2 = 1 + 1/log2(3) = 1.630930.
    # Hits at ranks 1 and 2: DCG@2 = IDCG@2 -> 1.0 although page 9 is never found.
    assert m.ndcg_at_k(keys(1, 2, 3), set(keys(1, 2, 9)), 2) == pytest.approx(1.0)
    # One relevant page at rank 4 of 10: 1/log2(5) = 0.430677; IDCG = 1.
    assert m.ndcg_at_k(keys(*range(1, 11)), set(keys(4)), 10) == pytest.approx(1 / math.log2(5))


def test_average_precision_hand_examples():
    # Relevant {1, 3, 9}; ranking [1, 2, 3, 4]: hits at rank 1 (precision 1/1) and rank 3 (2/3);
    # page 9 never returned counts 0: AP = (1 + 2/3) / 3 = 0.555556
    assert m.average_precision(keys(1, 2, 3, 4), set(keys(1, 3, 9))) == pytest.approx(5 / 9)
    # Relevant {2, 4}; ranking [1, 2, 3, 4]: (1/2 + 2/4) / 2 = 0.5
    assert m.average_precision(keys(1, 2, 3, 4), set(keys(2, 4))) == 0.5
    # With one relevant page AP equals the reciprocal rank: rank 3 -> 1/3
    assert m.average_precision(keys(1, 2, 3), set(keys(3))) == pytest.approx(1 / 3)


# --------------------------------------------------------------------------- cross-checks


def _independent(ranking, relevant, k):
    """Straightforward numpy versions, written without the module's helpers."""
    rel = np.array([1.0 if key in relevant else 0.0 for key in ranking])
    top = rel[:k]
    p = top.sum() / k
    r = top.sum() / len(relevant)
    hits = np.flatnonzero(rel)
    rr = 1.0 / (hits[0] + 1) if hits.size else 0.0
    discounts = 1.0 / np.log2(np.arange(2, k + 2))
    dcg = float((top * discounts[: top.size]).sum())
    idcg = float(discounts[: min(k, len(relevant))].sum())
    prec_at_hits = np.cumsum(rel)[hits] / (hits + 1)
    ap = float(prec_at_hits.sum()) / len(relevant)
    return p, r, rr, dcg / idcg, ap


@pytest.mark.parametrize("seed", range(8))
def test_random_rankings_against_independent_implementation(seed):
    rng = random.Random(seed)
    universe = [("d", p) for p in range(1, 41)]
    relevant = set(rng.sample(universe, rng.randint(1, 6)))
    ranking = rng.sample(universe, rng.randint(0, 25))  # partial ranking, maybe empty
    for k in (1, 3, 5, 10, 30):
        p, r, rr, ndcg, ap = _independent(ranking, relevant, k)
        assert m.precision_at_k(ranking, relevant, k) == pytest.approx(p)
        assert m.recall_at_k(ranking, relevant, k) == pytest.approx(r)
        assert m.reciprocal_rank(ranking, relevant) == pytest.approx(rr)
        assert m.ndcg_at_k(ranking, relevant, k) == pytest.approx(ndcg)
        assert m.average_precision(ranking, relevant) == pytest.approx(ap)


@pytest.mark.parametrize("seed", range(8))
def test_full_rankings_against_sklearn(seed):
    # A full ranking of every page, scores strictly decreasing: sklearn's nDCG and
    # average precision are then the same quantities as ours.
    rng = random.Random(100 + seed)
    n = 30
    universe = [("d", p) for p in range(1, n + 1)]
    relevant = set(rng.sample(universe, rng.randint(1, 8)))
    ranking = rng.sample(universe, n)
    y_true = np.array([[1 if key in relevant else 0 for key in ranking]])
    y_score = np.array([[float(n - i) for i in range(n)]])
    for k in (1, 3, 10):
        assert m.ndcg_at_k(ranking, relevant, k) == pytest.approx(ndcg_score(y_true, y_score, k=k))
    assert m.average_precision(ranking, relevant) == pytest.approx(average_precision_score(y_true[0], y_score[0]))


# --------------------------------------------------------------------------- calibration


def test_ece_hand_example():
    probs = [0.05, 0.15, 0.12, 0.95, 0.85]
    labels = [0, 0, 1, 1, 0]
    # bin [0.0, 0.1): {0.05}       mean p 0.05,  observed 0/1 -> |0.05 - 0|    = 0.05,  weight 1/5
    # bin [0.1, 0.2): {0.15, 0.12} mean p 0.135, observed 1/2 -> |0.135 - 0.5| = 0.365, weight 2/5
    # bin [0.8, 0.9): {0.85}       mean p 0.85,  observed 0/1 -> 0.85,                  weight 1/5
    # bin [0.9, 1.0]: {0.95}       mean p 0.95,  observed 1/1 -> 0.05,                  weight 1/5
    # ECE = (0.05 + 2 * 0.365 + 0.85 + 0.05) / 5 = 1.68 / 5 = 0.336
    assert m.expected_calibration_error(probs, labels) == pytest.approx(0.336)
    bins = m.reliability_bins(probs, labels)
    assert [b.count for b in bins] == [1, 2, 0, 0, 0, 0, 0, 0, 1, 1]
    assert bins[1].mean_probability == pytest.approx(0.135) and bins[1].observed_frequency == 0.5
    assert bins[2].mean_probability is None


def test_ece_bin_edges_and_perfect_calibration():
    bins = m.reliability_bins([0.0, 0.1, 0.999, 1.0], [0, 0, 1, 1])
    # 0.0 -> bin 0; 0.1 -> bin 1 (bins are [lo, hi)); 0.999 and 1.0 -> the last, closed bin
    assert [b.count for b in bins] == [1, 1, 0, 0, 0, 0, 0, 0, 0, 2]
    # Four pages at p = 0.25, one relevant: observed 1/4 = predicted -> ECE 0
    assert m.expected_calibration_error([0.25] * 4, [1, 0, 0, 0]) == pytest.approx(0.0)
    assert m.expected_calibration_error([], []) is None
    with pytest.raises(ValueError):
        m.reliability_bins([1.2], [1])
    with pytest.raises(ValueError):
        m.reliability_bins([0.2, 0.3], [1])


def test_brier_and_auroc_hand_examples():
    # Brier: ((1 - 0.9)^2 + (0 - 0.2)^2) / 2 = (0.01 + 0.04) / 2 = 0.025
    assert m.brier_score([0.9, 0.2], [1, 0]) == pytest.approx(0.025)
    # AUROC: positives {0.9, 0.4}, negatives {0.2, 0.6}; pairs ranked right:
    # (0.9 > 0.2) (0.9 > 0.6) (0.4 > 0.2), wrong: (0.4 < 0.6) -> 3/4
    assert m.auroc([0.9, 0.2, 0.6, 0.4], [1, 0, 0, 1]) == pytest.approx(0.75)
    assert m.auroc([0.9, 0.2], [1, 1]) is None  # one class: undefined
    assert m.auroc([], []) is None
    assert m.brier_score([], []) is None
    assert m.brier_score([0.3, 0.3], [0, 0]) == pytest.approx(0.09)  # one class is fine for Brier


def test_brier_and_auroc_match_sklearn_on_random_data():
    rng = random.Random(7)
    probs = [rng.random() for _ in range(200)]
    labels = [1 if rng.random() < p else 0 for p in probs]
    assert m.brier_score(probs, labels) == pytest.approx(brier_score_loss(labels, probs))
    assert m.auroc(probs, labels) == pytest.approx(roc_auc_score(labels, probs))


# --------------------------------------------------------------------------- aggregate


@dataclass
class FakeOutcome:
    relevant: frozenset
    pool: list
    ranking: list
    calibration: list | None = None
    fallback: bool = False


def test_aggregate_hand_example():
    outcomes = [
        # q1: relevant {1, 3}; pool [1, 2, 3, 4]; returned [3, 1]
        FakeOutcome(frozenset(keys(1, 3)), keys(1, 2, 3, 4), keys(3, 1), [(0.9, 1), (0.6, 1), (0.2, 0), (0.1, 0)]),
        # q2: relevant {5}; pool [2, 4] (5 not in the pool); returned [] (threshold dropped everything)
        FakeOutcome(frozenset(keys(5)), keys(2, 4), [], [(0.3, 0), (0.1, 0)]),
        # q3: no relevant page; returned [7]
        FakeOutcome(frozenset(), keys(7, 8), keys(7), [(0.5, 0), (0.05, 0)]),
    ]
    agg = m.aggregate(outcomes, ks=[1, 3], pool_k=4, probabilistic=True)
    assert agg["queries"] == 3 and agg["queries_without_relevant"] == 1
    # P@1: q1 1/1, q2 0, q3 0 -> 1/3 (precision keeps q3)
    assert agg["P@1"] == pytest.approx(1 / 3)
    # P@3: q1 2/3, q2 0, q3 0 -> 2/9
    assert agg["P@3"] == pytest.approx(2 / 9)
    # R@1: q1 1/2, q2 0 (q3 skipped) -> 1/4 ; R@3: q1 1, q2 0 -> 1/2
    assert agg["R@1"] == pytest.approx(0.25)
    assert agg["R@3"] == pytest.approx(0.5)
    # Pool recall R@4: q1 2/2, q2 0/1 -> 1/2
    assert agg["R@4"] == pytest.approx(0.5)
    # MRR: q1 1, q2 0 -> 0.5; MAP: q1 (1/1 + 2/2)/2 = 1, q2 0 -> 0.5; nDCG@10: q1 1, q2 0 -> 0.5
    assert agg["MRR"] == pytest.approx(0.5)
    assert agg["MAP"] == pytest.approx(0.5)
    assert agg["nDCG@10"] == pytest.approx(0.5)
    # pages returned: 2, 0, 1 -> mean 1; one query got none
    assert agg["pages_per_query"] == pytest.approx(1.0)
    assert agg["queries_without_pages"] == 1
    # Calibration over all 8 scored pages: Brier = (0.1^2 + 0.4^2 + 0.2^2 + 0.1^2 + 0.3^2 + 0.1^2 + 0.5^2 + 0.05^2) / 8
    expected_brier = (0.01 + 0.16 + 0.04 + 0.01 + 0.09 + 0.01 + 0.25 + 0.0025) / 8
    assert agg["Brier"] == pytest.approx(expected_brier)
    assert agg["scored_pages"] == 8
    # AUROC: positives {0.9, 0.6} are above all six negatives (max 0.5) -> 1.0
    assert agg["AUROC"] == 1.0
    assert agg["ECE"] is not None


def test_aggregate_non_probabilistic_and_empty():
    agg = m.aggregate([FakeOutcome(frozenset(keys(1)), keys(1), keys(1))], ks=[1], pool_k=20)
    assert agg["P@1"] == 1.0 and agg["ECE"] is None and agg["AUROC"] is None and agg["scored_pages"] is None
    empty = m.aggregate([], ks=[1], pool_k=20)
    assert empty["queries"] == 0 and empty["P@1"] is None


def test_metric_names():
    assert m.metric_names([1, 3], 20) == ["P@1", "P@3", "R@1", "R@3", "R@20", "MRR", "nDCG@10", "MAP"]


def test_r_at_pool_size_of_the_ranking_is_not_overwritten_by_the_pool_recall():
    """--k 1,3,20 with a pool of 20: R@20 of a thresholded ranking (1 page kept of
    the 2 relevant in the pool) and the pool's recall are two numbers, two keys."""
    outcome = FakeOutcome(frozenset(keys(1, 2)), keys(1, 2, 3), keys(1))
    agg = m.aggregate([outcome], ks=[1, 3, 20], pool_k=20)
    names = m.metric_names([1, 3, 20], 20)
    assert len(names) == len(set(names)) and "pool R@20" in names
    assert agg["R@20"] == 0.5 and agg["pool R@20"] == 1.0


# --------------------------------------------------------------------------- thresholds, configs


def _page(p, prob):
    return RankedPage(doc_id="d", page=p, score=prob or 0.0, probability=prob)


def test_apply_threshold():
    pages = [_page(1, 0.8), _page(2, 0.4), _page(3, 0.15), _page(4, None)]
    assert [p.page for p in apply_threshold(pages, 0.4)] == [1, 2]  # >= keeps 0.4
    assert [p.page for p in apply_threshold(pages, 0.0)] == [1, 2, 3]  # no probability: dropped
    assert [p.page for p in apply_threshold(pages, None)] == [1, 2, 3, 4]
    assert [p.page for p in apply_threshold(pages, 0.9, fallback=True)] == [1, 2, 3, 4]


def test_parse_compare():
    assert [c.label for c in parse_compare("bm25, bm25 ,none")] == ["bm25"]  # none == bm25
    with pytest.raises(ConfigError):
        parse_compare(" , ")
    with pytest.raises(ConfigError):
        parse_compare("bm25,nosuch")


def test_unknown_documents_message_lists_ten_then_counts():
    msg = str(UnknownDocumentsError([f"doc{i:02d}" for i in range(13)]))
    assert "13 document id(s)" in msg and "doc09" in msg and "doc10" not in msg and "and 3 more" in msg
    assert "--pdf-dir" in msg


# --------------------------------------------------------------------------- queries file


GOOD = {"id": "q1", "doc_id": "a", "question": "Q?", "answer": "A", "relevant_pages": [2, 5]}


def _line(**changes):
    obj = dict(GOOD)
    for key, value in changes.items():
        if value is ...:
            obj.pop(key)
        else:
            obj[key] = value
    return json.dumps(obj)


def test_parse_good_queries(tmp_path):
    lines = [
        _line(question_type="metrics", company="ACME", difficulty=3),
        "",
        _line(id="q2", doc_id=..., doc_ids=["a", "b"], relevant_pages={"b": [1], "a": []}, question_type="other"),
        _line(id=7, relevant_pages=[], partly_relevant_pages=[3, 4]),
    ]
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(lines) + "\n")
    q1, q2, q3 = load_queries(path)
    assert q1.doc_ids == ("a",) and q1.relevant == frozenset({("a", 2), ("a", 5)})
    assert q1.fields == {"question_type": "metrics", "company": "ACME", "difficulty": 3}
    assert q2.doc_ids == ("a", "b") and q2.relevant == frozenset({("b", 1)})
    assert q3.id == "7" and q3.relevant == frozenset()
    assert q3.partly_relevant == frozenset({("a", 3), ("a", 4)}) and q1.partly_relevant == frozenset()
    assert "partly_relevant_pages" not in q3.fields
    # question_type: 2 string values -> a category; company: one value; difficulty: not a string
    assert category_fields([q1, q2, q3]) == {"question_type": ["metrics", "other", MISSING_CATEGORY]}


def test_a_query_without_an_answer_is_the_question_asked_alone(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(_line(answer=...) + "\n")
    (query,) = load_queries(path)
    assert query.answer == "" and query.question


@pytest.mark.parametrize("bad, message", [
    ("{not json", "invalid JSON"),
    ("[1, 2]", "expected a JSON object"),
    (_line(id=...), "missing field 'id'"),
    (_line(doc_id=...), "missing field 'doc_id'"),
    (_line(question=...), "missing field 'question'"),
    (_line(answer=3), "field 'answer' must be a string"),
    (_line(relevant_pages=...), "missing field 'relevant_pages'"),
    (_line(question=3), "field 'question' must be a string"),
    (_line(doc_id=["a"]), "field 'doc_id' must be a non-empty string"),
    (_line(doc_ids=["a"]), "not both"),
    (_line(doc_id=..., doc_ids=[]), "'doc_ids' must be a non-empty list"),
    (_line(relevant_pages="2"), "must be a list of pages or an object"),
    (_line(relevant_pages=[0]), "page 0 is not a positive integer"),
    (_line(relevant_pages=[-3]), "page -3 is not a positive integer"),
    (_line(relevant_pages=[2.5]), "page 2.5 is not a positive integer"),
    (_line(relevant_pages=["4"]), 'page "4" is not a positive integer'),
    (_line(relevant_pages={"zzz": [1]}), "names document 'zzz', which is not among"),
    (_line(doc_id=..., doc_ids=["a", "b"], relevant_pages=[1]), "must be an object {doc_id: [pages]}"),
    (_line(id="q0"), "duplicate id 'q0' (first used on line 1)"),
    (_line(partly_relevant_pages=[0]), "partly_relevant_pages: page 0 is not a positive integer"),
    (_line(partly_relevant_pages=[5]), "partly_relevant_pages repeats a page of relevant_pages"),
    (_line(partly_relevant_pages="3"), "field 'partly_relevant_pages' must be a list of pages"),
])
def test_queries_file_errors_name_the_line(tmp_path, bad, message):
    path = tmp_path / "q.jsonl"
    path.write_text(_line(id="q0") + "\n\n" + bad + "\n")  # the bad line is line 3 (line 2 is blank)
    with pytest.raises(QueriesFileError) as info:
        load_queries(path)
    assert ", line 3: " in str(info.value)
    assert message in str(info.value)
    assert str(path) in str(info.value)


def test_queries_file_unreadable(tmp_path):
    with pytest.raises(QueriesFileError, match="no such file"):
        load_queries(tmp_path / "missing.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(QueriesFileError, match="no queries"):
        load_queries(empty)
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(_line().encode() + b"\n" + '{"id": "é"}'.encode("latin-1") + b"\n")
    with pytest.raises(QueriesFileError, match="line 2: not UTF-8"):
        load_queries(latin)


def test_line_separator_inside_a_string_is_not_a_line_break():
    queries = parse_queries([_line(question="a\u2028b")])
    assert queries[0].question == "a\u2028b"
