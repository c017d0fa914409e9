"""The query adapter (reranker/query_adapter.py) and its fit (training/query_adapter.py)."""

from __future__ import annotations

import numpy as np
import pytest

from evidentia.reranker.query_adapter import FILE_NAME, QueryAdapter
from evidentia.training.query_adapter import fit_query_adapter


def _unit(v):
    v = np.asarray(v, dtype=np.float32)
    return v / np.linalg.norm(v)


def test_a_zero_adapter_leaves_the_query_as_it_is():
    q = _unit([3.0, 4.0, 0.0])
    assert np.allclose(QueryAdapter(np.zeros((3, 3), np.float32)).adapt(q), q)


def test_the_adapted_query_is_unit_length_and_another_encoders_vector_is_untouched():
    adapter = QueryAdapter(np.diag([1.0, -0.5, 2.0]).astype(np.float32))
    moved = adapter.adapt(_unit([1.0, 1.0, 1.0]))
    assert np.isclose(np.linalg.norm(moved), 1.0)
    other = _unit([1.0, 2.0, 3.0, 4.0])  # four dimensions: not what it was fitted on
    assert np.array_equal(adapter.adapt(other), other)


def test_the_adapter_is_saved_with_the_model(tmp_path):
    assert QueryAdapter.load(tmp_path) is None  # a model trained before adapters
    matrix = np.arange(9, dtype=np.float32).reshape(3, 3) / 10
    QueryAdapter(matrix).save(tmp_path)
    assert np.array_equal(QueryAdapter.load(tmp_path).matrix, matrix)
    np.save(tmp_path / FILE_NAME, np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="square"):
        QueryAdapter.load(tmp_path)


def _pools(n_pools=40, seed=0):
    """Pools in which the relevant page leans along a direction the query does not
    show (axis 0), and the irrelevant pages share the query's own direction more."""
    rng = np.random.default_rng(seed)
    pools = []
    for _ in range(n_pools):
        topic = np.zeros(8)
        topic[1 + rng.integers(0, 7)] = 1.0
        query = _unit(topic + 0.3 * rng.normal(size=8))
        relevant = _unit(0.9 * np.eye(8)[0] + 0.6 * topic + 0.1 * rng.normal(size=8))
        decoys = [_unit(topic + 0.15 * rng.normal(size=8)) for _ in range(4)]
        pools.append((query, [relevant[None, :]] + [d[None, :] for d in decoys], [1.0, 0.0, 0.0, 0.0, 0.0]))
    return pools


def _first_is_best(adapter, pools):
    hits = 0
    for query, pages, _labels in pools:
        q = adapter.adapt(query) if adapter is not None else query
        scores = [float((w @ q).max()) for w in pages]
        hits += int(np.argmax(scores) == 0)
    return hits / len(pools)


def test_the_fit_learns_what_the_judged_pages_say_and_ranks_new_pools_better():
    adapter = fit_query_adapter(_pools(n_pools=200, seed=0), penalty=0.001, steps=200, learning_rate=0.02)
    unseen = _pools(seed=1)
    assert _first_is_best(None, unseen) < 0.5  # the plain cosine prefers the decoys
    assert _first_is_best(adapter, unseen) > 0.9


def test_the_fit_is_the_same_every_run_and_needs_pools_with_both_verdicts():
    pools = _pools(n_pools=10)
    assert np.array_equal(fit_query_adapter(pools, steps=20).matrix, fit_query_adapter(pools, steps=20).matrix)
    q, pages, _ = pools[0]
    assert fit_query_adapter([(q, pages, [0.0] * len(pages)), (q, pages, [1.0] * len(pages))]) is None


def test_documents_that_share_an_answered_query_are_one_family():
    from evidentia.training.dataset import FOREIGN_SOURCE, TrainingRecord
    from evidentia.training.train_features import document_families

    records = [
        TrainingRecord("Targets?", "Net zero by 2050.", "text", 1, "report", 1),
        TrainingRecord("Targets?", "Net zero by 2050.", "text", 1, "report_printed", 2),
        TrainingRecord("Targets?", "", "text", 1, "other_report", 1),  # the same question, unanswered
        TrainingRecord("Targets?", "Net zero by 2050.", "text", 0, "filing", 3, source=FOREIGN_SOURCE),
        TrainingRecord("Revenue?", "$5bn", "text", 1, "filing", 4),
    ]
    families = document_families(records)
    assert families[0] == families[1]
    assert len({families[0], families[2], families[4]}) == 3
    # one company's reports, named by a prefix (--memory-family-docs): one family, whatever they ask
    records += [TrainingRecord("Scope 3?", "", "text", 1, "BHP_climate", 1),
                TrainingRecord("Scope 3?", "", "text", 0, "BHP_plan", 2)]
    assert len(set(document_families(records)[-2:])) == 2  # unanswered: not linked by the question
    linked = document_families(records, ("BHP_",))
    assert linked[-1] == linked[-2] and linked[:5] == families
