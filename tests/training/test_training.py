"""Training records (ClimRetrieve passages, labelled queries + BM25 negatives,
JSONL files) and LoRA training of a tiny model, directly and through the CLI."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from safetensors import safe_open
from typer.testing import CliRunner

from evidentia.cli import app
from evidentia.reranker.classifier_model import METADATA_FILE, ModelMetadata
from evidentia.training.dataset import (
    DatasetError,
    TrainingRecord,
    dedupe,
    file_sha256,
    read_records,
    records_from_climretrieve,
    records_from_queries,
    split_groups,
    write_records,
)
from evidentia.training.train import TrainingError, TrainParams, train

from tests.utils import tiny_models as tm
from evidentia.engine import Engine
from evidentia.config import Settings

# PEFT calls a transformers method that transformers 5 deprecates; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")


def rec(text: str, relevance: int, question: str = "q", doc: str = "d", page: int | None = 1) -> TrainingRecord:
    return TrainingRecord(question, "a", text, relevance, doc, page, "test")


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


# --- ClimRetrieve passages ---------------------------------------------------------------------

PASSAGES = [
    # report A, question 1: one passage with context, one without (context "nan")
    {"report": "A", "question": "Q1", "answer": "ans1", "relevant_text": "t-a1", "context": "ctx-a1",
     "relevance": 1, "printed_page": 3},
    {"report": "A", "question": "Q1", "answer": "ans1", "relevant_text": "t-a2", "context": "nan",
     "relevance": 2, "printed_page": "n/a"},
    # report A, question 2: t-a1 is marked for Q1 as well, so it may never be a Q1 negative
    {"report": "A", "question": "Q2", "answer": "ans2", "relevant_text": "t-a1", "context": "ctx-a1-seen-by-q2",
     "relevance": 1, "printed_page": 4},
    {"report": "A", "question": "Q2", "answer": "ans2", "relevant_text": "t-a3", "context": "ctx-a3",
     "relevance": 1, "printed_page": 7},
    {"report": "A", "question": "Q3", "answer": "", "relevant_text": "t-a4", "context": None,
     "relevance": 0, "printed_page": 9},
    # report B, question 1: other report, never a negative for report A
    {"report": "B", "question": "Q1", "answer": "ans1", "relevant_text": "t-b1", "context": "ctx-b1",
     "relevance": 1, "printed_page": 1},
    {"report": "B", "question": "Q9", "answer": "", "relevant_text": "t-b9", "context": "ctx-b9",
     "relevance": 1, "printed_page": 2},
]


@pytest.fixture
def passages_dir(tmp_path) -> Path:
    folder = tmp_path / "climretrieve"
    folder.mkdir()
    (folder / "passages.jsonl").write_text("".join(json.dumps(r) + "\n" for r in PASSAGES) + "\n")
    return folder


def test_climretrieve_positives_and_negatives(passages_dir):
    records = list(records_from_climretrieve(passages_dir / "passages.jsonl", negatives_per_positive=10))
    assert {r.source for r in records} == {"climretrieve"}
    positives = {(r.doc_id, r.question, r.page_text, r.page) for r in records if r.relevance == 1}
    assert positives == {
        ("A", "Q1", "ctx-a1", 3),  # the context, which reads like a page
        ("A", "Q1", "t-a2", None),  # no context: the marked text itself; "n/a" is no page number
        ("A", "Q2", "ctx-a1-seen-by-q2", 4),
        ("A", "Q2", "ctx-a3", 7),
        ("B", "Q1", "ctx-b1", 1),
        ("B", "Q9", "ctx-b9", 2),
    }  # the relevance-0 row is no positive
    assert all(r.answer == {"Q1": "ans1", "Q2": "ans2", "Q9": ""}[r.question] for r in records)

    def negatives(report, question):
        return {r.page_text for r in records if r.relevance == 0 and r.doc_id == report and r.question == question}

    # Q1 in A: only passages of other questions of A, and not t-a1's, which Q1 marked too
    assert negatives("A", "Q1") == {"ctx-a3", "t-a4"}
    # Q2 in A: passages of Q1 and Q3; ctx-a1 is Q1's page for t-a1, which Q2 marked as well
    assert negatives("A", "Q2") == {"t-a2", "t-a4"}
    assert negatives("B", "Q1") == {"ctx-b9"} and negatives("B", "Q9") == {"ctx-b1"}
    for r in records:  # a negative never comes from another report
        if r.relevance == 0:
            assert r.page_text in {p["context"] if p["context"] not in (None, "nan") else p["relevant_text"]
                                   for p in PASSAGES if p["report"] == r.doc_id}


def test_climretrieve_negatives_per_positive_and_min_relevance(passages_dir):
    path = passages_dir / "passages.jsonl"
    one = list(records_from_climretrieve(path, negatives_per_positive=1))
    assert sum(r.relevance == 0 for r in one) == sum(r.relevance == 1 for r in one) == 6
    assert one == list(records_from_climretrieve(path, negatives_per_positive=1))  # seeded
    strict = list(records_from_climretrieve(path, negatives_per_positive=0, min_relevance=2))
    assert [(r.question, r.page_text, r.relevance) for r in strict] == [("Q1", "t-a2", 1)]


def test_climretrieve_mark_without_any_text_makes_no_record(tmp_path):
    """A row with "nan" for both its passage and its context (17 in ClimRetrieve, 7 rated
    relevant) is neither evidence nor a negative: as the page text "nan" it was
    evidence a model learnt to rank first (docs/BENCHMARKS.md 8r)."""
    path = tmp_path / "passages.jsonl"
    rows = [dict(PASSAGES[0]), {**PASSAGES[0], "question": "Q7", "relevant_text": "nan", "context": "nan"},
            {**PASSAGES[0], "question": "Q8", "relevant_text": "t-q8", "context": None, "relevance": 2}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = list(records_from_climretrieve(path, negatives_per_positive=5))
    assert records and all(r.page_text.strip().lower() not in ("", "nan") for r in records)
    assert "Q7" not in {r.question for r in records}


def test_climretrieve_bad_line_is_named(tmp_path):
    path = tmp_path / "passages.jsonl"
    path.write_text(json.dumps(PASSAGES[0]) + "\n{broken\n")
    with pytest.raises(DatasetError, match="line 2: invalid JSON"):
        list(records_from_climretrieve(path))


# --- labelled queries + BM25 negatives ------------------------------------------------------------


def test_records_from_queries(backend, detector, make_pdf):
    from evidentia.evaluation.queries import EvalQuery
    from evidentia.indexing import index_pdf

    report = make_pdf("report.pdf", [
        "Our carbon emissions were reduced by 12 % in 2023 compared with the previous year.",
        "The canteen now serves carbon neutral coffee to every employee at lunch.",
        "The football team travelled by bus, and the emissions of the bus were offset.",
        "The garden party and the summer picnic took place in June with live music.",
        "",
        "Carbon emissions: scope 1 and scope 2 emissions were reduced again this year.",
    ])
    other = make_pdf("other.pdf", ["Carbon emissions were reduced at the other company as well."])
    index_pdf(report, backend, detector)
    index_pdf(other, backend, detector)
    query = EvalQuery(id="q1", doc_ids=("report",), question="What were the carbon emissions?",
                      answer="Emissions were reduced.", relevant=frozenset({("report", 1), ("report", 5),
                                                                              ("report", 6)}))
    engine = Engine(Settings(), backend=backend)
    records = list(records_from_queries([query], engine, negatives_per_query=10, document_negatives=0))
    positives = [r for r in records if r.relevance == 1]
    negatives = [r for r in records if r.relevance == 0]
    # the relevant pages with text (page 5 is empty), with the indexed text
    assert [(r.doc_id, r.page) for r in positives] == [("report", 1), ("report", 6)]
    assert all(r.page_text == backend.get_page(r.doc_id, r.page).text for r in records)
    # BM25 candidates that are not relevant, in BM25 order; page 4 matches no keyword
    assert {(r.doc_id, r.page) for r in negatives} == {("report", 2), ("report", 3)}
    assert all(r.question == query.question and r.answer == query.answer and r.source == "queries"
               for r in records)
    few = list(records_from_queries([query], engine, negatives_per_query=1, document_negatives=0))
    few_negatives = [r for r in few if r.relevance == 0]
    assert len(few_negatives) == 1 and few_negatives[0] == negatives[0]
    assert [r for r in few if r.relevance == 1] == positives
    none = list(records_from_queries([query], engine, negatives_per_query=0, document_negatives=0))
    assert all(r.relevance == 1 for r in none)
    # pages from the rest of the document: neither relevant nor in the pool (pages 2 and 3,
    # even where only one of them is taken as a negative), with text: page 4 alone
    more = list(records_from_queries([query], engine, negatives_per_query=1, document_negatives=5))
    far = [r for r in more if r.source == "document"]
    assert [(r.doc_id, r.page, r.relevance) for r in far] == [("report", 4, 0)]
    assert far[0].page_text == backend.get_page("report", 4).text
    assert [r for r in more if r.source != "document"] == few
    # a page judged to answer in part is neither a positive nor a negative, in the pool or not
    partly = EvalQuery(id="q1", doc_ids=("report",), question=query.question, answer=query.answer,
                       relevant=frozenset({("report", 1)}), partly_relevant=frozenset({("report", 6), ("report", 4)}))
    judged = list(records_from_queries([partly], engine, negatives_per_query=10, document_negatives=5))
    assert [(r.page, r.relevance) for r in judged if r.relevance == 1] == [(1, 1)]
    assert {r.page for r in judged if r.relevance == 0} == {2, 3}


# --- dedupe, files, splits -------------------------------------------------------------------------


def test_dedupe_keeps_one_record_per_text_and_positive_wins():
    records = [rec("x", 0), rec("x", 1, doc="other"), rec("x", 0), rec("y", 0), rec("y", 0, question="q2"),
               rec("z", 1), rec("z", 0)]
    out = dedupe(records)
    assert sorted((r.question, r.page_text, r.relevance) for r in out) == [
        ("q", "x", 1), ("q", "y", 0), ("q", "z", 1), ("q2", "y", 0)]
    assert dedupe(out) == out


def test_write_and_read_records_round_trip(tmp_path):
    records = [rec("page one – ünïcode", 1, page=None), rec("page two", 0, doc="d2", page=7)]
    path = tmp_path / "sub" / "records.jsonl"
    digest = write_records(records, path)
    assert digest == file_sha256(path) and len(digest) == 64
    assert read_records(path) == records
    assert "ünïcode" in path.read_text(encoding="utf-8")


@pytest.mark.parametrize("bad_line,message", [
    ("{not json", "line 3: invalid JSON"),
    ('["a list"]', "line 3: expected a JSON object"),
    ('{"question": "q", "answer": "a", "relevance": 1}', "line 3: missing field 'page_text'"),
    ('{"question": "q", "answer": "a", "page_text": "p", "relevance": 2}', "line 3: relevance must be 0 or 1"),
    ('{"question": "q", "answer": "a", "page_text": "p", "relevance": true}', "line 3: field 'relevance' must be int"),
    ('{"question": "q", "answer": 5, "page_text": "p", "relevance": 0}', "line 3: field 'answer' must be str"),
])
def test_read_records_names_the_bad_line(tmp_path, bad_line, message):
    path = tmp_path / "records.jsonl"
    path.write_text(rec("ok", 1).to_json() + "\n\n" + bad_line + "\n")  # line 2 is blank
    with pytest.raises(DatasetError, match=message) as info:
        read_records(path)
    assert str(path) in str(info.value)


def test_read_records_empty_file(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text("\n")
    with pytest.raises(DatasetError, match="no records"):
        read_records(path)


def test_split_groups_is_deterministic_and_disjoint():
    groups = [f"doc{i}" for i in range(10)] * 3
    held = split_groups(groups, 0.3, seed=0)
    assert len(held) == 3 and held <= set(groups)
    assert split_groups(list(reversed(groups)), 0.3, seed=0) == held
    assert split_groups(groups, 0.3, seed=0) == held
    train_groups = set(groups) - held
    assert train_groups and not (train_groups & held)
    assert len(split_groups(groups, 0.01, seed=0)) == 1  # a positive share holds out at least one
    assert split_groups(groups, 0.0) == set()  # no share, nothing held out
    assert split_groups([], 0.5) == set()
    assert any(split_groups(groups, 0.3, seed=s) != held for s in range(1, 5))


# --- training -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(base dir, trained dir, metadata) of the tiny encoder trained with the default LoRA settings."""
    return tm.trained_model("encoder", tmp_path_factory)


