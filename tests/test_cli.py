"""The ``evidentia`` command line, in process (CliRunner) and as a real process."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

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
    # ids are made from file names, and every later command takes one: only `docs` showed them
    assert f"document id(s): {multilingual_pdf.path.stem} (" in result.stderr


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
    # a folder's file is named by its path, so that sub/empty.pdf and empty.pdf are told apart
    assert any(e.startswith(f"error: {bad_folder / 'encrypted.pdf'}: ") for e in errors), errors

    docs = cli("docs", "--json")
    assert docs.exit_code == 0
    listed = {d["document_id"]: d["pages"] for d in json.loads(docs.stdout)["documents"]}
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
    assert pages[0]["page"] == 2 and pages[0]["document_id"] == indexed
    assert {"document_id", "page", "score", "snippet"} <= set(pages[0])
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
    assert nothing.exit_code == 0 and nothing.stdout.strip().startswith("no matching page: no page of these "
                                                                        "documents contains any of the words zzzunknownword")


def test_search_unknown_document(cli, indexed):
    for docs in (["nope"], [indexed, "nope"]):
        args = [a for d in docs for a in ("--doc", d)]
        result = cli("search", *args, "-q", "emissions", "--json")
        assert result.exit_code != 0
        assert result.stdout == ""
        assert result.stderr.count("\n") == 1
        assert result.stderr.startswith("error: unknown document id(s): nope")


def test_search_of_stop_words_alone_still_says_a_document_is_unknown(cli, indexed):
    """Such a question reaches no index search, where unknown documents were found: it said
    "no searchable word" and exited 0 for a document that does not exist."""
    unknown = ["error: unknown document id(s): nope; `evidentia docs` lists the indexed ones"]
    assert error_lines(cli("search", "--doc", "nope", "-q", "emissions").stderr) == unknown  # a normal question's
    for args in (["--doc", "nope"], ["--doc", indexed, "--doc", "nope"]):
        for extra in ([], ["--json"]):
            result = cli("search", *args, "-q", "the of", *extra)
            assert result.exit_code == 1, (args, extra)
            assert result.stdout == "" and error_lines(result.stderr) == unknown
    known = cli("search", "--doc", indexed, "-q", "the of")
    assert known.exit_code == 0 and "no searchable word" in known.stdout


def test_search_with_the_classifier_prints_its_probability_once_and_names_its_model(cli, cli_env, indexed):
    """`--json` carries the API's model_version (the classifier's model; null for the others);
    a page's line gives the classifier's probability once, as it is also its score."""
    import re

    from fastapi.testclient import TestClient

    from evidentia.api.app import create_app
    from evidentia.config import Settings
    from evidentia.store import Store, store_path
    from tests.utils.api import wait_ready

    args = ("search", "--doc", indexed, "-q", FR_QUESTION, "--reranker", "classifier", "--threshold", "0")
    found = json.loads(cli(*args, "--json").stdout)
    assert found["pages"] and found["model_version"]
    store = Store(store_path(cli_env))
    key = store.create_key("default").key
    store.close()
    with TestClient(create_app(Settings(data_dir=cli_env, dense=False, rate_limit_per_minute=100_000))) as client:
        wait_ready(client)
        body = {"question": FR_QUESTION, "document_ids": [indexed], "reranker": "classifier", "threshold": 0.0}
        validated = client.post("/v1/validate", headers={"X-API-Key": key}, json=body).json()
    assert validated["model_version"] == found["model_version"]
    plain = cli(*args)
    assert plain.exit_code == 0, plain.output
    lines = plain.stdout.splitlines()
    assert len(lines) == len(found["pages"])
    for line, page in zip(lines, found["pages"]):
        assert re.match(rf"^ +\d+\. {indexed}  p\.{page['page']} +p={page['probability']:.3f}  \S", line), line
        assert "score" not in line and line.count("p=") == 1
    assert plain.stderr == ""  # no line on every search: `--json` and `evidentia models list` name the model
    none = json.loads(cli("search", "--doc", indexed, "-q", FR_QUESTION, "--json").stdout)
    assert "model_version" in none and none["model_version"] is None
    plain_none = cli("search", "--doc", indexed, "-q", FR_QUESTION)
    assert all(" score " in line and "p=" not in line for line in plain_none.stdout.splitlines())
    assert found["model_version"] not in plain_none.stderr  # no model line without a model


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
    listed = cli("docs")
    # page 9 is a picture: with OCR off (conftest) it is counted as a scan not read
    assert listed.stdout.splitlines() == [
        "tenant\tdocument\tpages\tempty\tlanguages (pages with text)\tOCR pages (confidence)\tunread scans",
        f"default\t{indexed}\t9\t2\ten:1, fr:1, de:1, es:1, it:1, pt:1, nl:1\t0\t1"]
    # why the language counts do not add up to the pages
    assert "empty pages have no extractable text" in listed.stderr
    write_sample_report(tmp_path / "acme.pdf")
    assert cli("index", tmp_path / "acme.pdf").exit_code == 0
    result = cli("docs", "--json")
    assert result.exit_code == 0
    documents = json.loads(result.stdout)["documents"]
    assert [(d["tenant"], d["document_id"], d["pages"], d["empty_pages"]) for d in documents] == [
        ("default", "acme", 6, 1), ("default", indexed, 9, 2)]
    assert documents[0]["languages"] == {"en": 3, "fr": 1, "de": 1}
    assert [(d["ocr_pages"], d["unread_pages"]) for d in documents] == [(0, 0), (0, 1)]


def test_docs_empty_index(cli, cli_env):
    result = cli("docs")
    assert result.exit_code == 0 and result.stdout.strip() == "no document indexed"
    # a terminal without the other one's `export EVIDENTIA_DATA_DIR=...` read another data directory
    assert f"data directory {cli_env};" in result.stderr


def test_delete(cli, indexed):
    result = cli("delete", indexed)
    assert result.exit_code == 0
    assert result.stdout.strip() == f"deleted {indexed}"
    assert cli("docs").stdout.strip() == "no document indexed"
    assert cli("search", "--doc", indexed, "-q", "emissions").exit_code == 1

    again = cli("delete", indexed)
    assert again.exit_code != 0
    assert again.stderr.strip() == (f"error: unknown document id: {indexed} (tenant default); `evidentia docs` "
                                    "lists every tenant's documents")
    assert again.stdout == ""


def test_page_prints_the_text_search_reads(cli, indexed, tmp_path):
    """`evidentia page` shows a page as indexed (the text search and the rerankers read), with
    its language and how it was read; a page past the end or another tenant's document is an
    error that says so."""
    found = json.loads(cli("search", "--doc", indexed, "-q", FR_QUESTION, "--json").stdout)["pages"][0]
    shown = cli("page", indexed, found["page"])
    assert shown.exit_code == 0, shown.output
    header, _, text = shown.stdout.partition("\n\n")
    assert header.startswith(f"{indexed} p.{found['page']} of ") and "read from its text layer" in header
    assert "87 %" in text
    as_json = json.loads(cli("page", indexed, found["page"], "--json").stdout)
    assert as_json["text"].strip() == text.strip() and as_json["language"] == "fr"
    assert as_json["text_source"] == "text" and as_json["page"] == found["page"]
    past = cli("page", indexed, 999)
    assert past.exit_code == 1 and error_lines(past.stderr) == [
        f"error: {indexed} has {as_json['pages']} pages: there is no page 999"]
    assert cli("page", indexed, 0).exit_code == 2
    pdf = write_sample_report(tmp_path / "amcor-q4.pdf")
    assert cli("index", "--tenant", "acme", pdf).exit_code == 0
    elsewhere = cli("page", "amcor-q4", 1)
    assert elsewhere.exit_code == 1 and error_lines(elsewhere.stderr) == [
        "error: amcor-q4 is in tenant acme: add --tenant acme"]
    assert "Acme" in cli("page", "--tenant", "acme", "amcor-q4", 1).stdout


def test_reindex_via_cli_replaces(cli, tmp_path, language_pages):
    from evidentia.samples import write_pdf

    path = write_pdf(tmp_path / "report.pdf", [language_pages["en"], language_pages["fr"]])
    first = cli("index", path)
    assert first.exit_code == 0 and "replaced" not in first.stderr
    write_pdf(path, [language_pages["de"]])
    result = cli("index", path)
    assert result.stdout.strip() == summary_line(1, 1, 0, 0)
    # said, not silent: two files of one id (文档.pdf and 报告.pdf were both `document`) replaced each other
    assert "replaced 1 document(s) indexed before under the same id: report" in result.stderr
    assert cli("docs").stdout.splitlines()[1] == "default\treport\t1\t0\tde:1"


def test_demo(cli):
    result = cli("demo")
    assert result.exit_code == 0, result.output
    ranked = [line for line in result.stdout.splitlines() if line[:2] in ("1.", "2.", "3.")]
    assert len(ranked) == 3
    assert ranked[0].startswith("1. page 2 (")
    assert "Scope 1 and Scope 2" in ranked[0]
    # ranked by the stage `search` would use, and saying which (EVIDENTIA_DENSE=off here: BM25)
    assert "\nThe best pages, ranked by BM25:\n" in result.stdout
    assert summary_line(1, 6, 1, 0) in result.stdout
    # the demo leaves nothing in the index (test_demo_leaves_nothing_behind_unless_kept)
    assert cli("docs").stdout.strip() == "no document indexed"


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
    assert error_lines(proc.stderr) == [f"error: {bad_pdfs['encrypted']}: encrypted PDF (password required)"]

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


def test_index_with_ocr_languages_tesseract_does_not_know_fails_in_one_line(cli, cli_env, tmp_path, monkeypatch):
    """EVIDENTIA_OCR_LANGUAGES=fr+de (ISO codes, not Tesseract's fra+deu) was dropped
    without a word and the scans read in English: it is a setting error, before any work."""
    monkeypatch.setenv("EVIDENTIA_OCR", "on")
    monkeypatch.setenv("EVIDENTIA_OCR_LANGUAGES", "fr+de")
    result = cli("index", write_sample_report(tmp_path / "acme.pdf"))
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: EVIDENTIA_OCR_LANGUAGES must be Tesseract language names joined by +, "
                                    "not 'fr+de': fr, de are not Tesseract languages (did you mean fra+deu?)")
    assert result.stderr.count("\n") == 1 and result.stdout == ""
    assert cli("docs").stdout.strip() == "no document indexed"


def test_index_with_an_ocr_language_not_installed_warns_with_its_package(cli_env, tmp_path):
    """A Tesseract language whose pack is missing: said, with the package, and the
    pages read with the others (a real process: the warning is the engine's log line)."""
    listed = subprocess.run(["tesseract", "--list-langs"], capture_output=True, text=True) \
        if shutil.which("tesseract") else None
    found = re.search(r'"(.+)"', listed.stdout.splitlines()[0]) if listed and listed.stdout else None
    if not found or not (Path(found.group(1)) / "eng.traineddata").is_file():
        pytest.skip("no Tesseract with its English data")
    tessdata = tmp_path / "tessdata"  # English only
    tessdata.mkdir()
    (tessdata / "eng.traineddata").symlink_to(Path(found.group(1)) / "eng.traineddata")
    env = {**os.environ, "EVIDENTIA_DATA_DIR": str(cli_env), "EVIDENTIA_OCR": "on", "EVIDENTIA_TESSDATA": str(tessdata),
           "EVIDENTIA_OCR_LANGUAGES": "eng+fra"}
    proc = subprocess.run([sys.executable, "-m", "evidentia.cli", "index", write_sample_report(tmp_path / "acme.pdf")],
                          env=env, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert ("EVIDENTIA_OCR_LANGUAGES: fra is not installed, so pages of unknown language are read with eng: "
            "apt-get install tesseract-ocr-fra (EVIDENTIA_OCR_LANGUAGES=eng silences this)\n") in proc.stderr
    assert proc.stdout.startswith("1 document(s), 6 page(s) indexed")


# --- a newcomer's first hour: tenants, messages, limits, help ----------------------


def test_cli_and_api_see_the_same_documents(cli, cli_env, multilingual_pdf, tmp_path):
    """`evidentia index` files documents under a tenant exactly as an upload does: a key of
    that tenant sees them over HTTP, and the CLI sees uploads with tenant and id apart."""
    from fastapi.testclient import TestClient

    from evidentia.api.app import create_app
    from evidentia.config import Settings
    from evidentia.store import Store, store_path
    from tests.utils.api import upload, wait_indexed, wait_ready

    assert cli("index", multilingual_pdf.path).exit_code == 0  # the default tenant
    store = Store(store_path(cli_env))
    default_key = store.create_key("default").key
    acme_key = store.create_key("acme").key
    store.close()
    settings = Settings(data_dir=cli_env, dense=False, rate_limit_per_minute=100_000)
    with TestClient(create_app(settings)) as client:
        wait_ready(client)
        seen = client.get(f"/v1/documents/{multilingual_pdf.doc_id}", headers={"X-API-Key": default_key}).json()
        assert seen["status"] == "ready" and seen["pages"] == 9
        body = {"question": "greenhouse gas emissions", "answer": "", "document_ids": [multilingual_pdf.doc_id]}
        found = client.post("/v1/validate", headers={"X-API-Key": default_key}, json=body).json()
        assert found["pages"][0]["page"] == 1
        assert client.get(f"/v1/documents/{multilingual_pdf.doc_id}/pages/1.png",
                          headers={"X-API-Key": default_key}).status_code == 200  # the CLI kept the file
        # another tenant sees none of it
        assert client.get(f"/v1/documents/{multilingual_pdf.doc_id}",
                          headers={"X-API-Key": acme_key}).status_code == 404
        report = write_sample_report(tmp_path / "bhp-ctap.pdf")
        assert upload(client, {"X-API-Key": acme_key}, report).status_code == 202
        wait_indexed(client, {"X-API-Key": acme_key}, "bhp-ctap")
    listed = cli("docs")
    assert "acme\tbhp-ctap\t6" in listed.stdout and "acme:" not in listed.stdout
    assert cli("docs", "--tenant", "acme").stdout.splitlines()[1:] == ["acme\tbhp-ctap\t6\t1\ten:3, fr:1, de:1"]
    hits = cli("search", "--tenant", "acme", "--doc", "bhp-ctap", "-q", "Scope 1 emissions", "--json")
    assert hits.exit_code == 0 and json.loads(hits.stdout)["pages"][0]["document_id"] == "bhp-ctap"
    # the default tenant has no such document
    assert cli("search", "--doc", "bhp-ctap", "-q", "Scope 1 emissions").exit_code == 1
    assert cli("delete", "--tenant", "acme", "bhp-ctap").exit_code == 0
    assert cli("docs", "--tenant", "acme").stdout.strip() == "no document indexed for tenant acme"
    assert cli("docs", "--tenant", "a:b").exit_code == 2
    for command in (("docs",), ("search", "--doc", "bhp-ctap", "-q", "Scope 1"), ("delete", "bhp-ctap")):
        empty = cli(*command, "--tenant", "")  # was the default tenant (docs: every tenant), silently
        assert empty.exit_code == 2 and "tenant name is empty" in empty.stderr, command


def test_search_says_an_upload_is_still_indexing_or_failed_not_unknown(cli, cli_env, indexed):
    """The API's uploads are in the store before the index: a search for one still
    queued, or one that failed, says so (the API's 409), instead of "unknown"."""
    _store_uploads(cli_env)
    queued = cli("search", "--tenant", "acme", "--doc", "queued-report", "-q", "emissions")
    assert queued.exit_code == 1
    assert queued.stderr == "error: queued-report is still queued: `evidentia docs` shows when it is ready\n"
    failed = cli("search", "--tenant", "acme", "--doc", "broken", "-q", "emissions")
    assert failed.exit_code == 1 and "broken failed to index: encrypted PDF (password required)" in failed.stderr
    unknown = cli("search", "--tenant", "acme", "--doc", "nothing", "-q", "emissions")
    assert unknown.exit_code == 1 and "unknown document id(s): nothing" in unknown.stderr


def test_demo_leaves_nothing_behind_unless_kept(cli, cli_env):
    result = cli("demo")
    assert result.exit_code == 0, result.output
    assert "page 2" in result.stdout and "temporary folder, now removed" in result.stderr
    assert "lists them" not in result.stderr  # they are gone
    assert not cli_env.exists()
    kept = cli("demo", "--keep")
    assert kept.exit_code == 0 and f"kept in {cli_env}" in kept.stderr and "lists them" in kept.stderr
    assert "search it with `evidentia search --doc acme-sustainability-2023 -q" in kept.stderr
    assert "acme-sustainability-2023" in cli("docs").stdout


def test_messages_say_what_happened_and_what_to_do(cli, indexed, tmp_path):
    stop_words = cli("search", "--doc", indexed, "-q", "What is the of and?")
    assert stop_words.exit_code == 0 and "no searchable word" in stop_words.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = cli("index", empty)
    assert nothing.exit_code == 1 and f"no PDF found in {empty}" in nothing.stderr
    assert "--json  " in cli("docs", "--help").stdout and "<bool>" not in cli("search", "--help").stdout


def test_cli_and_api_share_the_text_limits(cli, indexed):
    too_long = cli("search", "--doc", indexed, "-q", "water", "-a", "x" * 5001)
    assert too_long.exit_code == 2
    assert too_long.stderr.strip() == ("error: --answer at most 5000 characters (got 5001; "
                                       "EVIDENTIA_MAX_ANSWER_CHARS)")


def test_search_reports_a_fallback_and_strict_exits_non_zero(cli, indexed, monkeypatch):
    import socket

    with socket.socket() as s:  # a port where nothing listens: the LLM cannot be reached
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("EVIDENTIA_LLM_BASE_URL", f"http://127.0.0.1:{port}/v1")
    monkeypatch.setenv("EVIDENTIA_LLM_API_KEY", "dummy")
    monkeypatch.setenv("EVIDENTIA_LLM_MAX_RETRIES", "0")
    plain = cli("search", "--doc", indexed, "-q", "emissions", "--reranker", "llm", "--json")
    assert plain.exit_code == 0
    out = json.loads(plain.stdout)
    assert out["fallback"] is True and "connection" in out["fallback_reason"] and out["pages"]
    assert "could not rank, so the bm25 order is shown" in plain.stderr
    strict = cli("search", "--doc", indexed, "-q", "emissions", "--reranker", "llm", "--strict")
    assert strict.exit_code == 4 and strict.stdout  # the pages still come, the exit code tells scripts
    assert cli("search", "--doc", indexed, "-q", "emissions", "--strict").exit_code == 0  # no reranker, no fallback


def test_search_help_shows_the_declared_defaults():
    """The help must not drift from the settings (it once said 0.15 for a 0.065 threshold)."""
    from evidentia.config import Settings

    defaults = Settings()
    out = " ".join(CliRunner().invoke(app, ["search", "--help"], terminal_width=200).output.split())
    assert f"EVIDENTIA_CLASSIFIER_THRESHOLD, {defaults.classifier_threshold})" in out
    assert f"EVIDENTIA_POOL_SIZE, {defaults.pool_size})" in out
    assert f"EVIDENTIA_DEFAULT_RERANKER, {defaults.default_reranker})" in out


def _command_paths(command, path=()):
    """Every command and group of the app, as the words that name it (() for the app)."""
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from _command_paths(sub, (*path, name))


def test_version_and_h_are_understood_by_the_app_and_every_command(cli_env):
    """`evidentia --version` and `-h` were each "No such option", everywhere."""
    from importlib.metadata import version

    from typer.main import get_command

    runner = CliRunner()
    shown = runner.invoke(app, ["--version"])
    assert shown.exit_code == 0 and shown.stdout == f"evidentia {version('evidentia')}\n"
    paths = list(_command_paths(get_command(app)))
    assert {("models", "promote"), ("keys", "delete"), ("search",), ()} <= set(paths)
    for path in paths:
        short = runner.invoke(app, [*path, "-h"])
        assert short.exit_code == 0, (path, short.output)
        assert short.stdout == runner.invoke(app, [*path, "--help"]).stdout and "-h, --help" in short.stdout


def test_help_names_arguments_and_repeatable_options_by_their_values():
    """Usage read `index [OPTIONS] {paths}...`, and a list's type `paths... <list[Path]>`
    or `--doc <list[str]>`."""
    from typer.main import get_command

    runner = CliRunner()
    index = runner.invoke(app, ["index", "--help"], terminal_width=200).stdout
    assert " index [OPTIONS] PATHS...\n" in index
    assert re.search(r"^  PATHS\.\.\.  PDF files or folders", index, re.M)
    assert " page [OPTIONS] DOC_ID NUMBER\n" in runner.invoke(app, ["page", "--help"]).stdout
    assert re.search(r"^  --doc ID  ", runner.invoke(app, ["search", "--help"]).stdout, re.M)
    for path in _command_paths(get_command(app)):
        text = runner.invoke(app, [*path, "--help"], terminal_width=200).stdout
        assert "<list[" not in text and not re.search(r"\{\w+\}", text), (path, text)


# --- documents of another tenant, uploads not searchable, messages ------------------


def _store_uploads(cli_env):
    """An upload of tenant acme still queued and one that failed, as the API's worker leaves them."""
    from evidentia.store import Store, store_path

    store = Store(store_path(cli_env))
    store.add_tenant("acme")
    store.put_document("acme", "queued-report", "queued-report.pdf", 10, "/nowhere/a.pdf", "g1")
    store.put_document("acme", "broken", "broken.pdf", 10, "/nowhere/b.pdf", "g2")
    store.set_status("acme", "broken", "g2", "failed", reason="encrypted PDF (password required)")
    store.close()


def test_docs_lists_uploads_that_are_queued_or_failed_with_their_status(cli, cli_env, indexed):
    _store_uploads(cli_env)
    table = cli("docs")
    assert table.exit_code == 0
    lines = table.stdout.splitlines()
    assert lines[0].endswith("\tstatus")
    assert "acme\tbroken\t0\t0\t-\t0\t0\tfailed: encrypted PDF (password required)" in lines
    assert "acme\tqueued-report\t0\t0\t-\t0\t0\tqueued" in lines
    assert any(line.startswith(f"default\t{indexed}\t9\t") and line.endswith("\tready") for line in lines)
    listed = json.loads(cli("docs", "--json", "--tenant", "acme").stdout)["documents"]
    assert [(d["document_id"], d["status"], d["reason"]) for d in listed] == [
        ("broken", "failed", "encrypted PDF (password required)"), ("queued-report", "queued", None)]


def test_a_document_of_another_tenant_is_named_with_the_tenant_to_give(cli, cli_env, indexed, tmp_path):
    pdf = write_sample_report(tmp_path / "amcor-q4.pdf")
    assert cli("index", "--tenant", "acme", pdf).exit_code == 0
    _store_uploads(cli_env)
    search = cli("search", "--doc", "amcor-q4", "-q", "net sales")
    assert search.exit_code == 1
    assert error_lines(search.stderr) == ["error: amcor-q4 is in tenant acme: add --tenant acme"]
    both = cli("search", "--doc", "amcor-q4", "--doc", "nope", "-q", "net sales")
    assert error_lines(both.stderr) == ["error: amcor-q4 is in tenant acme: add --tenant acme; unknown document "
                                        "id(s): nope; `evidentia docs` lists the indexed ones"]
    failed_elsewhere = cli("search", "--doc", "broken", "-q", "net sales")
    assert error_lines(failed_elsewhere.stderr) == ["error: broken is in tenant acme: add --tenant acme"]
    # a file's name typed for its id: the id it has
    named = cli("search", "--tenant", "acme", "--doc", "amcor-q4.pdf", "-q", "net sales")
    assert named.exit_code == 1 and error_lines(named.stderr)[0].endswith(
        "'amcor-q4.pdf' is a file's name: its document id is amcor-q4")
    # ... and where the document is another tenant's, which tenant; `delete` says it too
    elsewhere = cli("search", "--doc", "amcor-q4.pdf", "-q", "net sales")
    assert error_lines(elsewhere.stderr)[0].endswith(
        "'amcor-q4.pdf' is a file's name: its document id is amcor-q4, in tenant acme: add --tenant acme")
    assert error_lines(cli("delete", "--tenant", "acme", "amcor-q4.pdf").stderr)[0].endswith(
        "'amcor-q4.pdf' is a file's name: its document id is amcor-q4")
    # several documents of one tenant: one clause, not one each
    several = cli("search", "--doc", "amcor-q4", "--doc", "broken", "-q", "net sales")
    assert error_lines(several.stderr) == ["error: amcor-q4, broken are in tenant acme: add --tenant acme"]
    delete = cli("delete", "amcor-q4")
    assert delete.exit_code == 1
    assert error_lines(delete.stderr) == ["error: amcor-q4 is in tenant acme: add --tenant acme"]
    assert cli("delete", "--tenant", "acme", "amcor-q4").exit_code == 0


def test_search_says_to_repeat_doc_for_ids_joined_by_commas(cli, indexed, tmp_path):
    """`--doc A,B` was one unknown id "A,B", and nothing said --doc takes one id a time."""
    assert cli("index", write_sample_report(tmp_path / "acme.pdf")).exit_code == 0
    for joined, repeated in ((f"{indexed},acme", f"--doc {indexed} --doc acme"),
                             (f"{indexed}, nope", f"--doc {indexed} --doc nope")):  # half known: still a list
        result = cli("search", "--doc", joined, "-q", "emissions")
        assert result.exit_code == 1
        (line,) = error_lines(result.stderr)
        assert line.startswith(f"error: unknown document id(s): {joined}; ")
        assert line.endswith(f"; {joined!r} is 2 ids: repeat --doc for each ({repeated})")
    # mostly unknown: one id with commas in it, nothing said of --doc
    assert "repeat --doc" not in cli("search", "--doc", f"x,y,{indexed}", "-q", "emissions").stderr


def test_search_and_page_suggest_the_closest_id_in_any_case(cli, indexed, tmp_path):
    """`3M_2018_10k` for `3M_2018_10K` was told nothing more than that it is unknown,
    where `eval` names the closest id."""
    assert cli("index", write_sample_report(tmp_path / "3M_2018_10K.pdf")).exit_code == 0
    for args in (["search", "--doc", "3M_2018_10k", "-q", "emissions"], ["page", "3M_2018_10k", "1"],
                 ["search", "--doc", indexed, "--doc", "3M_2018_10Q", "-q", "emissions"]):
        result = cli(*args)
        assert result.exit_code == 1, args
        (line,) = error_lines(result.stderr)
        typed = "3M_2018_10Q" if "3M_2018_10Q" in args else "3M_2018_10k"
        assert line.startswith(f"error: unknown document id(s): {typed}; ")
        assert line.endswith(f"; the indexed id closest to {typed} is 3M_2018_10K"), line
    far = cli("search", "--doc", "tesla-2022", "-q", "emissions")
    assert far.exit_code == 1 and "closest" not in far.stderr


def test_threshold_without_a_probability_reranker_says_so_plainly(cli, indexed):
    result = cli("search", "--doc", indexed, "-q", "emissions", "--threshold", "0.5", "--reranker", "none")
    assert result.exit_code == 2
    assert result.stderr.strip() == ("error: --threshold needs a reranker that outputs probabilities "
                                     "(e.g. classifier); the reranker here is none")


def test_a_fallback_warning_says_the_first_stage_order_once(cli, indexed, monkeypatch):
    monkeypatch.setenv("EVIDENTIA_LLM_API_KEY", "")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    result = cli("search", "--doc", indexed, "-q", "emissions", "--reranker", "llm")
    assert result.exit_code == 0
    warning = [line for line in result.stderr.splitlines() if line.startswith("warning: the llm reranker")]
    assert len(warning) == 1 and "order is shown" in warning[0]
    assert "first-stage order returned" not in warning[0]


# --- settings: refused at start-up in one line, or warned about ---------------------------


def test_a_bad_default_reranker_is_named_as_the_setting_not_as_a_flag_never_given(cli, monkeypatch):
    monkeypatch.setenv("EVIDENTIA_DEFAULT_RERANKER", "foo")
    result = cli("search", "--doc", "x", "-q", "emissions")
    assert result.exit_code == 2
    assert result.stderr == ("error: EVIDENTIA_DEFAULT_RERANKER must be one of none, llm, classifier, cosine, "
                             "not 'foo'\n")


@pytest.mark.parametrize("env, expected", [
    # an OverflowError's 195-line traceback from the extraction's wait
    ({"EVIDENTIA_EXTRACT_TIMEOUT_S": "3000000"}, "EVIDENTIA_EXTRACT_TIMEOUT_S must be a positive number of seconds, "
     "at most 86400 (a day), not '3000000'"),
    ({"EVIDENTIA_EXTRACT_TIMEOUT_S": "inf"}, "EVIDENTIA_EXTRACT_TIMEOUT_S must be a positive number of seconds, "
     "at most 86400 (a day), not 'inf'"),
    ({"EVIDENTIA_DENSE": "on", "EVIDENTIA_DENSE_WINDOW_OVERLAP": "500"}, "EVIDENTIA_DENSE_WINDOW_OVERLAP must be "
     "less than EVIDENTIA_DENSE_MAX_TOKENS - 2 (254), not 500"),
])
def test_index_refuses_settings_it_cannot_use_before_any_work(cli, multilingual_pdf, monkeypatch, env, expected):
    for name, raw in env.items():
        monkeypatch.setenv(name, raw)
    result = cli("index", multilingual_pdf.path)
    assert result.exit_code == 2
    assert result.stderr == f"error: {expected}\n"


def test_unknown_variables_and_an_ignored_elasticsearch_url_are_warned_about(cli, monkeypatch):
    monkeypatch.setenv("EVIDENTIA_TOP_K", "abc")  # the setting is EVIDENTIA_POOL_SIZE
    monkeypatch.setenv("EVIDENTIA_ES_URL", "http://localhost:9200")
    monkeypatch.setenv("EVIDENTIA_UI_SCREENSHOTS", "docs")  # read by a test: not warned about
    result = cli("docs")
    assert result.exit_code == 0, result.output
    assert [line for line in result.stderr.splitlines() if not line.startswith("(data directory")] == [
        "warning: EVIDENTIA_TOP_K is not a setting of Evidentia and is ignored; did you mean EVIDENTIA_POOL_SIZE?",
        "warning: EVIDENTIA_ES_URL is set but EVIDENTIA_BACKEND is embedded; set EVIDENTIA_BACKEND=elasticsearch "
        "to use it"]


def test_the_settings_warnings_are_said_once_per_command(cli, monkeypatch, capsys):
    from evidentia.console import read_settings

    monkeypatch.setenv("EVIDENTIA_TOP_K", "abc")
    assert cli("docs").stderr.count("EVIDENTIA_TOP_K") == 1
    read_settings()  # the same command reading them again (train does) says nothing more
    assert "EVIDENTIA_TOP_K" not in capsys.readouterr().err
    assert cli("docs").stderr.count("EVIDENTIA_TOP_K") == 1  # the next command says it again
