"""bench/paired_bootstrap.py: the ECE of a run's probabilities with a bootstrap interval."""

import json

from evidentia.evaluation.metrics import expected_calibration_error
from tests.utils.bench import bench_module


def test_the_ece_interval_is_that_of_eval_over_resampled_queries(tmp_path):
    pb = bench_module("paired_bootstrap")
    queries, run = tmp_path / "q.jsonl", tmp_path / "run.jsonl"
    rows, qs = [], []
    for n in range(30):  # page 1 relevant; its probability says 0.9, the others 0.2 (over-confident)
        qs.append({"id": f"q{n}", "doc_id": "d", "question": "x", "relevant_pages": [1]})
        ranking = [{"doc_id": "d", "page": p, "score": s, "probability": s}
                   for p, s in ((1, 0.9), (2, 0.2), (3, 0.2))]
        rows += [{"config": "hybrid+classifier", "id": f"q{n}", "ranking": ranking},
                 {"config": "hybrid", "id": f"q{n}", "ranking": [{"doc_id": "d", "page": 1, "score": 1.0}]}]
    queries.write_text("".join(json.dumps(q) + "\n" for q in qs))
    run.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs = pb.calibration_pairs(run, queries, "hybrid+classifier")
    assert len(pairs) == 30 and pairs["q0"] == [(0.9, 1), (0.2, 0), (0.2, 0)]
    ece, low, high, over = pb.ece_interval(pairs, 500, 0)
    assert ece == expected_calibration_error([0.9, 0.2, 0.2] * 30, [1, 0, 0] * 30) == 0.1 * 1 / 3 + 0.2 * 2 / 3
    assert low == high == ece and over == 1.0  # every query alike: every resample the same
    assert pb.calibration_pairs(run, queries, "hybrid") == {f"q{n}": [] for n in range(30)}  # no probability