def linear_names(model) -> set[str]:
    import torch

    return {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


@pytest.mark.slow
def test_train_writes_metadata(trained):
    base, out, meta = trained
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", "adapter_model.safetensors",
                                                     METADATA_FILE]
    data = json.loads((out / METADATA_FILE).read_text())
    assert data["base_model"] == str(base)
    assert data["data_sha256"] == "0" * 64
    assert datetime.fromisoformat(data["created"]).tzinfo is not None
    assert data["params"]["lora_r"] == 32 and data["params"]["lora_alpha"] == 16
    assert data["params"]["max_steps"] == data["metrics"]["steps"]
    for split in ("held_out", "held_out_calibrated"):
        assert {"accuracy", "f1", "auroc"} <= set(data["metrics"][split])
        assert all(0.0 <= data["metrics"][split][k] <= 1.0 for k in ("accuracy", "f1", "auroc"))
    assert data["input_format"] == {"max_length": 256, "window_overlap": 64, "max_windows": 8}
    records = tm.training_records()
    held = set(data["held_out_documents"])
    assert held and held < {r.doc_id for r in records}  # some documents held out, not all
    assert data["eval_records"] == sum(r.doc_id in held for r in records)
    assert data["train_records"] + data["eval_records"] == len(records)
    assert ModelMetadata.read(out) == meta


