"""The ``evidentia`` command line, in process (CliRunner) and as a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from evidentia.cli import app
from evidentia.samples import write_sample_report

FR_QUESTION = "Quelle proportion des fournisseurs a été auditée sur les droits humains ?"


@pytest.fixture
def cli(cli_env, detector, monkeypatch):
    """Invoke the app in process. Each command builds its own LanguageDetector
    (0.3 s of profile loading); the session's one, same settings, is handed out instead."""
    import evidentia.language as language

    real = language.LanguageDetector

    def shared(probe_chars: int = 400, seed: int = 0):
        return detector if (probe_chars, seed) == (detector.probe_chars, 0) else real(probe_chars, seed)

    monkeypatch.setattr(language, "LanguageDetector", shared)
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, [str(a) for a in args])

    return invoke


def summary_line(documents, pages, empty, failures) -> str:
    return (f"{documents} document(s), {pages} page(s) indexed, {empty} empty page(s) (no extractable text), "
            f"{failures} failure(s)")


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


# --- index -----------------------------------------------------------------------


def test_index_good_file(cli, multilingual_pdf, cli_env):
    result = cli("index", multilingual_pdf.path)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == summary_line(1, 9, 2, 0)
    assert error_lines(result.stderr) == []
    assert (cli_env / "index").is_dir()


def test_index_files_and_folders_with_bad_files(cli, multilingual_pdf, bad_pdfs, make_pdf, tmp_path):
    folder = tmp_path / "more"
    (folder / "sub").mkdir(parents=True)
    from evidentia.samples import write_pdf

    write_pdf(folder / "sub" / "water.pdf", ["Water withdrawal in 2023 was 1.2 million cubic metres."])
    bad_folder = bad_pdfs["encrypted"].parent

    result = cli("index", multilingual_pdf.path, bad_folder, folder, tmp_path / "missing.pdf")
    assert result.exit_code == 1
    assert result.stdout.strip().splitlines() == [summary_line(2, 10, 2, 5)]
    errors = error_lines(result.stderr)
    assert len(errors) == 5
    expected = {
        "encrypted.pdf": "encrypted", "corrupted.pdf": "corrupted", "no-pages.pdf": "no pages",
        "notes.pdf": "not a PDF", "missing.pdf": "no such file",
    }
    for name, problem in expected.items():
        assert sum(name in e and problem in e for e in errors) == 1, (name, errors)

    docs = cli("docs", "--json")
    assert docs.exit_code == 0
    listed = {d["doc_id"]: d["pages"] for d in json.loads(docs.stdout)["documents"]}
    assert listed == {"multilingual-report": 9, "water": 1}


# --- search -------------------------------------------------------------------------


@pytest.fixture
def indexed(cli, multilingual_pdf):
    result = cli("index", multilingual_pdf.path)
    assert result.exit_code == 0, result.output
    return multilingual_pdf.doc_id


def test_search_json_targeted_question(cli, indexed):
    # "2023" is on every text page: the others match too, but must rank lower
    result = cli("search", "--doc", indexed, "-q", FR_QUESTION, "-a", "87 % des fournisseurs en 2023", "--json")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("\n") == 1  # exactly one JSON object on one line
    payload = json.loads(result.stdout)
    assert list(payload)[0] == "pages"
    assert payload["reranker"] == "none" and payload["fallback_reason"] is None
    pages = payload["pages"]
    assert len(pages) == 7
    assert pages[0]["page"] == 2 and pages[0]["doc_id"] == indexed
    assert {"doc_id", "page", "score", "snippet"} <= set(pages[0])
    scores = [p["score"] for p in pages]
    assert scores == sorted(scores, reverse=True)
    assert scores[0] > 2 * scores[1]
    assert "87 %" in pages[0]["snippet"]


def test_search_sample_report_ranks_the_right_page(cli, tmp_path):
    pdf = write_sample_report(tmp_path / "acme.pdf")
    assert cli("index", pdf).exit_code == 0
    cases = [
        ("What was the lost time injury frequency rate?", "0.8 per million hours worked", 3),
        ("What were the Scope 1 and 2 greenhouse gas emissions in 2023?", "12,450 tCO2e", 2),
    ]
    for question, answer, page in cases:
        result = cli("search", "--doc", "acme", "-q", question, "-a", answer, "--json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["pages"][0]["page"] == page, question


def test_search_top_k(cli, indexed):
    everything = json.loads(cli("search", "--doc", indexed, "-q", "2023", "--json").stdout)["pages"]
    assert len(everything) == 7  # every text page mentions 2023, the empty ones never match
    assert sorted(p["page"] for p in everything) == list(range(1, 8))
    top3 = cli("search", "--doc", indexed, "-q", "2023", "--top-k", "3", "--json")
    assert top3.exit_code == 0
    assert json.loads(top3.stdout)["pages"] == everything[:3]


def test_search_plain_text_output(cli, indexed):
    result = cli("search", "--doc", indexed, "-q", FR_QUESTION, "-a", "87 % en 2023", "--top-k", "2")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"  1. {indexed}  p.2 ")
    nothing = cli("search", "--doc", indexed, "-q", "zzzunknownword")
    assert nothing.exit_code == 0 and nothing.stdout.strip() == "no matching page"


