"""Calibration on first-stage pools: the rank-aware probability, its fit, and its
round trip through the model's metadata."""

from __future__ import annotations

import json
import math
import random

import pytest

from evidentia.reranker.classifier_model import METADATA_FILE, Calibration, ModelMetadata
from evidentia.training.calibrate import CalibrationError, PoolPage, calibrate, fit_pool_calibration


def sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-z))


def test_probability_weighs_the_rank_in_log_space():
    cal = Calibration(a=1.0, b=0.5, rank_weight=-1.0)
    assert cal.probability(0.0, 1) == pytest.approx(sigmoid(0.5))  # ln 1 = 0: Platt at the top of the pool
    assert cal.probability(0.0, 20) == pytest.approx(sigmoid(0.5 - math.log(20)))
    probs = [cal.probability(1.0, r) for r in range(1, 21)]
    assert probs == sorted(probs, reverse=True) and probs[0] > probs[-1]
    plain = Calibration(a=1.0, b=0.5)
    assert {plain.probability(1.0, r) for r in (1, 2, 20)} == {plain.probability(1.0)}


def test_metadata_without_rank_weight_loads_as_platt(tmp_path):
    meta = ModelMetadata(base_model="some/base", calibration=Calibration(2.0, -1.0))
    meta.write(tmp_path)
    data = json.loads((tmp_path / METADATA_FILE).read_text())
    del data["calibration"]["rank_weight"]  # a model written before the rank term existed
    (tmp_path / METADATA_FILE).write_text(json.dumps(data))
    assert ModelMetadata.read(tmp_path).calibration == Calibration(2.0, -1.0, 0.0)
    meta.calibration = Calibration(2.0, -1.0, -0.75)
    meta.write(tmp_path)
    assert ModelMetadata.read(tmp_path).calibration.rank_weight == -0.75
    assert not list(tmp_path.glob(".*tmp"))  # the atomic write leaves no temporary file


def synthetic_pools(a: float, c: float, b: float, queries: int = 300, pool: int = 20, seed: int = 1):
    rng = random.Random(seed)
    pages = []
    for q in range(queries):
        for rank in range(1, pool + 1):
            margin = rng.gauss(0.0, 2.0)
            relevant = int(rng.random() < sigmoid(a * margin + c * math.log(rank) + b))
            pages.append(PoolPage(f"q{q}", margin, rank, relevant))
    return pages


def test_fit_recovers_the_generating_coefficients():
    fitted = fit_pool_calibration(synthetic_pools(a=1.5, c=-1.0, b=-1.0))
    assert fitted.a == pytest.approx(1.5, abs=0.25)
    assert fitted.rank_weight == pytest.approx(-1.0, abs=0.25)
    assert fitted.b == pytest.approx(-1.0, abs=0.5)


def test_fit_gives_no_rank_weight_when_the_rank_carries_nothing():
    fitted = fit_pool_calibration(synthetic_pools(a=1.0, c=0.0, b=-2.0, seed=2))
    assert abs(fitted.rank_weight) < 0.2 and fitted.a == pytest.approx(1.0, abs=0.2)


def test_fit_with_constant_margins_uses_the_rank_alone():
    pages = [PoolPage(p.query_id, 0.3, p.rank, p.relevant) for p in synthetic_pools(a=0.0, c=-1.5, b=0.0, seed=3)]
    fitted = fit_pool_calibration(pages)
    assert fitted.a == 0.0 and fitted.rank_weight < -1.0


def test_fit_needs_relevant_and_non_relevant_pages():
    with pytest.raises(CalibrationError, match="both relevant and non-relevant"):
        fit_pool_calibration([PoolPage("q", 1.0, r, 0) for r in range(1, 6)])


def test_calibrate_writes_the_fit_into_the_metadata_and_reports(tmp_path):
    ModelMetadata(base_model="some/base", calibration=Calibration(1.0, 0.0)).write(tmp_path)
    pages = synthetic_pools(a=1.5, c=-1.0, b=-1.0, queries=100)
    result = calibrate(tmp_path, pages, ["bm25", "hybrid"], queries_source="q.jsonl")
    meta = ModelMetadata.read(tmp_path)
    assert meta.calibration == result.calibration and meta.calibration.rank_weight < 0
    info = meta.extra["pool_calibration"]
    assert info["stages"] == ["bm25", "hybrid"] and info["queries"] == 100 and info["pages"] == 2000
    assert info["relevant"] == sum(p.relevant for p in pages) and info["source"] == "q.jsonl"
    # in-sample the fit is better calibrated than the identity it replaces
    assert result.fitted.ece < result.previous.ece
    assert 0.0 <= result.fitted.p_at_3 <= 1.0


def test_calibrate_never_reverses_the_models_order(tmp_path):
    """Pools on which the margin falls as relevance rises fit a < 0: the pages the
    model finds least relevant would come first. Refused, the model file untouched
    (a features model: tests/reranker/test_features.py)."""
    ModelMetadata(base_model="some/base", calibration=Calibration(1.0, 0.0)).write(tmp_path)
    before = (tmp_path / METADATA_FILE).read_text()
    with pytest.raises(CalibrationError, match="does not rise with relevance"):
        calibrate(tmp_path, synthetic_pools(a=-1.5, c=-1.0, b=-1.0, queries=100), ["bm25"])
    assert (tmp_path / METADATA_FILE).read_text() == before


def test_cli_prints_no_rank_term_for_a_features_model(cli_env, multilingual_pdf, tmp_path):
    """A features model's fit never reads the place in the pool: its fitted formula has no
    rank term (it printed "+0.000 * ln(rank)")."""
    import shutil

    from typer.testing import CliRunner

    from evidentia.cli import app
    from evidentia.reranker.model_registry import SHIPPED_MODEL_DIR

    model = shutil.copytree(SHIPPED_MODEL_DIR, tmp_path / "model")
    doc = multilingual_pdf.doc_id
    asked = [("What were the greenhouse gas emissions?", "12,450 tonnes", 1),
             ("How many suppliers were audited?", "87 %", 2),
             ("What share of electricity was renewable?", "64 %", 3)]
    queries = tmp_path / "queries.jsonl"
    queries.write_text("".join(json.dumps({"id": f"q{i}", "doc_id": doc, "question": q, "answer": a,
                                           "relevant_pages": [page]}) + "\n"
                               for i, (q, a, page) in enumerate(asked)))
    result = CliRunner().invoke(app, ["calibrate", "--model", str(model), "--queries", str(queries),
                                      "--pdf-dir", str(multilingual_pdf.path.parent)])
    assert result.exit_code == 0, result.output
    fitted = [line for line in result.stdout.splitlines() if line.startswith("calibrated on ")]
    assert len(fitted) == 1 and "* margin " in fitted[0] and "ln(rank)" not in fitted[0]