@pytest.mark.slow
def test_train_writes_a_lora_adapter_and_a_fully_trained_head(trained):
    import torch
    from transformers import AutoModelForSequenceClassification

    base, out, _ = trained
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 32 and config["lora_alpha"] == 16
    assert "classifier" in config["modules_to_save"]
    base_model = AutoModelForSequenceClassification.from_pretrained(str(base))
    targets = {t.rsplit(".", 1)[-1] for t in config["target_modules"]}
    assert targets == linear_names(base_model) - {"classifier"}  # every linear layer but the head
    with safe_open(str(out / "adapter_model.safetensors"), "pt") as fh:
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    head = {k: v for k, v in tensors.items() if "lora_" not in k}
    # only LoRA matrices and the head: no copy of the base model's weights
    assert set(head) == {"base_model.model.classifier.weight", "base_model.model.classifier.bias"}
    weight = head["base_model.model.classifier.weight"]
    assert tuple(weight.shape) == (2, 32)  # the whole head, not a low-rank update of it
    assert not torch.equal(weight, base_model.classifier.weight.detach())  # and it was trained
    assert any(k.endswith("lora_A.weight") for k in tensors) and any(k.endswith("lora_B.weight") for k in tensors)


@pytest.mark.slow
def test_training_changes_only_lora_and_head(tmp_path, tmp_path_factory, monkeypatch):
    """The model in memory after training: base weights as loaded, LoRA and head trained."""
    import torch
    from transformers import AutoModelForSequenceClassification

    import evidentia.training.train as train_mod

    base = tm.base_model("encoder", tmp_path_factory)
    captured = {}
    real = train_mod._lora_model

    def spy(model, params):
        captured["model"] = real(model, params)
        return captured["model"]

    monkeypatch.setattr(train_mod, "_lora_model", spy)
    train(tm.training_records(), str(base), tmp_path / "m", TrainParams(max_steps=4, learning_rate=1e-2),
          log=lambda _m: None, progress=False)
    model = captured["model"]
    original = AutoModelForSequenceClassification.from_pretrained(str(base)).state_dict()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or "modules_to_save" in n for n in trainable)
    assert any("classifier.modules_to_save" in n for n in trainable)
    compared = 0
    for name, param in model.named_parameters():
        if "lora_" in name or "modules_to_save" in name:
            continue
        key = name.removeprefix("base_model.model.").replace(".base_layer.", ".").replace(".original_module.", ".")
        assert torch.equal(param.detach().cpu(), original[key]), name
        compared += 1
    assert compared >= len([k for k in original if "embeddings" in k or "LayerNorm" in k])
    head = dict(model.named_parameters())["base_model.model.classifier.modules_to_save.default.weight"]
    assert not torch.equal(head.detach().cpu(), original["classifier.weight"])


