"""`evidentia retrain` on exported feedback: its tenant, and a round with nothing to train on."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from evidentia.cli import app
from evidentia.samples import write_sample_report


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


@pytest.fixture
def exported(cli_env, tmp_path):
    """Feedback as GET /v1/feedback/export writes it (no tenant), on a document of tenant acme."""
    pdf = write_sample_report(tmp_path / "amcor-q4.pdf")
    assert invoke("index", "--tenant", "acme", pdf).exit_code == 0
    path = tmp_path / "feedback-acme.jsonl"
    rows = [{"question": "What were the emissions?", "answer": "12,450 t", "page_text": text, "relevance": relevance,
             "doc_id": "amcor-q4", "page": page, "source": "feedback"}
            for page, relevance, text in ((2, 1, "Greenhouse gas emissions"), (1, 0, "Acme report"))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_retrain_on_an_export_names_the_tenant_searched_and_the_one_to_give(exported):
    result = invoke("retrain", "--feedback", exported, "--kind", "features")
    assert result.exit_code == 1
    assert error_lines(result.stderr) == ["error: 1 document(s) named in --feedback are not in tenant default: "
                                          "amcor-q4; amcor-q4 is in tenant acme: add --tenant acme"]
    assert "Traceback" not in result.output


def test_retrain_with_every_verdict_held_out_says_what_to_give(exported):
    """Two verdicts on one document: the document is held out, nothing is left to train on."""
    result = invoke("retrain", "--feedback", exported, "--tenant", "acme", "--kind", "features")
    assert result.exit_code == 1
    assert "1 held-out queries, touching 1 held-out document(s)" in result.stderr
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and errors[0].startswith("error: no training records: every feedback query (1) is held out")
    assert "--base-data FILE" in errors[0] and "feedback on more documents" in errors[0]


def test_retrain_tenant_goes_with_feedback(cli_env):
    result = invoke("retrain", "--tenant", "acme")
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: --tenant goes with --feedback (the store's feedback knows its tenants)"


def test_train_features_on_an_export_names_the_tenant_to_give(exported, tmp_path):
    result = invoke("train", "--kind", "features", "--data", exported, "--out", tmp_path / "model")
    assert result.exit_code == 1
    assert error_lines(result.stderr) == ["error: 1 document(s) named in --data are not in tenant default: "
                                          "amcor-q4; amcor-q4 is in tenant acme: add --tenant acme"]


def test_verdicts_from_an_export_are_keyed_by_the_tenant_given():
    from evidentia.training.dataset import TrainingRecord
    from evidentia.training.lifecycle import verdicts_from_records

    records = [TrainingRecord("q", "a", "text", 1, "amcor-q4", 2, "feedback")]
    assert [v.doc_id for v in verdicts_from_records(records, "acme")] == ["acme:amcor-q4"]
    assert [v.doc_id for v in verdicts_from_records(records)] == ["amcor-q4"]


def test_help_texts_say_what_the_commands_do():
    def help_of(command: str) -> str:
        return " ".join(CliRunner().invoke(app, [command, "--help"], terminal_width=200).output.split())

    train = help_of("train")
    assert "--threads" in train and "(default EVIDENTIA_THREADS, half the usable CPUs, 1 to 4)" in train
    assert "TORCH_THREADS" not in train and "torch's choice" not in train
    calibrate = help_of("calibrate")
    assert "a features model's becomes P(relevant | its logit)" in calibrate
    assert "the place in the pool is never used" in calibrate
