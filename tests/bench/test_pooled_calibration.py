"""bench/pooled_calibration.py: the ECE of several runs' pages together."""

import json

import pytest

from evidentia.evaluation.metrics import expected_calibration_error
from tests.utils.bench import bench_module


def _module():
    return bench_module("pooled_calibration")


def _write(tmp_path, name, rankings):
    """One query a ranking: [(page, probability, relevant)]; the run and its queries."""
    run, queries = tmp_path / f"run-{name}.jsonl", tmp_path / f"q-{name}.jsonl"
    with run.open("w") as r, queries.open("w") as q:
        for i, ranking in enumerate(rankings):
            qid = f"{name}-{i}"
            q.write(json.dumps({"id": qid, "doc_id": name, "relevant_pages": [p for p, _, rel in ranking if rel]}) + "\n")
            for config in ("hybrid+classifier", "hybrid+other"):
                r.write(json.dumps({"config": config, "id": qid, "ranking": [
                    {"doc_id": name, "page": p, "probability": prob if config == "hybrid+classifier" else 0.5}
                    for p, prob, _ in ranking]}) + "\n")
    return run, queries


def test_runs_are_pooled_page_by_page(tmp_path):
    module = _module()
    a = _write(tmp_path, "a", [[(1, 0.9, True), (2, 0.1, False)], [(3, 0.8, False)]])
    b = _write(tmp_path, "b", [[(4, 0.3, True), (5, 0.05, False), (6, 0.2, False)]])
    probabilities, labels = module.pooled_pairs([a, b], "hybrid+classifier")
    assert probabilities == [0.9, 0.1, 0.8, 0.3, 0.05, 0.2] and labels == [1, 0, 0, 1, 0, 0]
    assert module.pooled_pairs([a], "hybrid+other")[0] == [0.5, 0.5, 0.5]  # the configuration asked for


def test_pooled_ece_is_the_pages_together_not_the_mean_of_the_runs(tmp_path):
    module = _module()
    a = _write(tmp_path, "a", [[(1, 0.25, True)]])  # alone: ECE 0.75
    b = _write(tmp_path, "b", [[(2, 0.25, False)]])  # alone: ECE 0.25
    assert expected_calibration_error(*module.pooled_pairs([a], "hybrid+classifier")) == pytest.approx(0.75)
    # together one bin: p 0.25, half relevant
    assert expected_calibration_error(*module.pooled_pairs([a, b], "hybrid+classifier")) == pytest.approx(0.25)


def test_a_run_without_the_configuration_is_refused(tmp_path):
    module = _module()
    a = _write(tmp_path, "a", [[(1, 0.9, True)]])
    with pytest.raises(SystemExit, match="no ranking of configuration 'bm25'"):
        module.pooled_pairs([a], "bm25")