class Boom(RuntimeError):
    pass


def _raise(*_args, **_kwargs):
    raise Boom("disk full")


@pytest.mark.slow
@pytest.mark.parametrize("target", ["metadata", "adapter", "interrupt"])
def test_interrupted_training_leaves_the_old_model_alone(tmp_path, tmp_path_factory, monkeypatch, target):
    import peft

    base = tm.base_model("encoder", tmp_path_factory)
    out = tmp_path / "models" / "current"
    out.mkdir(parents=True)
    (out / METADATA_FILE).write_text('{"the": "old model"}\n')
    (out / "adapter_model.safetensors").write_bytes(b"old weights")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    if target == "metadata":
        monkeypatch.setattr(ModelMetadata, "write", _raise)
    elif target == "adapter":
        monkeypatch.setattr(peft.PeftModel, "save_pretrained", _raise)
    else:
        def interrupt(*_a, **_k):
            raise KeyboardInterrupt
        monkeypatch.setattr(ModelMetadata, "write", interrupt)
    with pytest.raises(KeyboardInterrupt if target == "interrupt" else Boom):
        train(tm.training_records(), str(base), out, TrainParams(max_steps=1, eval_fraction=0.0),
              log=lambda _m: None, progress=False)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in out.parent.iterdir()] == ["current"]  # no temporary directory left behind


@pytest.mark.slow
def test_training_replaces_an_existing_model(tmp_path, tmp_path_factory):
    base = tm.base_model("encoder", tmp_path_factory)
    out = tmp_path / "current"
    out.mkdir()
    (out / METADATA_FILE).write_text("{}")  # a model's folder (one that is not is refused: test_cli_train_...)
    (out / "stale.txt").write_text("old")
    records = [r for r in tm.training_records() if r.doc_id == "doc0"]
    meta = train(records, str(base), out, TrainParams(max_steps=1, eval_fraction=0.0), log=lambda _m: None,
                 progress=False)
    # eval fraction 0: a single document is enough, nothing is held out, no calibration fitted
    assert meta.extra["eval_records"] == 0 and meta.extra["held_out_documents"] == []
    assert "held_out" not in meta.metrics and (meta.calibration.a, meta.calibration.b) == (1.0, 0.0)
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", "adapter_model.safetensors",
                                                     METADATA_FILE]
    assert [p.name for p in tmp_path.iterdir()] == ["current"]


@pytest.mark.slow
def test_training_errors(tmp_path, tmp_path_factory):
    base = str(tm.base_model("encoder", tmp_path_factory))
    only_positive = [r for r in tm.training_records() if r.relevance == 1]
    with pytest.raises(TrainingError, match="both relevant"):
        train(only_positive, base, tmp_path / "m", TrainParams(max_steps=1), log=lambda _m: None, progress=False)
    with pytest.raises(TrainingError, match="no training records"):
        train([], base, tmp_path / "m", TrainParams(max_steps=1), log=lambda _m: None, progress=False)
    one_doc = [r for r in tm.training_records() if r.doc_id == "doc0"]
    with pytest.raises(TrainingError, match="held-out split took every document"):
        train(one_doc, base, tmp_path / "m", TrainParams(max_steps=1, eval_fraction=0.5), log=lambda _m: None,
              progress=False)
    assert not (tmp_path / "m").exists()