def test_search_unknown_document(cli, indexed):
    for docs in (["nope"], [indexed, "nope"]):
        args = [a for d in docs for a in ("--doc", d)]
        result = cli("search", *args, "-q", "emissions", "--json")
        assert result.exit_code != 0
        assert result.stdout == ""
        assert result.stderr.count("\n") == 1
        assert result.stderr.startswith("error: unknown document id(s): nope")


@pytest.mark.parametrize("args, message", [
    (["--top-k", "0"], "--top-k must be a positive integer"),
    (["--top-k", "-3"], "--top-k must be a positive integer"),
])
def test_search_bad_top_k(cli, indexed, args, message):
    result = cli("search", "--doc", indexed, "-q", "emissions", *args)
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: {message}"


def test_search_empty_question(cli, indexed):
    result = cli("search", "--doc", indexed, "-q", "   ")
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: --question is empty"


# --- docs / delete / demo --------------------------------------------------------------


def test_docs_lists_documents_with_page_counts(cli, indexed, tmp_path):
    assert cli("docs").stdout.strip() == (
        f"{indexed}\t9 pages\t2 empty\ten:1, fr:1, de:1, es:1, it:1, pt:1, nl:1")
    write_sample_report(tmp_path / "acme.pdf")
    assert cli("index", tmp_path / "acme.pdf").exit_code == 0
    result = cli("docs", "--json")
    assert result.exit_code == 0
    documents = json.loads(result.stdout)["documents"]
    assert [(d["doc_id"], d["pages"], d["empty_pages"]) for d in documents] == [
        ("acme", 6, 1), (indexed, 9, 2)]
    assert documents[0]["languages"] == {"en": 3, "fr": 1, "de": 1}


def test_docs_empty_index(cli):
    result = cli("docs")
    assert result.exit_code == 0 and result.stdout.strip() == "no document indexed"


def test_delete(cli, indexed):
    result = cli("delete", indexed)
    assert result.exit_code == 0
    assert result.stdout.strip() == f"deleted {indexed}"
    assert cli("docs").stdout.strip() == "no document indexed"
    assert cli("search", "--doc", indexed, "-q", "emissions").exit_code == 1

    again = cli("delete", indexed)
    assert again.exit_code != 0
    assert again.stderr.strip() == f"error: unknown document id: {indexed}"
    assert again.stdout == ""


def test_reindex_via_cli_replaces(cli, tmp_path, language_pages):
    from evidentia.samples import write_pdf

    path = write_pdf(tmp_path / "report.pdf", [language_pages["en"], language_pages["fr"]])
    assert cli("index", path).exit_code == 0
    write_pdf(path, [language_pages["de"]])
    result = cli("index", path)
    assert result.stdout.strip() == summary_line(1, 1, 0, 0)
    assert cli("docs").stdout.strip() == "report\t1 pages\t0 empty\tde:1"


def test_demo(cli):
    result = cli("demo")
    assert result.exit_code == 0, result.output
    ranked = [line for line in result.stdout.splitlines() if line[:2] in ("1.", "2.", "3.")]
    assert len(ranked) == 3
    assert ranked[0].startswith("1. page 2 (")
    assert "Scope 1 and Scope 2" in ranked[0]
    assert summary_line(1, 6, 1, 0) in result.stdout
    # the demo document stays in the index
    assert cli("docs").stdout.startswith("acme-sustainability-2023\t6 pages\t1 empty")


# --- a real process: exit codes and stream separation ---------------------------------


def test_real_process_exit_codes_and_streams(cli_env, multilingual_pdf, bad_pdfs, tmp_path):
    env = {**os.environ, "EVIDENTIA_DATA_DIR": str(cli_env)}
    env.pop("EVIDENTIA_BACKEND", None)

    def run(*args):
        return subprocess.run([sys.executable, "-m", "evidentia.cli", *map(str, args)], env=env,
                              capture_output=True, text=True, cwd=tmp_path, timeout=120)

    proc = run("index", multilingual_pdf.path, bad_pdfs["encrypted"])
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == summary_line(1, 9, 2, 1) + "\n"
    assert error_lines(proc.stderr) == ["error: encrypted.pdf: encrypted PDF (password required)"]

    proc = run("search", "--doc", "multilingual-report", "-q", FR_QUESTION, "-a", "87 % en 2023", "--json",
               "--top-k", "2")
    assert proc.returncode == 0, proc.stderr
    pages = json.loads(proc.stdout)["pages"]
    assert [p["page"] for p in pages][:1] == [2] and len(pages) == 2

    proc = run("search", "--doc", "nope", "-q", "emissions", "--json")
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert error_lines(proc.stderr) == [
        "error: unknown document id(s): nope; `evidentia docs` lists the indexed ones"]
