"""Feedback as training input: every field of a record file is type-checked (a bad
one is an `error:` line, not a traceback or a silently truncated page), and a
retraining round skips verdicts on documents no longer in the index."""

from __future__ import annotations

import json

import pytest

from evidentia.config import Settings
from evidentia.engine import Engine
from evidentia.indexing import index_paths
from evidentia.language import LanguageDetector
from evidentia.retriever.tantivy_backend import TantivyBackend
from evidentia.samples import write_pdf
from evidentia.training import lifecycle
from evidentia.training.dataset import DatasetError, TrainingRecord, read_records
from evidentia.training.retrain import Verdict

GOOD = TrainingRecord("q", "a", "page text", 1, "doc", 3, "feedback")


def _file(tmp_path, line: str):
    path = tmp_path / "feedback.jsonl"
    path.write_text(GOOD.to_json() + "\n" + line + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("page", ['"abc"', "[1]", "1e400", "1.7", "true", "-5", "0", "4294967296"])
def test_a_page_that_is_not_a_positive_integer_names_its_line(tmp_path, page):
    """1.7 and true were read as page 1; "abc", [1] and 1e400 failed with a traceback."""
    path = _file(tmp_path, f'{{"question": "q", "answer": "a", "page_text": "p", "relevance": 1, "doc_id": "d", '
                           f'"page": {page}}}')
    with pytest.raises(DatasetError, match=r"line 2: page must be a positive integer") as info:
        read_records(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("field", ["question", "answer", "page_text", "doc_id", "source"])
def test_a_lone_surrogate_names_its_line(tmp_path, field):
    """JSON "\\ud800" decodes to a str no UTF-8 writer takes: UnicodeEncodeError later."""
    obj = {"question": "q", "answer": "a", "page_text": "p", "relevance": 1, "doc_id": "d", "page": 1}
    line = json.dumps(obj).replace(f'"{field}": "', f'"{field}": "x\\ud800') if field != "source" else \
        json.dumps({**obj, "source": "PLACEHOLDER"}).replace("PLACEHOLDER", "x\\ud800")
    with pytest.raises(DatasetError, match=rf"line 2: field '{field}' holds a lone surrogate"):
        read_records(_file(tmp_path, line))


@pytest.mark.parametrize("field,value", [("doc_id", "[1]"), ("doc_id", "7"), ("source", "{}")])
def test_doc_id_and_source_must_be_strings(tmp_path, field, value):
    line = f'{{"question": "q", "answer": "a", "page_text": "p", "relevance": 1, "page": 1, "{field}": {value}}}'
    with pytest.raises(DatasetError, match=rf"line 2: field '{field}' must be str"):
        read_records(_file(tmp_path, line))


def test_good_records_still_read_and_a_null_doc_id_is_none(tmp_path):
    """A null doc_id was read as the document "None"."""
    path = _file(tmp_path, '{"question": "q", "answer": "a", "page_text": "p", "relevance": 0, "page": null, '
                           '"doc_id": null}')
    assert read_records(path) == [GOOD, TrainingRecord("q", "a", "p", 0, "", None, "")]


def test_retrain_cli_turns_a_bad_page_into_one_error_line(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from evidentia.cli import app
    from evidentia.console import EXIT_BAD_INPUT
    from evidentia.store import Store, store_path

    monkeypatch.setenv("EVIDENTIA_DATA_DIR", str(tmp_path))
    Store(store_path(tmp_path)).add_tenant("acme")
    for page in ('"abc"', "1e400", "1.7"):
        path = _file(tmp_path, f'{{"question": "q", "answer": "a", "page_text": "p", "relevance": 1, '
                               f'"doc_id": "d", "page": {page}}}')
        out = CliRunner().invoke(app, ["retrain", "--feedback", str(path), "--tenant", "acme"])
        assert out.exit_code == EXIT_BAD_INPUT, out.output
        assert out.exception is None or isinstance(out.exception, SystemExit)
        assert "line 2: page must be a positive integer" in out.output and "Traceback" not in out.output


def test_a_round_skips_verdicts_on_documents_gone_from_the_index(tmp_path, monkeypatch):
    """`evidentia retrain` from the store failed for good: unknown document id(s): acme:race0."""
    pdfs = tmp_path / "pdfs"
    pdfs.mkdir()
    write_pdf(pdfs / "kept.pdf", ["Scope 1 emissions were 12,450 t.", "Water use fell."])
    backend = TantivyBackend(tmp_path / "index")
    index_paths([pdfs], backend, LanguageDetector())
    engine = Engine(Settings(data_dir=tmp_path / "data", dense=False), backend=backend)
    verdicts = [Verdict("q", "a", "kept", 1, True, "1"), Verdict("q", "a", "acme:race0", 1, True, "2"),
                Verdict("q", "a", "acme:race0", 2, False, "3"), Verdict("q", "a", "acme:race1", 1, True, "4")]
    seen = {}

    def fake_retrain(verdicts, *args, **kwargs):
        seen["verdicts"] = list(verdicts)
        return "done"

    monkeypatch.setattr(lifecycle, "retrain", fake_retrain)
    logged = []
    assert lifecycle.run_retrain(engine, verdicts, None, log=logged.append) == "done"
    assert [v.doc_id for v in seen["verdicts"]] == ["kept"]
    warnings = [m for m in logged if m.startswith("warning: skipped")]
    assert warnings == ["warning: skipped 3 verdict(s) on 2 document(s) no longer in the index: acme:race0, "
                        "acme:race1"]
    from evidentia.training.train import TrainingError

    with pytest.raises(TrainingError, match="no verdicts left to learn from"):
        lifecycle.run_retrain(engine, verdicts[1:], None, log=logged.append)


def test_a_record_is_one_line_for_every_reader(tmp_path):
    """A question with U+2028 (pasted from a PDF) was written raw: a reader splitting
    lines as str.splitlines() does broke the record in two."""
    from dataclasses import replace

    record = replace(GOOD, question="Scope 1\u2028emissions\x85in 2023\u2029? été")
    line = record.to_json()
    assert len(line.splitlines()) == 1 and "été" in line  # still readable UTF-8
    path = tmp_path / "r.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    assert read_records(path) == [record]