# --- CLI ----------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_train_prints_metrics(tmp_path, tmp_path_factory):
    base = tm.base_model("encoder", tmp_path_factory)
    data = tmp_path / "records.jsonl"
    write_records(tm.training_records(), data)
    out = tmp_path / "model"
    result = CliRunner().invoke(app, ["train", "--data", str(data), "--base-model", str(base), "--out", str(out),
                                      "--max-steps", "2", "--eval-fraction", "0.34", "--lr", "0.01"])
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.stdout)
    assert metrics["steps"] == 2 and {"accuracy", "f1", "auroc"} <= set(metrics["held_out"])
    meta = ModelMetadata.read(out)
    assert meta.extra["data_sha256"] == file_sha256(data)
    assert meta.metrics == metrics
    assert error_lines(result.stderr) == []


@pytest.mark.slow
def test_cli_train_bad_data_names_the_line(tmp_path, tmp_path_factory):
    base = tm.base_model("encoder", tmp_path_factory)
    data = tmp_path / "records.jsonl"
    data.write_text(rec("ok", 1).to_json() + "\n" + '{"question": "q", "answer": "a", "page_text": "p", '
                    '"relevance": 2}\n')
    out = tmp_path / "model"
    result = CliRunner().invoke(app, ["train", "--data", str(data), "--base-model", str(base), "--out", str(out)])
    assert result.exit_code != 0
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and "line 2" in errors[0] and "relevance" in errors[0]
    assert result.stdout == "" and not out.exists()


def test_cli_train_bad_base_model(tmp_path):
    data = tmp_path / "records.jsonl"
    write_records(tm.training_records(), data)
    result = CliRunner().invoke(app, ["train", "--data", str(data), "--base-model", str(tmp_path / "no-model"),
                                      "--out", str(tmp_path / "model")])
    assert result.exit_code == 1
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and "no-model" in errors[0]
    assert "Traceback" not in result.output


def test_cli_train_bad_setting_is_one_line(tmp_path, monkeypatch):
    """The LoRA path read the settings itself and printed ConfigError's traceback."""
    data = tmp_path / "records.jsonl"
    write_records(tm.training_records(), data)
    monkeypatch.setenv("EVIDENTIA_THREADS", "abc")
    result = CliRunner().invoke(app, ["train", "--data", str(data), "--base-model", str(tmp_path / "no-model"),
                                      "--out", str(tmp_path / "model")])
    assert result.exit_code == 2
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and "EVIDENTIA_THREADS" in errors[0] and "Traceback" not in result.output


@pytest.mark.parametrize("kind", ["features", "lora"])
def test_cli_train_refuses_an_out_folder_that_holds_something_else(tmp_path, kind):
    """A model replaces its whole folder (no file of an older model left beside it):
    ``--out .`` or a folder of the user's would have been deleted with it."""
    data = tmp_path / "records.jsonl"
    write_records(tm.training_records(), data)
    mine = tmp_path / "my-folder"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    result = CliRunner().invoke(app, ["train", "--kind", kind, "--data", str(data), "--out", str(mine)])
    assert result.exit_code == 2
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and "holds files but no model" in errors[0], result.output
    assert (mine / "notes.txt").read_text() == "keep me"
    (tmp_path / "a-file").write_text("x")
    result = CliRunner().invoke(app, ["train", "--kind", kind, "--data", str(data), "--out", str(tmp_path / "a-file")])
    assert result.exit_code == 2 and "is a file" in result.stderr


def test_cli_dataset_from_climretrieve(tmp_path, passages_dir):
    out = tmp_path / "records.jsonl"
    result = CliRunner().invoke(app, ["dataset", "--out", str(out), "--climretrieve", str(passages_dir)])
    assert result.exit_code == 0, result.output
    records = read_records(out)
    assert records == dedupe(records_from_climretrieve(passages_dir / "passages.jsonl", seed=0))
    positives = sum(r.relevance for r in records)
    assert positives == 6
    assert f"{len(records)} records ({positives} relevant" in result.stdout
    assert file_sha256(out)[:12] in result.stdout


def test_cli_dataset_errors(tmp_path):
    folder = tmp_path / "cr"
    folder.mkdir()
    (folder / "passages.jsonl").write_text(json.dumps(PASSAGES[0]) + "\n\nnot json\n")
    out = tmp_path / "records.jsonl"
    result = CliRunner().invoke(app, ["dataset", "--out", str(out), "--climretrieve", str(folder)])
    assert result.exit_code == 1
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and "line 3" in errors[0]
    assert not out.exists()
    result = CliRunner().invoke(app, ["dataset", "--out", str(out)])
    assert result.exit_code == 2 and error_lines(result.stderr)


