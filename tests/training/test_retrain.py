"""What a retraining round says of its held-out queries (fast: no model is trained)."""

from __future__ import annotations

from evidentia.training.retrain import ModelScore, gate


def test_at_threshold_reads_as_a_sentence_without_r_at_3():
    score = ModelScore(0.2, None, 0.1, 2, threshold=0.11, recall_kept=None, pool_share=0.4)
    assert score.at_threshold() == ("at t = 0.11 it has no R@3 to keep (no relevant page in any top 3) and "
                                    "returns 40% of the pool")
    kept = ModelScore(0.2, 0.5, 0.1, 2, threshold=0.11, recall_kept=0.9, pool_share=0.4)
    assert kept.at_threshold() == "at t = 0.11 it keeps 90% of R@3 and returns 40% of the pool"


def test_gate_says_what_its_document_count_counts():
    """Held-out queries over the same held-out documents are resampled as one group
    (their first document): the gate says so rather than "on 1 document(s)" after the
    round logged two held-out documents. With fewer than three groups, every resample
    would draw the same: queries are resampled, and the gate says that."""
    groups = ("acme:a", "acme:a", "acme:b", "acme:b", "acme:c", "acme:c")
    candidate = ModelScore(0.0, 0.0, 0.1, 6, per_query_p3=(0.0,) * 6, query_documents=groups)
    production = ModelScore(0.667, 1.0, 0.1, 6, per_query_p3=(0.667,) * 6, query_documents=groups)
    decision = gate(candidate, production)
    assert not decision.promote
    assert decision.reason == ("P@3 would drop from 0.667 to 0.000 (lower in 100% of resamples of the 6 held-out "
                               "queries in 3 group(s) by first document): production kept")
    documents = ("acme:a", "acme:a")
    candidate = ModelScore(0.0, 0.0, 0.1, 2, per_query_p3=(0.0, 0.0), query_documents=documents)
    production = ModelScore(0.667, 1.0, 0.1, 2, per_query_p3=(0.667, 0.667), query_documents=documents)
    decision = gate(candidate, production)
    assert not decision.promote
    assert decision.reason == ("P@3 would drop from 0.667 to 0.000 (lower in 100% of resamples of the 2 held-out "
                               "queries): production kept")


def test_gate_does_not_promote_on_too_few_held_out_queries():
    """Two held-out queries show no drop either way; a candidate trained on one tenant's
    few verdicts replaced the model every tenant uses (docs/BENCHMARKS.md 8ap)."""
    better = ModelScore(0.667, 1.0, 0.1, 2)
    production = ModelScore(0.333, 1.0, 0.1, 2)
    assert gate(better, production).promote  # no minimum asked for
    decision = gate(better, production, min_queries=10)
    assert not decision.promote
    assert decision.reason.startswith("only 2 held-out feedback queries to judge it (P@3 0.333 -> 0.667, higher on "
                                      "them); promotion needs 10 (EVIDENTIA_RETRAIN_MIN_HELDOUT_QUERIES)")
    # a candidate lower on the few queries seen is said to be (the message then invites a promotion by hand)
    worse = gate(production, better, min_queries=10)
    assert not worse.promote and "(P@3 0.667 -> 0.333, lower on them)" in worse.reason
    promoted = gate(ModelScore(0.667, 1.0, 0.01834, 10), ModelScore(0.333, 1.0, 0.0184, 10))
    assert promoted.reason == "P@3 0.333 -> 0.667, ECE 0.018 -> 0.018: candidate promoted"
    assert gate(ModelScore(0.667, 1.0, 0.1, 10), ModelScore(0.333, 1.0, 0.1, 10), min_queries=10).promote


def test_gate_counts_only_held_out_queries_with_a_relevant_page():
    """Twelve held-out queries whose every verdict was "not relevant": P@3 0 -> 0 on all of
    them, which promoted a candidate that nothing had judged."""
    unjudged = ModelScore(0.0, None, 0.05, 12, (0.0,) * 12, with_relevant=0)
    decision = gate(unjudged, unjudged, min_queries=10)
    assert not decision.promote
    assert decision.reason.startswith("only 0 held-out feedback queries with a page judged relevant (of 12; on the "
                                      "others P@3 is 0 for any model) to judge it")
    judged = ModelScore(0.5, 1.0, 0.05, 12, (0.5,) * 12, with_relevant=10)
    assert gate(judged, judged, min_queries=10).promote


def test_evaluate_model_counts_the_queries_with_a_relevant_page(monkeypatch):
    from types import SimpleNamespace

    from evidentia.evaluation.queries import EvalQuery
    from evidentia.records import RankedPage
    from evidentia.training import retrain

    # a relevant page in the pool; none; one only outside it (a verdict on a page the search never
    # returned): P@3 0 for any model, so it cannot show a drop either
    queries = [EvalQuery("a", ("d",), "q1", "", frozenset({("d", 1)})), EvalQuery("b", ("d",), "q2", "", frozenset()),
               EvalQuery("c", ("d",), "q3", "", frozenset({("d", 40)}))]
    engine = SimpleNamespace(query=lambda question, answer: question)
    pages = [RankedPage(doc_id="d", page=1, score=1.0, probability=0.9)]
    reranker = SimpleNamespace(rerank=lambda query, pool: SimpleNamespace(pages=pages))
    monkeypatch.setattr(retrain, "first_stage_pool", lambda *a, **k: [])
    score = retrain.evaluate_model(reranker, queries, engine)
    assert (score.queries, score.with_relevant) == (3, 1)
