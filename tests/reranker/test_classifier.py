"""The classifier reranker: input windows, calibration, metadata, loading, and
reranking with tiny models (a BERT encoder and a Llama decoder without a pad
token) trained for a few steps by the real training code."""

from __future__ import annotations

import copy
import json
import math

import pytest
from typer.testing import CliRunner

from evidentia.records import Candidate, RankedPage
from evidentia.retriever.query import query_text
from evidentia.reranker.classifier_model import (
    METADATA_FILE,
    Calibration,
    InputFormat,
    ModelLoadError,
    ModelMetadata,
    encode_windows,
    load_tokenizer,
    load_trained,
    parameter_count,
    score_margins,
    upcast_unquantized,
)

from tests.utils import tiny_models as tm
from evidentia.retriever.query import build_query
from tests.utils.tiny_models import ANSWER, QUESTION, filler, irrelevant_page, relevant_page

KINDS = ["encoder", "llama"]

# PEFT calls a transformers method that transformers 5 deprecates; not ours to fix.
pytestmark = [pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning"),
              pytest.mark.slow]  # trains tiny models


@pytest.fixture(scope="module", params=KINDS)
def kind(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def tokenizer(kind, tmp_path_factory):
    return load_tokenizer(str(tm.base_model(kind, tmp_path_factory)))


@pytest.fixture(scope="module")
def trained(kind, tmp_path_factory):
    """(base dir, trained dir, metadata) of the tiny model of this kind."""
    return tm.trained_model(kind, tmp_path_factory)


@pytest.fixture(scope="module")
def reranker(trained):
    from evidentia.reranker.classifier import ClassifierReranker

    return ClassifierReranker(trained[1], threshold=None)


def with_(reranker, **changes):
    """A shallow copy sharing the loaded model, with some attributes changed."""
    other = copy.copy(reranker)
    for name, value in changes.items():
        setattr(other, name, value)
    return other


def query_ids(tokenizer, question=QUESTION, answer=ANSWER) -> list[int]:
    return tokenizer(query_text(question, answer), add_special_tokens=False)["input_ids"]


def page_ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def split_window(tokenizer, ids: list[int], n_query: int) -> tuple[list[int], list[int]]:
    """(query part, page part) of one window, checking the layout on the way:
    ``[CLS] q [SEP] page [SEP]`` for the encoder, ``<bos> q <bos> page`` for the decoder."""
    if tokenizer.cls_token_id is not None:
        assert ids[0] == tokenizer.cls_token_id
        assert ids[1 + n_query] == tokenizer.sep_token_id
        assert ids[-1] == tokenizer.sep_token_id
        return ids[1 : 1 + n_query], ids[2 + n_query : -1]
    bos = tokenizer.bos_token_id
    assert ids[0] == bos and ids[1 + n_query] == bos
    return ids[1 : 1 + n_query], ids[2 + n_query :]


# --- tiny models -----------------------------------------------------------------


def test_tiny_models_load_with_auto_classes(kind, tmp_path_factory):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = tm.base_model(kind, tmp_path_factory)
    raw = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForSequenceClassification.from_pretrained(str(path))
    assert model.config.num_labels == 2
    assert (path / "model.safetensors").is_file()
    if kind == "encoder":
        assert raw.cls_token == "[CLS]" and raw.sep_token == "[SEP]" and raw.pad_token == "[PAD]"
    else:
        assert raw.pad_token is None and raw.bos_token == "<s>" and raw.eos_token == "</s>"
        assert model.config.pad_token_id is None


def test_load_tokenizer_gives_decoders_a_pad_token(tokenizer, kind):
    assert tokenizer.pad_token_id is not None
    if kind == "llama":
        assert tokenizer.pad_token == tokenizer.eos_token
        assert tokenizer.cls_token_id is None


# --- encode_windows ----------------------------------------------------------------


def test_short_page_is_one_window_with_the_model_layout(tokenizer):
    page = relevant_page(0)
    windows = encode_windows(tokenizer, QUESTION, ANSWER, page, InputFormat(max_length=64))
    assert len(windows) == 1
    q = query_ids(tokenizer)
    q_part, p_part = split_window(tokenizer, windows[0], len(q))
    assert q_part == q
    assert p_part == page_ids(tokenizer, page)
    specials = 3 if tokenizer.cls_token_id is not None else 2
    assert len(windows[0]) == len(q) + len(p_part) + specials


def test_empty_page_gives_one_window_of_query_only(tokenizer):
    windows = encode_windows(tokenizer, QUESTION, ANSWER, "", InputFormat(max_length=64))
    assert len(windows) == 1
    q_part, p_part = split_window(tokenizer, windows[0], len(query_ids(tokenizer)))
    assert q_part == query_ids(tokenizer) and p_part == []


@pytest.mark.parametrize("max_length,overlap,words", [(32, 8, 150), (48, 16, 400), (40, 0, 61), (64, 64, 200)])
def test_long_page_windows_overlap_cover_the_page_and_fit(tokenizer, max_length, overlap, words):
    page = filler(words - 3) + " carbon emissions tonnes"  # the evidence is the last three words
    fmt = InputFormat(max_length=max_length, window_overlap=overlap, max_windows=100)
    q = query_ids(tokenizer)
    p = page_ids(tokenizer, page)
    assert len(p) == words
    windows = encode_windows(tokenizer, QUESTION, ANSWER, page, fmt)
    assert len(windows) > 1
    parts = []
    for ids in windows:
        assert len(ids) <= max_length
        q_part, p_part = split_window(tokenizer, ids, len(q))
        assert q_part == q  # the query is never cut
        parts.append(p_part)
    room = len(parts[0])
    step = room - min(overlap, room // 2)  # the overlap is capped at half a window
    for i, part in enumerate(parts):  # window i is the page slice starting at i * step
        assert part == p[i * step : i * step + room]
    for prev, part in zip(parts, parts[1:]):  # consecutive windows share exactly the overlap
        assert len(prev) == room  # only the last window may be shorter
        assert prev[step:] == part[: room - step]
    covered = set()
    for i, part in enumerate(parts):
        covered.update(range(i * step, i * step + len(part)))
    assert covered == set(range(len(p)))  # every page token is seen...
    assert (len(parts) - 1) * step + len(parts[-1]) == len(p)  # ...up to the evidence at the very bottom
    assert (len(parts) - 2) * step + room < len(p)  # and the last window is not redundant


def test_max_windows_bounds_very_long_pages(tokenizer):
    fmt = InputFormat(max_length=32, window_overlap=8, max_windows=3)
    windows = encode_windows(tokenizer, QUESTION, ANSWER, filler(1000), fmt)
    assert len(windows) == 3
    assert all(len(w) <= 32 for w in windows)
    # with enough windows allowed the same page needs many more
    assert len(encode_windows(tokenizer, QUESTION, ANSWER, filler(1000), InputFormat(32, 8, 1000))) > 3


def test_absurdly_long_query_is_capped_at_half_so_the_page_fits(tokenizer):
    question = " ".join(["carbon"] * 200)
    fmt = InputFormat(max_length=64, window_overlap=8, max_windows=4)
    windows = encode_windows(tokenizer, question, "", relevant_page(0), fmt)
    for ids in windows:
        assert len(ids) <= 64
        q_part, p_part = split_window(tokenizer, ids, 32)
        assert q_part == query_ids(tokenizer, question, "")[:32]
        assert p_part  # some page text always fits


# --- calibration and metadata -----------------------------------------------------------


def test_upcast_unquantized_gives_every_half_precision_weight_fp32(tmp_path_factory):
    # what a reloaded 4-bit model needs to compute the margins it was calibrated on
    # (the quantized weights themselves, bitsandbytes' Params4bit, stay as they are)
    import torch
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(tm.base_model("llama", tmp_path_factory)),
                                                               dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    upcast_unquantized(model)
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_parameter_count_counts_a_packed_4bit_matrix_at_its_full_shape():
    from types import SimpleNamespace

    import torch

    layer = torch.nn.Linear(8, 4)  # 32 weights + 4 biases
    assert parameter_count(layer) == 36
    # bitsandbytes keeps a 4-bit matrix as bytes of two weights each, its shape in quant_state
    layer.weight.quant_state = SimpleNamespace(shape=torch.Size([4, 16]))
    assert parameter_count(layer) == 64 + 4


def test_calibration_probability():
    identity = Calibration()
    assert identity.probability(0.0) == 0.5
    cal = Calibration(a=2.0, b=-1.0)
    assert cal.probability(0.0) == pytest.approx(1 / (1 + math.e))
    assert cal.probability(0.5) == pytest.approx(0.5)
    margins = [-1e6, -50.0, -3.0, -0.1, 0.0, 0.1, 0.5, 3.0, 50.0, 1e6]
    probs = [cal.probability(m) for m in margins]
    assert probs == sorted(probs)
    assert all(0.0 <= p <= 1.0 for p in probs)
    assert probs[0] == 0.0 and probs[-1] == 1.0  # no overflow at the extremes
    for m in margins[2:-2]:
        assert cal.probability(m) == pytest.approx(1 / (1 + math.exp(-(2.0 * m - 1.0))))


def test_metadata_round_trip(tmp_path):
    meta = ModelMetadata(
        base_model="some/base", input_format=InputFormat(128, 32, 4), calibration=Calibration(1.5, -0.25),
        metrics={"held_out": {"accuracy": 0.9, "f1": 0.8, "auroc": 0.95}},
        extra={"data_sha256": "ab" * 32, "params": {"lora_r": 32}},
    )
    meta.write(tmp_path)
    data = json.loads((tmp_path / METADATA_FILE).read_text())
    assert data["format"] == "evidentia-classifier/1" and data["data_sha256"] == "ab" * 32
    back = ModelMetadata.read(tmp_path)
    assert back == meta


def test_metadata_errors(tmp_path):
    with pytest.raises(ModelLoadError, match=f"not an Evidentia model directory.*{METADATA_FILE}"):
        ModelMetadata.read(tmp_path)
    (tmp_path / METADATA_FILE).write_text("{not json")
    with pytest.raises(ModelLoadError, match="unreadable metadata"):
        ModelMetadata.read(tmp_path)
    (tmp_path / METADATA_FILE).write_text(json.dumps({"format": "other/9", "base_model": "x"}))
    with pytest.raises(ModelLoadError, match="unknown model format"):
        ModelMetadata.read(tmp_path)


def test_load_errors_are_model_load_errors(tmp_path):
    from evidentia.config import ConfigError, Settings
    from evidentia.reranker.classifier import ClassifierReranker
    from evidentia.reranker.registry import create_reranker

    with pytest.raises(ModelLoadError, match="not an Evidentia model directory"):
        ClassifierReranker(tmp_path)
    with pytest.raises(ConfigError, match="not an Evidentia model directory"):
        create_reranker("classifier", Settings(data_dir=tmp_path, classifier_model=str(tmp_path)), 0.5)
    ModelMetadata(base_model=str(tmp_path / "no-such-base")).write(tmp_path)
    with pytest.raises(ModelLoadError, match="no-such-base"):
        load_trained(tmp_path)


def test_adapter_that_does_not_fit_the_base_is_a_model_load_error(tmp_path, trained):
    base, _, _ = trained
    ModelMetadata(base_model=str(base)).write(tmp_path)  # metadata but no adapter files
    with pytest.raises(ModelLoadError, match="cannot load the adapter"):
        load_trained(tmp_path)


# --- reranking with trained tiny models ---------------------------------------------------


def candidates() -> list[Candidate]:
    texts = [irrelevant_page(1), relevant_page(2), filler(300) + " carbon emissions", irrelevant_page(3) + " carbon",
             relevant_page(5, words=4), ""]
    return [Candidate(doc_id="rep", page=i + 1, score=10.0 - i, text=t, snippet=t[:20]) for i, t in enumerate(texts)]


def test_training_fitted_a_calibration(trained):
    _, _, meta = trained
    assert meta.extra["eval_records"] > 0
    assert (meta.calibration.a, meta.calibration.b) != (1.0, 0.0)
    assert meta.calibration.a != 0.0  # a collapsed fit would give every page p = 0.5
    assert set(meta.metrics["held_out"]) >= {"accuracy", "f1", "auroc"}


def test_rerank_returns_calibrated_probabilities_best_first(reranker):
    cands = candidates()
    result = reranker.rerank(build_query(QUESTION, ANSWER), cands)
    pages = result.pages
    assert len(pages) == len(cands)  # threshold None keeps everything
    assert all(isinstance(p, RankedPage) for p in pages)
    assert all(0.0 <= p.probability <= 1.0 and p.score == p.probability for p in pages)
    probs = [p.probability for p in pages]
    assert probs == sorted(probs, reverse=True)
    assert sorted((p.doc_id, p.page) for p in pages) == sorted((c.doc_id, c.page) for c in cands)
    by_page = {c.page: c for c in cands}
    assert all(p.text == by_page[p.page].text and p.snippet == by_page[p.page].snippet for p in pages)
    assert len(set(probs)) > 1  # the calibration does not flatten everything to one value
    assert result.info["scored"] == len(cands)


def test_threshold_drops_pages_below_it(reranker):
    cands = candidates()
    probs = sorted(p.probability for p in reranker.rerank(build_query(QUESTION, ANSWER), cands).pages)
    t = probs[len(probs) // 2]
    kept = with_(reranker, threshold=t).rerank(build_query(QUESTION, ANSWER), cands).pages
    assert [p.probability for p in kept] == sorted([p for p in probs if p >= t], reverse=True)
    assert all(p.probability >= t for p in kept) and len(kept) < len(cands)
    assert len(with_(reranker, threshold=0.0).rerank(build_query(QUESTION, ANSWER), cands).pages) == len(cands)
    top = with_(reranker, threshold=1.0).rerank(build_query(QUESTION, ANSWER), cands).pages
    assert all(p.probability == 1.0 for p in top)


def test_rank_aware_calibration_prefers_the_earlier_of_two_equal_pages(reranker):
    """With a rank term the same text is more probable higher in the first-stage pool;
    without one its place does not matter."""
    page = relevant_page(0)
    texts = [page, irrelevant_page(1), irrelevant_page(2), page]
    meta = copy.copy(reranker.metadata)
    meta.calibration = Calibration(a=reranker.metadata.calibration.a, b=reranker.metadata.calibration.b,
                                   rank_weight=-1.0)
    first, _, _, fourth = with_(reranker, metadata=meta).probabilities(QUESTION, ANSWER, texts)
    assert first > fourth
    assert first == pytest.approx(fourth / (fourth + (1 - fourth) * 4 ** -1.0))  # odds scaled by 4^-1
    plain = reranker.probabilities(QUESTION, ANSWER, texts)
    assert plain[0] == pytest.approx(plain[3])


def test_no_candidates_no_pages(reranker):
    assert reranker.rerank(build_query(QUESTION, ANSWER), []).pages == []
    assert with_(reranker, threshold=0.0).rerank(build_query(QUESTION, ANSWER), []).pages == []


def test_page_score_is_the_best_window(reranker, tokenizer):
    """A long page whose evidence is only at its very end is scored by its best
    window, the one that sees the evidence is among them."""
    fmt = InputFormat(max_length=40, window_overlap=8, max_windows=8)
    page = filler(120) + " carbon emissions were reduced"
    windows = encode_windows(tokenizer, QUESTION, ANSWER, page, fmt)
    assert 2 < len(windows) <= 8
    n_query = len(query_ids(tokenizer))
    window_texts = []
    for ids in windows:
        _, part = split_window(tokenizer, ids, n_query)
        text = tokenizer.decode(part)
        assert encode_windows(tokenizer, QUESTION, ANSWER, text, fmt) == [ids]  # the window alone, same ids
        window_texts.append(text)
    assert window_texts[-1].endswith("carbon emissions were reduced")
    model, tok = reranker.model, reranker.tokenizer
    per_window = score_margins(model, tok, [(QUESTION, ANSWER, t) for t in window_texts], fmt)
    [page_margin] = score_margins(model, tok, [(QUESTION, ANSWER, page)], fmt)
    assert page_margin == pytest.approx(max(per_window), abs=1e-5)
    [prob] = with_(reranker, input_format=fmt).probabilities(QUESTION, ANSWER, [page])
    calibration = reranker.metadata.calibration
    assert prob == pytest.approx(max(calibration.probability(m) for m in per_window), abs=1e-5)


def test_batching_does_not_change_probabilities(reranker):
    cands = candidates()
    texts = [c.text for c in cands]
    one = with_(reranker, batch_size=1).probabilities(QUESTION, ANSWER, texts)
    many = with_(reranker, batch_size=16).probabilities(QUESTION, ANSWER, texts)
    three = with_(reranker, batch_size=3).probabilities(QUESTION, ANSWER, texts)
    assert one == pytest.approx(many, abs=1e-5)
    assert one == pytest.approx(three, abs=1e-5)
    margins_1 = score_margins(reranker.model, reranker.tokenizer, [(QUESTION, ANSWER, t) for t in texts],
                              reranker.input_format, batch_size=1)
    margins_16 = score_margins(reranker.model, reranker.tokenizer, [(QUESTION, ANSWER, t) for t in texts],
                               reranker.input_format, batch_size=16)
    assert margins_1 == pytest.approx(margins_16, abs=1e-5)


def test_decoder_pads_with_its_eos_token(reranker, kind):
    config = reranker.model.config
    assert config.pad_token_id is not None and config.pad_token_id == reranker.tokenizer.pad_token_id
    if kind == "llama":
        assert config.pad_token_id == reranker.tokenizer.eos_token_id


def test_registry_builds_the_classifier(trained, tmp_path):
    from evidentia.config import Settings
    from evidentia.reranker.classifier import ClassifierReranker
    from evidentia.engine import parse_config
    from evidentia.reranker.registry import create_reranker

    _, out, meta = trained
    config = parse_config("bm25+classifier@0.3")
    r = create_reranker(config.reranker, Settings(data_dir=tmp_path, classifier_model=str(out), classifier_batch_size=3),
                        config.threshold)
    assert isinstance(r, ClassifierReranker) and r.outputs_probabilities
    assert (r.threshold, r.batch_size, r.model_dir, r.input_format) == (0.3, 3, out, meta.input_format)


def test_reranker_input_format_defaults_to_training_and_can_be_overridden(trained, reranker):
    from evidentia.reranker.classifier import ClassifierReranker

    _, out, meta = trained
    assert reranker.input_format == meta.input_format
    other = ClassifierReranker(out, max_length=64, window_overlap=0)
    assert other.input_format == InputFormat(64, 0, meta.input_format.max_windows)


# --- through the registry and the CLI ---------------------------------------------------------


@pytest.fixture
def search_env(cli_env, tmp_path, monkeypatch, tmp_path_factory):
    """A tiny trained encoder as EVIDENTIA_CLASSIFIER_MODEL and an indexed report:
    pages 1-3 mention the query's keywords, page 4 does not."""
    from evidentia.cli import app
    from evidentia.samples import write_pdf

    _, out, _ = tm.trained_model("encoder", tmp_path_factory)
    monkeypatch.setenv("EVIDENTIA_CLASSIFIER_MODEL", str(out))
    for name in ("EVIDENTIA_CLASSIFIER_THRESHOLD", "EVIDENTIA_CLASSIFIER_MAX_LENGTH",
                 "EVIDENTIA_CLASSIFIER_WINDOW_OVERLAP", "EVIDENTIA_CLASSIFIER_BATCH_SIZE"):
        monkeypatch.delenv(name, raising=False)
    pdf = write_pdf(tmp_path / "tiny-report.pdf", [
        relevant_page(0), irrelevant_page(1) + " carbon", "our emissions " + irrelevant_page(2), irrelevant_page(4),
    ])
    runner = CliRunner()
    result = runner.invoke(app, ["index", str(pdf)])
    assert result.exit_code == 0, result.output
    return runner, app


def test_cli_search_with_classifier(search_env):
    runner, app = search_env
    result = runner.invoke(app, ["search", "--doc", "tiny-report", "-q", QUESTION, "-a", ANSWER,
                                 "--reranker", "classifier", "--threshold", "0", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["reranker"] == "classifier" and out["fallback_reason"] is None
    pages = out["pages"]
    assert sorted(p["page"] for p in pages) == [1, 2, 3]  # threshold 0 keeps every BM25 candidate
    probs = [p["probability"] for p in pages]
    assert all(0.0 <= p <= 1.0 for p in probs)
    assert probs == sorted(probs, reverse=True)
    assert all(p["score"] == p["probability"] for p in pages)


def test_cli_search_rejects_threshold_above_one(search_env):
    runner, app = search_env
    result = runner.invoke(app, ["search", "--doc", "tiny-report", "-q", QUESTION,
                                 "--reranker", "classifier", "--threshold", "1.5", "--json"])
    assert result.exit_code != 0
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "threshold" in lines[0]


def test_cli_search_with_a_bad_model_dir(search_env, tmp_path, monkeypatch):
    runner, app = search_env
    monkeypatch.setenv("EVIDENTIA_CLASSIFIER_MODEL", str(tmp_path / "nothing-here"))
    result = runner.invoke(app, ["search", "--doc", "tiny-report", "-q", QUESTION, "--reranker", "classifier"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "not an Evidentia model directory" in lines[0]


def _calibration_case(tmp_path, tmp_path_factory, relevant_pages: list[int]):
    """A copy of the tiny trained model, its metadata file's text, and a one-query
    labelled file on the indexed tiny report."""
    import shutil

    _, out, _ = tm.trained_model("encoder", tmp_path_factory)
    model = tmp_path / "model"
    shutil.copytree(out, model)
    queries = tmp_path / "q.jsonl"
    queries.write_text(json.dumps({"id": "q1", "doc_id": "tiny-report", "question": QUESTION, "answer": ANSWER,
                                   "relevant_pages": relevant_pages}) + "\n")
    return model, (model / METADATA_FILE).read_text(), queries


def test_cli_calibrate_fits_on_pools_and_rewrites_the_metadata(search_env, tmp_path, tmp_path_factory):
    runner, app = search_env
    model, before, queries = _calibration_case(tmp_path, tmp_path_factory, [1])
    result = runner.invoke(app, ["calibrate", "--model", str(model), "--queries", str(queries)])
    assert result.exit_code == 0, result.output
    assert "calibrated on 1 queries, 3 pool pages (1 relevant), stages bm25" in result.stdout
    meta = ModelMetadata.read(model)
    assert meta.extra["pool_calibration"]["pages"] == 3 and meta.extra["pool_calibration"]["stages"] == ["bm25"]
    assert meta.to_json()["calibration"] != json.loads(before)["calibration"]
    # the rewritten model still loads and reranks
    from evidentia.reranker.classifier import ClassifierReranker

    assert len(ClassifierReranker(model).rerank(build_query(QUESTION, ANSWER), candidates()).pages) == len(candidates())


def test_cli_calibrate_fits_the_stage_searches_use_by_default(search_env, tmp_path, tmp_path_factory, monkeypatch):
    """Without --stage the pools are those of EVIDENTIA_STAGE, the stage the model
    will rerank (it was always bm25): here hybrid, which this index (no page
    embeddings) cannot serve."""
    runner, app = search_env
    model, before, queries = _calibration_case(tmp_path, tmp_path_factory, [1])
    monkeypatch.setenv("EVIDENTIA_STAGE", "hybrid")
    result = runner.invoke(app, ["calibrate", "--model", str(model), "--queries", str(queries)])
    assert result.exit_code == 3  # the backend cannot serve that stage here, and says why
    # (in this test process the model loader's bar may precede it: the CLI hides it only
    # when it is imported after the CLI started, as in a real run)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no page embeddings for document(s) tiny-report" in errors[0] and "bm25" in errors[0]
    assert (model / METADATA_FILE).read_text() == before


def test_cli_calibrate_never_rewrites_the_shipped_model(search_env):
    from evidentia.reranker.classifier_model import SHIPPED_MODEL_DIR

    runner, app = search_env
    before = (SHIPPED_MODEL_DIR / METADATA_FILE).read_bytes()
    result = runner.invoke(app, ["calibrate", "--model", str(SHIPPED_MODEL_DIR), "--queries", "q.jsonl"])
    assert result.exit_code == 2  # usage
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "not recalibrated in place: copy it" in lines[0]
    assert (SHIPPED_MODEL_DIR / METADATA_FILE).read_bytes() == before


@pytest.mark.parametrize("args, message", [
    (["--stage", "bm26"], "--stage: choose from"),
    (["--pool-size", "0"], "--pool-size must be a positive integer"),
])
def test_cli_calibrate_rejects_bad_options(search_env, tmp_path, tmp_path_factory, args, message):
    runner, app = search_env
    _, out, _ = tm.trained_model("encoder", tmp_path_factory)
    queries = tmp_path / "q.jsonl"
    queries.write_text(json.dumps({"id": "q1", "doc_id": "tiny-report", "question": QUESTION, "answer": ANSWER,
                                   "relevant_pages": [1]}) + "\n")
    result = runner.invoke(app, ["calibrate", "--model", str(out), "--queries", str(queries), *args])
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_cli_calibrate_without_a_relevant_page_in_any_pool_changes_nothing(search_env, tmp_path, tmp_path_factory):
    runner, app = search_env
    model, before, queries = _calibration_case(tmp_path, tmp_path_factory, [4])  # page 4 never reaches the BM25 pool
    result = runner.invoke(app, ["calibrate", "--model", str(model), "--queries", str(queries)])
    assert result.exit_code == 1  # bad input
    assert "both relevant and non-relevant" in result.stderr
    assert (model / METADATA_FILE).read_text() == before