def test_fit_calibration_on_margins_that_barely_differ():
    """A barely trained model separates the classes by 1e-4 in margin: the fit must
    still rank them (on raw margins the solver stopped at a=0: p=0.5 everywhere)."""
    from evidentia.training.train import fit_calibration

    margins = [0.07879, 0.07861, 0.07877, 0.07860, 0.07877, 0.07859, 0.07878, 0.07858]
    labels = [1, 0, 1, 0, 1, 0, 1, 0]
    cal = fit_calibration(margins, labels)
    probs = [cal.probability(m) for m in margins]
    assert cal.a > 0
    assert min(p for p, y in zip(probs, labels) if y) > 0.5 > max(p for p, y in zip(probs, labels) if not y)
    shifted = fit_calibration([m * 100 - 3 for m in margins], labels)  # same fit, whatever the scale
    assert [shifted.probability(m * 100 - 3) for m in margins] == pytest.approx(probs, abs=1e-3)
    assert fit_calibration([0.5, 0.5], [1, 0]).probability(0.5) == pytest.approx(0.5)  # no spread: no info
    assert (fit_calibration([1.0, 2.0], [1, 1]).a, fit_calibration([1.0, 2.0], [1, 1]).b) == (1.0, 0.0)


def test_cli_dataset_indexes_missing_documents_with_page_vectors(tmp_path, make_pdf, monkeypatch):
    """`dataset --pdf-dir` indexes through the engine like `evidentia index` does, so
    the dense and hybrid stages can search those documents afterwards (they used to
    be indexed without page vectors, and a hybrid search on them failed)."""
    monkeypatch.setenv("EVIDENTIA_DENSE", "on")
    pdfs = make_pdf("water-2023.pdf", ["Total water withdrawal was 4.2 million cubic metres in 2023.",
                                 "The cafeteria menu changes every week."]).parent
    queries = tmp_path / "queries.jsonl"
    queries.write_text(json.dumps({"id": "q1", "doc_id": "water-2023", "question": "How much water was withdrawn?",
                                   "answer": "4.2 million m3", "relevant_pages": [1]}) + "\n")
    out = tmp_path / "records.jsonl"
    made = CliRunner().invoke(app, ["dataset", "--out", str(out), "--queries", str(queries), "--pdf-dir", str(pdfs)])
    assert made.exit_code == 0, made.output
    hybrid = CliRunner().invoke(app, ["search", "--doc", "water-2023", "-q", "water withdrawal", "--stage", "hybrid",
                                      "--json"])
    assert hybrid.exit_code == 0, hybrid.output
    assert json.loads(hybrid.stdout)["pages"][0]["page"] == 1


def test_cli_dataset_finds_a_pdf_by_its_document_id(tmp_path, make_pdf):
    """`dataset --pdf-dir` (and `calibrate`, `eval`) find a query's PDF by the id `evidentia
    index` gives the file; a query naming the file's stem is told that id."""
    pdfs = make_pdf("Wasser Bericht 2023 (Müller).pdf", ["Total water withdrawal was 4.2 million cubic metres.",
                                                        "The cafeteria menu changes every week."]).parent
    queries = tmp_path / "queries.jsonl"
    query = {"id": "q1", "doc_id": "Wasser-Bericht-2023-Muller", "question": "How much water was withdrawn?",
             "answer": "4.2 million m3", "relevant_pages": [1]}
    queries.write_text(json.dumps(query) + "\n")
    args = ["dataset", "--out", str(tmp_path / "r.jsonl"), "--queries", str(queries), "--pdf-dir", str(pdfs)]
    made = CliRunner().invoke(app, args, env={"EVIDENTIA_DATA_DIR": str(tmp_path / "data")})
    assert made.exit_code == 0, made.output
    queries.write_text(json.dumps({**query, "doc_id": "Wasser Bericht 2023 (Müller)"}) + "\n")
    refused = CliRunner().invoke(app, args, env={"EVIDENTIA_DATA_DIR": str(tmp_path / "other")})
    assert refused.exit_code == 1
    assert refused.stderr == ("error: documents not indexed: Wasser Bericht 2023 (Müller); no PDF of --pdf-dir has "
                              "those ids (or it failed to index); a query names a PDF by its document id, the file "
                              f"name as `evidentia index` makes it: Wasser Bericht 2023 (Müller) is "
                              f"{pdfs / 'Wasser Bericht 2023 (Müller).pdf'}, whose id is Wasser-Bericht-2023-Muller\n")


@pytest.mark.parametrize("env_stage, flag, used", [(None, None, "bm25"), ("hybrid", None, "hybrid"),
                                                     ("hybrid", "bm25", "bm25")])
def test_cli_dataset_takes_negatives_from_the_stage_searches_use(tmp_path, make_pdf, monkeypatch, env_stage, flag,
                                                                 used):
    """Without --stage the negatives come from EVIDENTIA_STAGE's pools, the stage the
    reranker will sit behind (they always came from bm25's); --stage overrides it."""
    import evidentia.training.dataset as dataset

    if env_stage:
        monkeypatch.setenv("EVIDENTIA_STAGE", env_stage)
    stages = []
    real = dataset.records_from_queries
    monkeypatch.setattr(dataset, "records_from_queries", lambda *a, **kw: stages.append(kw["stage"]) or real(*a, **kw))
    pdfs = make_pdf("water-2021.pdf", ["Total water withdrawal was 4.2 million cubic metres in 2021.",
                                       "The cafeteria menu changes every week."]).parent
    queries = tmp_path / "queries.jsonl"
    queries.write_text(json.dumps({"id": "q1", "doc_id": "water-2021", "question": "How much water was withdrawn?",
                                   "answer": "4.2 million m3", "relevant_pages": [1]}) + "\n")
    args = ["dataset", "--out", str(tmp_path / "r.jsonl"), "--queries", str(queries), "--pdf-dir", str(pdfs)]
    made = CliRunner().invoke(app, args + (["--stage", flag] if flag else []))
    assert made.exit_code == 0, made.output
    assert stages == [used]


def test_cli_dataset_document_negatives(tmp_path, make_pdf):
    pdfs = make_pdf("water-2022.pdf", ["Total water withdrawal was 4.2 million cubic metres in 2022.",
                                       "Water recycling rose in 2022.", "The cafeteria menu changes every week.",
                                       "The summer party had live music."]).parent
    queries = tmp_path / "queries.jsonl"
    queries.write_text(json.dumps({"id": "q1", "doc_id": "water-2022", "question": "How much water was withdrawn?",
                                   "answer": "4.2 million m3", "relevant_pages": [1]}) + "\n")
    out = tmp_path / "records.jsonl"
    args = ["dataset", "--out", str(out), "--queries", str(queries), "--pdf-dir", str(pdfs), "--negatives", "1"]
    bad = CliRunner().invoke(app, args + ["--document-negatives", "-1"])
    assert bad.exit_code != 0 and "--document-negatives must be 0 or more" in bad.output
    made = CliRunner().invoke(app, args + ["--document-negatives", "5"])
    assert made.exit_code == 0, made.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    # page 1 relevant, one pool negative (a water page), the pages the pool missed from the document
    assert sorted(r["page"] for r in records if r["source"] == "document") == [3, 4]
    assert [r["page"] for r in records if r["relevance"] == 1] == [1]


def test_cli_dataset_foreign_negatives(tmp_path, make_pdf):
    """--foreign-queries: the top of each query's pool in one of another domain's
    documents (indexed), all negatives, marked as such."""
    pdfs = make_pdf("water-2022.pdf", ["Total water withdrawal was 4.2 million cubic metres in 2022.",
                                       "The cafeteria menu changes every week."]).parent
    make_pdf("acme-10k.pdf", ["Water and sewer costs of the stores rose in 2022.", "Revenue was $1,577 million.",
                              "Water rights are recorded at cost.", "The Board of Directors met four times."])
    queries = tmp_path / "queries.jsonl"
    queries.write_text(json.dumps({"id": "q1", "doc_id": "water-2022", "question": "How much water was withdrawn?",
                                   "answer": "4.2 million m3", "relevant_pages": [1]}) + "\n")
    other = tmp_path / "filings.jsonl"
    other.write_text(json.dumps({"id": "f1", "doc_id": "acme-10k", "question": "What was revenue?",
                                 "answer": "$1,577 million", "relevant_pages": [2]}) + "\n")
    out = tmp_path / "records.jsonl"
    data = tmp_path / "data"
    args = ["dataset", "--out", str(out), "--queries", str(queries), "--pdf-dir", str(pdfs), "--negatives", "1",
            "--document-negatives", "0", "--foreign-queries", str(other)]
    env = {"EVIDENTIA_DATA_DIR": str(data)}
    missing = CliRunner().invoke(app, args, env=env)
    assert missing.exit_code != 0 and "documents not indexed: acme-10k" in missing.output
    assert CliRunner().invoke(app, ["index", str(pdfs / "acme-10k.pdf")], env=env).exit_code == 0
    bad = CliRunner().invoke(app, args + ["--foreign-negatives", "-1"], env=env)
    assert bad.exit_code != 0 and "--foreign-negatives must be 0 or more" in bad.output
    made = CliRunner().invoke(app, args + ["--foreign-negatives", "2"], env=env)
    assert made.exit_code == 0, made.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    foreign = [r for r in records if r["source"] == "foreign"]
    # the two pages of the filing that match the question's words, never relevant, with the query's text
    assert sorted(r["page"] for r in foreign) == [1, 3]
    assert all(r["doc_id"] == "acme-10k" and r["relevance"] == 0 and r["question"] == "How much water was withdrawn?"
               for r in foreign)
    assert [r["page"] for r in records if r["relevance"] == 1] == [1]
    none = CliRunner().invoke(app, args + ["--foreign-negatives", "0"], env=env)
    assert none.exit_code == 0 and not [line for line in out.read_text().splitlines() if '"foreign"' in line]



def test_cli_dataset_record_weight_and_partly_relevant_pages(tmp_path, make_pdf):
    """--record-weight is written on every record and read back; a page judged to answer
    in part (partly_relevant_pages) is in no record."""
    pdfs = make_pdf("water-2022.pdf", ["Total water withdrawal was 4.2 million cubic metres in 2022.",
                                       "Water recycling rose in 2022.", "The cafeteria menu changes every week.",
                                       "Water withdrawal by site is in the appendix."]).parent
    queries = tmp_path / "queries.jsonl"
    queries.write_text(json.dumps({"id": "q1", "doc_id": "water-2022", "question": "How much water was withdrawn?",
                                   "answer": "4.2 million m3", "relevant_pages": [1],
                                   "partly_relevant_pages": [4]}) + "\n")
    out = tmp_path / "records.jsonl"
    args = ["dataset", "--out", str(out), "--queries", str(queries), "--pdf-dir", str(pdfs), "--negatives", "5",
            "--document-negatives", "5"]
    for bad in ("0", "-1", "inf"):
        refused = CliRunner().invoke(app, args + ["--record-weight", bad])
        assert refused.exit_code != 0 and "--record-weight must be a positive number" in refused.output
    made = CliRunner().invoke(app, args + ["--record-weight", "0.4"])
    assert made.exit_code == 0, made.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["weight"] for r in rows} == {0.4}
    assert sorted(r["page"] for r in rows) == [1, 2, 3]  # page 4 neither evidence nor a negative
    assert [r.weight for r in read_records(out)] == [0.4] * 3
    plain = CliRunner().invoke(app, args)
    assert plain.exit_code == 0 and all("weight" not in json.loads(line) for line in out.read_text().splitlines())
    out.write_text(json.dumps({**rows[0], "weight": 0}) + "\n")
    with pytest.raises(DatasetError, match="line 1: weight must be a positive number"):
        read_records(out)


def _two_company_queries(make_pdf, rows_extra=None):
    pdfs = make_pdf("water-2022.pdf", ["Total water withdrawal was 4.2 million cubic metres in 2022.",
                                       "The cafeteria menu changes every week."]).parent
    make_pdf("acme-10k.pdf", ["Revenue was $1,577 million.", "The Board of Directors met four times."])
    rows = [{"id": 1, "doc_id": "water-2022", "question": "How much water was\u2028withdrawn?",
             "answer": "4.2 million m3", "relevant_pages": [1], "company": "Water"},
            {"id": 2, "doc_id": "acme-10k", "question": "What was revenue?", "answer": "$1,577 million",
             "relevant_pages": [1], "company": "Acme"}]
    return pdfs, rows


def test_cli_dataset_split_out_writes_the_lines_of_any_queries_file_it_reads(tmp_path, make_pdf):
    """A numeric id (read as "1"), a BOM and a U+2028 inside a question: load_queries reads
    them all; --split-out re-read the file its own way and crashed with a traceback."""
    pdfs, rows = _two_company_queries(make_pdf)
    queries = tmp_path / "queries.jsonl"
    lines = [json.dumps(r, ensure_ascii=False) for r in rows]
    queries.write_bytes(("\ufeff" + "\n".join(lines) + "\n").encode("utf-8"))
    split = tmp_path / "split"
    made = CliRunner().invoke(app, ["dataset", "--out", str(tmp_path / "r.jsonl"), "--queries", str(queries),
                                    "--pdf-dir", str(pdfs), "--holdout-fraction", "0.5", "--split-out", str(split)])
    assert made.exit_code == 0, made.output
    written = [(split / name).read_text(encoding="utf-8").split("\n")
               for name in ("train_queries.jsonl", "heldout_queries.jsonl")]
    assert sorted(line for part in written for line in part if line) == sorted(lines)
    assert all(len([line for line in part if line]) == 1 for part in written)


def test_cli_dataset_refuses_a_split_field_the_queries_lack(tmp_path, make_pdf):
    """A misspelt --split-by put every query in one group "None", held out whole: an empty
    training file, exit 0."""
    pdfs, rows = _two_company_queries(make_pdf)
    queries = tmp_path / "queries.jsonl"
    queries.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "r.jsonl"
    args = ["dataset", "--out", str(out), "--queries", str(queries), "--pdf-dir", str(pdfs)]
    typo = CliRunner().invoke(app, args + ["--holdout-fraction", "0.2", "--split-by", "compnay"])
    assert typo.exit_code == 2 and not out.exists()
    assert error_lines(typo.stderr) == ["error: --split-by compnay: 2 of 2 queries have no such field (1, 2); "
                                        "name a field every query has, or doc_id"]
    every = CliRunner().invoke(app, args + ["--holdout-fraction", "0.9"])
    assert every.exit_code == 2 and not out.exists()
    assert "holds out every query" in every.stderr


def test_cli_dataset_climretrieve_gives_no_record_of_a_held_out_report(tmp_path):
    """training/splits/heldout.json's reports are those evaluation reports on."""
    from evidentia.evaluation.climretrieve import held_out_reports, load_split

    held = sorted(held_out_reports(load_split()))[0]
    folder = tmp_path / "cr"
    folder.mkdir()
    rows = [dict(row, report=held) if row["report"] == "B" else row for row in PASSAGES]
    (folder / "passages.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "records.jsonl"
    result = CliRunner().invoke(app, ["dataset", "--out", str(out), "--climretrieve", str(folder)])
    assert result.exit_code == 0, result.output
    records = read_records(out)
    assert records and {r.doc_id for r in records} == {"A"}
    left_out = [r for r in records_from_climretrieve(folder / "passages.jsonl") if r.doc_id == held]
    assert f"left out {len(left_out)} ClimRetrieve records of 1 report(s) held out for evaluation" in result.stderr
