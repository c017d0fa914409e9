"""`evidentia eval` end to end, on PDFs generated in tmp_path."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import pytest
from typer.testing import CliRunner

from evidentia.cli import app
from evidentia.records import Candidate, Query, RankedPage
from evidentia.reranker import registry
from evidentia.reranker.base import Reranker, RerankResult
from evidentia.samples import write_pdf
from evidentia.text import keywords

ALPHA = [
    "Annual report 2023. Introduction and overview of the company and its markets.",
    "Greenhouse gas emissions. Scope 1 and scope 2 emissions were 12450 tonnes of CO2 equivalent in 2023.",
    "Water. Water consumption fell to 3.2 million litres; water withdrawal from stressed basins was reduced.",
    "Health and safety. The lost time injury rate was 0.8; every employee received safety training.",
    "Governance. The board of directors has nine members, seven of them independent directors.",
]
BETA = [
    "Revenue grew to 5 million euros and net income to 0.4 million euros.",
    "Capital expenditure on property, plant and equipment was 1577 thousand euros.",
    "Suppliers sign a code of conduct banning child labour; 87 percent of suppliers were audited.",
]
QUERIES = [
    {"id": "q1", "doc_id": "alpha", "question": "What were the scope 1 and 2 greenhouse gas emissions?",
     "answer": "12450 tonnes CO2", "relevant_pages": [2], "question_type": "metric", "company": "ACME"},
    {"id": "q2", "doc_id": "alpha", "question": "How much water was consumed?", "answer": "3.2 million litres",
     "relevant_pages": [3], "question_type": "metric", "company": "ACME"},
    {"id": "q3", "doc_id": "alpha", "question": "What is the injury rate and is there safety training?",
     "answer": "0.8", "relevant_pages": [4, 1], "question_type": "narrative", "company": "ACME"},
    {"id": "q4", "doc_id": "beta", "question": "What was the capital expenditure?", "answer": "1577 thousand euros",
     "relevant_pages": [2], "question_type": "metric", "company": "ACME", "difficulty": 2},
    {"id": "q5", "doc_ids": ["alpha", "beta"], "question": "Do suppliers sign a code of conduct, says the 2023 annual report?",
     "answer": "yes, 87 percent audited", "relevant_pages": {"beta": [3]}, "question_type": "narrative",
     "company": "ACME"},
    {"id": "q6", "doc_id": "alpha", "question": "How many independent directors sit on the board?",
     "answer": "seven", "relevant_pages": [], "question_type": "narrative", "company": "ACME"},
    # Judged against the text on purpose, so that P@1 is not trivially 1.
    {"id": "q7", "doc_id": "beta", "question": "How much did revenue grow?", "answer": "5 million euros",
     "relevant_pages": [3], "question_type": "narrative", "company": "ACME"},
]


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("EVIDENTIA_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("EVIDENTIA_BACKEND", raising=False)
    monkeypatch.delenv("EVIDENTIA_POOL_SIZE", raising=False)
    pdfs = tmp_path / "pdfs"
    pdfs.mkdir()
    write_pdf(pdfs / "alpha.pdf", ALPHA)
    write_pdf(pdfs / "beta.pdf", BETA)
    write_pdf(pdfs / "unrelated.pdf", ["Nothing to see."])
    queries = tmp_path / "queries.jsonl"
    queries.write_text("".join(json.dumps(q) + "\n" for q in QUERIES))
    return tmp_path, pdfs, queries


def invoke(*args):
    result = CliRunner().invoke(app, ["eval", *map(str, args)])
    return result


def table_value(output: str, metric: str, column: int = 0) -> str:
    for line in output.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells and cells[0] == metric:
            return cells[1 + column]
    raise AssertionError(f"no row {metric!r} in:\n{output}")


def read_run(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def relevant_of(q: dict) -> set[tuple[str, int]]:
    rel = q["relevant_pages"]
    if isinstance(rel, dict):
        return {(d, p) for d, pages in rel.items() for p in pages}
    return {(q["doc_id"], p) for p in rel}


def check_png(path: Path) -> None:
    import matplotlib.image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = matplotlib.image.imread(path)
    assert img.shape[0] > 100 and img.shape[1] > 100


# --------------------------------------------------------------------------- bm25 end to end


def test_eval_says_nothing_of_the_search_default_when_it_measures_it(env, monkeypatch):
    _, pdfs, queries = env
    monkeypatch.setenv("EVIDENTIA_STAGE", "bm25")
    result = invoke("--queries", queries, "--pdf-dir", pdfs, "--compare", "bm25,bm25+cosine")
    assert result.exit_code == 0, result.output
    assert "note:" not in result.stderr


def test_eval_bm25_end_to_end(env, monkeypatch):
    tmp, pdfs, queries = env
    monkeypatch.setenv("EVIDENTIA_STAGE", "hybrid")  # the tests' default is bm25 (EVIDENTIA_DENSE=off)
    run_file = tmp / "out" / "run.jsonl"
    report = tmp / "report"
    result = invoke("--queries", queries, "--pdf-dir", pdfs, "--compare", "bm25",
                    "--run-out", run_file, "--report", report)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert table_value(out, "queries") == "7"
    assert table_value(out, "queries w/o relevant page") == "1"
    assert "R@20: recall of the first-stage candidate pool" in out
    assert "1 query without relevant pages" in out
    # only the documents the queries name were indexed from --pdf-dir
    assert "2 document(s)" in result.stderr
    # a newcomer measured bm25 and took it for what `search` returns (hybrid by default)
    assert "note: `evidentia search` runs hybrid by default, which is not among these" in result.stderr

    # The run file: one line per query, the whole pool (no reranker), best first.
    lines = read_run(run_file)
    assert [(line["config"], line["id"]) for line in lines] == [("bm25", q["id"]) for q in QUERIES]
    by_id = {q["id"]: q for q in QUERIES}
    for line in lines:
        q = by_id[line["id"]]
        docs = q.get("doc_ids") or [q["doc_id"]]
        ranking = line["ranking"]
        assert ranking, line
        assert all(set(item) == {"doc_id", "page", "score"} for item in ranking)
        assert all(item["doc_id"] in docs for item in ranking)
        scores = [item["score"] for item in ranking]
        assert scores == sorted(scores, reverse=True)
    # q5 searches both documents
    assert {item["doc_id"] for item in next(x for x in lines if x["id"] == "q5")["ranking"]} == {"alpha", "beta"}

    # P@1 recomputed from the run file is the printed number.
    hits = [
        1.0 if (line["ranking"][0]["doc_id"], line["ranking"][0]["page"]) in relevant_of(by_id[line["id"]]) else 0.0
        for line in lines
    ]
    assert table_value(out, "P@1") == f"{sum(hits) / len(hits):.3f}"
    # and the pool recall (q6 has no relevant page and is skipped); here the pool is the whole ranking.
    recalls = [len(relevant_of(by_id[x["id"]]) & {(i["doc_id"], i["page"]) for i in x["ranking"]})
               / len(relevant_of(by_id[x["id"]])) for x in lines if relevant_of(by_id[x["id"]])]
    assert len(recalls) == 6
    assert table_value(out, "R@20") == f"{sum(recalls) / len(recalls):.3f}"

    # Category breakdown: question_type (2 values); company has one value, difficulty is a number.
    assert "By question_type:" in out
    assert "By company" not in out and "By difficulty" not in out
    assert re.search(r"^metric\s+3\s", out, re.M) and re.search(r"^narrative\s+4\s", out, re.M)

    # The report: PNG files, also embedded in a self-contained index.html.
    index = report / "index.html"
    html = index.read_text()
    pngs = sorted(report.glob("*.png"))
    assert {p.name for p in pngs} == {"metrics.png", "category-question-type.png"}
    for png in pngs:
        check_png(png)
    assert html.count("data:image/png;base64,") == len(pngs)
    assert "<table>" in html and "question_type" in html
    assert "src=\"http" not in html and "<script" not in html


def test_eval_measures_what_a_search_runs_by_default(env, monkeypatch):
    """Without --compare, the configuration `evidentia search` runs without options (its
    stage, its reranker); it was bm25 whatever the search ran."""
    _, pdfs, queries = env
    monkeypatch.setenv("EVIDENTIA_DEFAULT_RERANKER", "cosine")
    data = json.loads(invoke("--queries", queries, "--pdf-dir", pdfs, "--json").stdout)
    assert list(data["configs"]) == ["bm25+cosine"]  # the tests' stage is bm25 (EVIDENTIA_DENSE=off)
    monkeypatch.setenv("EVIDENTIA_STAGE", "hybrid")
    shorthand = invoke("--queries", queries, "--reranker", "cosine", "--json")
    assert "hybrid+cosine" in shorthand.output  # the search's stage (no page vectors here: said so)


def test_eval_json_and_k(env):
    tmp, pdfs, queries = env
    result = invoke("--queries", queries, "--pdf-dir", pdfs, "--json", "--k", "1,2,5", "--pool-size", "3")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["k"] == [1, 2, 5] and data["pool_size"] == 3
    bm25 = data["configs"]["bm25"]
    for key in ("P@1", "P@2", "P@5", "R@1", "R@2", "R@5", "R@3", "MRR", "nDCG@10", "MAP", "pages_per_query"):
        assert isinstance(bm25[key], float), key
    assert bm25["pages_per_query"] <= 3
    assert bm25["ECE"] is None and bm25["probabilistic"] is False
    cats = data["categories"]["question_type"]
    assert set(cats) == {"metric", "narrative"}
    assert cats["metric"]["bm25"]["queries"] == 3 and cats["narrative"]["bm25"]["queries_without_relevant"] == 1
    assert data["threshold_sweeps"] == {}


def test_eval_reuses_the_index(env):
    tmp, pdfs, queries = env
    assert invoke("--queries", queries, "--pdf-dir", pdfs).exit_code == 0
    second = invoke("--queries", queries)  # no --pdf-dir needed any more
    assert second.exit_code == 0, second.output
    assert "indexed" not in second.stderr


def test_what_eval_indexes_is_the_default_tenants_as_the_readme_says(env):
    """An API key of the tenant `default` sees the documents `eval --pdf-dir` indexed,
    with their page counts, as it sees those of `evidentia index`."""
    from fastapi.testclient import TestClient

    from tests.utils.api import make_app, wait_ready

    tmp, pdfs, queries = env
    assert invoke("--queries", queries, "--pdf-dir", pdfs).exit_code == 0
    key = CliRunner().invoke(app, ["keys", "create", "--tenant", "default"]).stdout.strip()
    with TestClient(make_app(tmp, data_dir=tmp / "data")) as client:
        wait_ready(client)
        listed = client.get("/v1/documents", headers={"X-API-Key": key}).json()["documents"]
        assert sorted((d["document_id"], d["status"], d["pages"]) for d in listed) == \
            [("alpha", "ready", len(ALPHA)), ("beta", "ready", len(BETA))]
        assert listed[0]["caption_only_pages"] == 0  # as an upload's, not null
        text = client.get("/v1/documents/alpha/pages/1", headers={"X-API-Key": key})
        assert text.status_code == 200 and text.json()["text"]


# --------------------------------------------------------------------------- errors


def test_an_unwritable_output_fails_before_the_run(env):
    tmp, pdfs, queries = env
    afile = tmp / "afile.txt"
    afile.write_text("x")
    result = invoke("--queries", queries, "--pdf-dir", pdfs, "--report", afile)
    assert result.exit_code == 1  # and at once: nothing indexed, nothing run
    assert result.stderr == (f"error: --report {afile} is a file: give a folder (the report is index.html and its "
                             "plots)\n")
    result = invoke("--queries", queries, "--pdf-dir", pdfs, "--run-out", tmp)
    assert result.exit_code == 1 and result.stderr.startswith(f"error: --run-out {tmp} is a folder")
    result = invoke("--queries", queries, "--pdf-dir", pdfs, "--report", afile / "sub")
    assert result.exit_code == 1 and result.stderr.startswith(f"error: --report {afile / 'sub'}: ")


def test_unknown_documents(env):
    tmp, pdfs, queries = env
    result = invoke("--queries", queries)
    assert result.exit_code == 1
    assert result.stderr.startswith("error: 2 document id(s) named in the queries are not indexed: alpha, beta")
    assert "--pdf-dir" in result.stderr and len(result.stderr.strip().splitlines()) == 1

    many = tmp / "many.jsonl"
    many.write_text("".join(json.dumps({**QUERIES[0], "id": f"m{i}", "doc_id": f"doc{i:02d}"}) + "\n"
                            for i in range(14)))
    result = invoke("--queries", many, "--pdf-dir", pdfs)
    assert result.exit_code == 1
    assert "14 document id(s)" in result.stderr and "and 4 more" in result.stderr
    assert "doc09" in result.stderr and "doc10" not in result.stderr
    assert "another tenant" not in result.stderr


def test_a_document_another_tenant_uploaded_is_named_as_such(env):
    """eval reads the default tenant's documents: one that only tenant acme has (an
    upload with its key) was reported as 'not indexed', with no hint why."""
    tmp, pdfs, queries = env
    assert CliRunner().invoke(app, ["index", "--tenant", "acme", str(pdfs / "alpha.pdf")]).exit_code == 0
    result = invoke("--queries", queries)
    assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("error: 2 document id(s) named in the queries are not indexed: alpha, beta")
    assert result.stderr.rstrip().endswith("(alpha: another tenant's upload; labelled queries read the documents "
                                           "of the tenant 'default', so index those PDFs for it too)")


def test_bad_inputs(env):
    tmp, pdfs, queries = env
    bad = tmp / "bad.jsonl"
    bad.write_text(json.dumps(QUERIES[0]) + "\n" + json.dumps({**QUERIES[1], "relevant_pages": [0]}) + "\n")
    result = invoke("--queries", bad)
    assert result.exit_code == 1
    assert re.match(r"error: .*bad\.jsonl, line 2: relevant_pages: page 0 is not a positive integer", result.stderr)

    result = invoke("--queries", queries, "--compare", "bm25,nosuch")
    assert result.exit_code == 2 and "unknown reranker 'nosuch'" in result.stderr
    assert result.stderr.startswith("error: ")

    for args, message in [(["--k", "0"], "--k"), (["--k", "x"], "--k"), (["--pool-size", "0"], "--pool-size"),
                          (["--pdf-dir", tmp / "nope"], "no such folder")]:
        result = invoke("--queries", queries, *args)
        assert result.exit_code == 2 and message in result.stderr, (args, result.stderr)

    result = invoke("--queries", tmp / "missing.jsonl")
    assert result.exit_code == 1 and "no such file" in result.stderr


# --------------------------------------------------------------------------- probability rerankers


class ProbeReranker(Reranker):
    """Test-only: probability = share of the question's keywords found on the page, squashed
    into [0.02, 0.98]; every pool page is returned, most probable first."""

    name = "probe"
    outputs_probabilities = True
    calls = 0

    built: list = []

    def __init__(self, threshold):
        self.threshold = threshold

    @classmethod
    def from_settings(cls, settings, threshold=None, embedder=None):
        cls.built.append(threshold)
        return cls(threshold)

    def rerank(self, query: Query, candidates: Sequence[Candidate]) -> RerankResult:
        type(self).calls += 1
        words = set(keywords(query.question, "en"))
        pages = []
        for c in candidates:
            found = set(keywords(c.text, "en"))
            share = len(words & found) / max(len(words), 1)
            prob = round(0.02 + 0.96 * share, 4)
            pages.append(RankedPage(doc_id=c.doc_id, page=c.page, score=prob, probability=prob, text=c.text))
        pages.sort(key=lambda p: (-p.probability, p.doc_id, p.page))
        if self.threshold is not None:
            pages = [p for p in pages if p.probability >= self.threshold]
        return RerankResult(pages=pages)


class PlainReranker(Reranker):
    name = "plain"

    def rerank(self, query, candidates):
        return RerankResult(pages=[RankedPage(c.doc_id, c.page, -c.page) for c in candidates])


@pytest.fixture
def probe(monkeypatch):
    ProbeReranker.calls = 0
    ProbeReranker.built = []
    monkeypatch.setitem(registry._CLASSES, "probe", ProbeReranker)
    monkeypatch.setitem(registry._CLASSES, "plain", PlainReranker)
    return ProbeReranker.built


def test_probability_configs_share_one_pass(env, probe):
    tmp, pdfs, queries = env
    run_file = tmp / "run.jsonl"
    report = tmp / "report"
    result = invoke("--queries", queries, "--pdf-dir", pdfs, "--compare", "bm25,probe@0.3,bm25+probe@0.6,probe",
                    "--run-out", run_file, "--report", report, "--json")
    assert result.exit_code == 0, result.output
    # one reranker built, without threshold, and one reranking pass over the 7 queries
    assert probe == [None]
    assert ProbeReranker.calls == len(QUERIES)

    data = json.loads(result.stdout)
    assert list(data["configs"]) == ["bm25", "bm25+probe@0.3", "bm25+probe@0.6", "bm25+probe"]
    low, high, everything = (data["configs"][k] for k in ("bm25+probe@0.3", "bm25+probe@0.6", "bm25+probe"))
    assert low["probabilistic"] and high["probabilistic"]
    # calibration is over the unfiltered pool, so it does not depend on the threshold
    for key in ("ECE", "Brier", "AUROC", "scored_pages"):
        assert low[key] == high[key] == everything[key]
    assert low["scored_pages"] == sum(len(x["ranking"]) for x in read_run(run_file) if x["config"] == "bm25")
    assert 0 <= low["ECE"] <= 1 and 0 <= low["Brier"] <= 1
    assert everything["pages_per_query"] >= low["pages_per_query"] >= high["pages_per_query"]
    assert everything["R@20"] == low["R@20"] == data["configs"]["bm25"]["R@20"]  # same pool

    # the sweep, from the cached probabilities, agrees with the configured thresholds
    sweep = data["threshold_sweeps"]["bm25+probe"]
    assert [row["threshold"] for row in sweep] == [round(0.05 * i, 2) for i in range(19)]
    at = {row["threshold"]: row for row in sweep}
    assert at[0.3]["P@3"] == pytest.approx(low["P@3"]) and at[0.3]["R@3"] == pytest.approx(low["R@3"])
    assert at[0.6]["pages_per_query"] == pytest.approx(high["pages_per_query"])
    assert at[0.0]["pages_per_query"] == pytest.approx(everything["pages_per_query"])
    # what a default t is chosen by: R@3 kept of the unthresholded, share of the pool returned
    assert at[0.0]["R@3_kept"] == pytest.approx(1.0) and at[0.0]["pool_share"] == pytest.approx(1.0)
    assert at[0.6]["R@3_kept"] == pytest.approx(high["R@3"] / everything["R@3"])
    assert at[0.6]["pool_share"] == pytest.approx(high["pages_per_query"] / everything["pages_per_query"])

    # the run file holds what was scored: probabilities, thresholded, best first
    lines = read_run(run_file)
    assert len(lines) == 4 * len(QUERIES)
    for line in lines:
        if line["config"] == "bm25+probe@0.6":
            assert all(item["probability"] >= 0.6 for item in line["ranking"])
        if "probe" in line["config"]:
            probs = [item["probability"] for item in line["ranking"]]
            assert probs == sorted(probs, reverse=True)
        else:
            assert all("probability" not in item for item in line["ranking"])

    # one sweep and one reliability diagram for the shared pass
    names = {p.name for p in report.glob("*.png")}
    assert names == {"metrics.png", "threshold-bm25-probe.png", "reliability-bm25-probe.png",
                     "category-question-type.png"}
    for png in report.glob("*.png"):
        check_png(png)
    page = (report / "index.html").read_text()
    assert page.count("data:image/png;base64,") == 4
    # the sweep's table says which thresholds meet the goals a default t is chosen by
    assert "R@3 kept" in page and "pool share" in page and "both goals" in page


def test_sweep_holds_every_configured_threshold_off_the_grid(env, probe):
    tmp, pdfs, queries = env
    result = invoke("--queries", queries, "--pdf-dir", pdfs, "--compare", "bm25+probe,bm25+probe@0.125", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    at = {row["threshold"]: row for row in data["threshold_sweeps"]["bm25+probe"]}
    assert 0.125 in at and 0.1 in at and 0.15 in at  # the default t of the shipped model is not on the grid
    assert at[0.125]["pages_per_query"] == pytest.approx(data["configs"]["bm25+probe@0.125"]["pages_per_query"])
    assert at[0.15]["pool_share"] <= at[0.125]["pool_share"] <= at[0.1]["pool_share"]


def test_probability_text_output(env, probe):
    tmp, pdfs, queries = env
    result = invoke("--queries", queries, "--pdf-dir", pdfs, "--compare", "bm25,probe@0.5")
    assert result.exit_code == 0, result.output
    header = result.stdout.splitlines()[0].split()
    assert header == ["metric", "bm25", "bm25+probe@0.5"]
    assert table_value(result.stdout, "ECE", 0) == "-"
    assert re.fullmatch(r"\d\.\d{3}", table_value(result.stdout, "ECE", 1))
    assert "ECE (10 bins), Brier and AUROC" in result.stdout


def test_threshold_needs_a_probability_reranker(env, probe):
    tmp, pdfs, queries = env
    result = invoke("--queries", queries, "--pdf-dir", pdfs, "--compare", "bm25,plain@0.3")
    assert result.exit_code == 2
    assert "does not output probabilities" in result.stderr
    assert invoke("--queries", queries, "--pdf-dir", pdfs, "--compare", "plain").exit_code == 0


# --------------------------------------------------------------------------- startup cost


def test_help_does_not_import_heavy_modules():
    code = ("import sys, evidentia.cli; "
            "print(sorted(m for m in ('matplotlib', 'sklearn', 'numpy', 'evidentia.evaluation.runner') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0 and "eval" in result.stdout


# --------------------------------------------------------------------------- labels and fallbacks said


def test_eval_refuses_a_relevant_page_beyond_the_document(env, tmp_path):
    _, pdfs, _ = env
    beyond = tmp_path / "beyond.jsonl"
    beyond.write_text(json.dumps({**QUERIES[0], "id": "far", "relevant_pages": [2, 99]}) + "\n")
    result = invoke("--queries", beyond, "--pdf-dir", pdfs)
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: {beyond}: query far: relevant page 99 of alpha, which has 5 page(s): pages are "
                      "1-based, as a PDF viewer numbers them; correct the page numbers, or the doc_id if the query "
                      "names the wrong document"]


def test_eval_warns_when_a_reranker_fell_back_to_the_first_stage_order(env, monkeypatch):
    _, pdfs, queries = env
    monkeypatch.setenv("EVIDENTIA_LLM_API_KEY", "")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    result = invoke("--queries", queries, "--pdf-dir", pdfs, "--compare", "bm25,llm")
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings == [f"warning: bm25+llm fell back to the bm25 order on {len(QUERIES)} of {len(QUERIES)} "
                        "queries, which its column scores: LLM not configured: no API key; set "
                        "EVIDENTIA_LLM_API_KEY (or OPENAI_API_KEY)"]


# --------------------------------------------------------------------------- document ids of --pdf-dir


ACCENTED = "Rapport durabilité 2023 (Société Générale des Eaux).pdf"


def test_pdf_dir_finds_a_pdf_by_the_id_index_gives_it(env):
    """A query names a document by its id, the file name as `evidentia index` and uploads
    make it (accents dropped, other runs '-'); eval looked for <doc_id>.pdf and failed."""
    from evidentia.store import document_id_for

    tmp, pdfs, _ = env
    write_pdf(pdfs / ACCENTED, ALPHA)
    doc_id = document_id_for(ACCENTED)
    assert doc_id == "Rapport-durabilite-2023-Societe-Generale-des-Eaux"
    queries = tmp / "accented.jsonl"
    queries.write_text(json.dumps({**QUERIES[0], "doc_id": doc_id}) + "\n")
    result = invoke("--queries", queries, "--pdf-dir", pdfs, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["configs"]["bm25"]["P@1"] is not None
    assert "1 document(s)" in result.stderr  # that file only
    docs = CliRunner().invoke(app, ["docs"]).stdout
    assert f"default\t{doc_id}\t{len(ALPHA)}\t" in docs


def test_a_query_naming_a_file_by_its_name_is_told_the_files_id(env):
    """A query naming 'Nachhaltigkeitsbericht_Müller_Größe' (the file's stem, not its id)
    was indexed under that stem, an id neither `evidentia index` nor the API gives: it is
    refused, naming the file and its id; a typo is told the closest file."""
    tmp, pdfs, _ = env
    write_pdf(pdfs / "Nachhaltigkeitsbericht_Müller_Größe.pdf", ALPHA)
    queries = tmp / "stem.jsonl"
    queries.write_text(json.dumps({**QUERIES[0], "doc_id": "Nachhaltigkeitsbericht_Müller_Größe"}) + "\n"
                       + json.dumps({**QUERIES[3], "doc_id": "betta"}) + "\n")
    result = invoke("--queries", queries, "--pdf-dir", pdfs)
    assert result.exit_code == 1, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1
    assert errors[0].startswith("error: 2 document id(s) named in the queries are not indexed: "
                                f"Nachhaltigkeitsbericht_Müller_Größe, betta; {pdfs} has no PDF with those ids")
    assert (f"Nachhaltigkeitsbericht_Müller_Größe is {pdfs / 'Nachhaltigkeitsbericht_Müller_Größe.pdf'}, whose id "
            "is Nachhaltigkeitsbericht_Muller_Grosse") in errors[0]
    assert f"the file closest to betta is {pdfs / 'beta.pdf'}, id beta" in errors[0]
    assert "Müller" not in CliRunner().invoke(app, ["docs"]).stdout  # nothing indexed under the stem


def test_plain_ascii_names_are_found_as_before(env):
    tmp, pdfs, queries = env
    (pdfs / "sub").mkdir()
    write_pdf(pdfs / "sub" / "gamma.v2.pdf", BETA)  # in a subfolder, a dot kept in the id
    more = tmp / "more.jsonl"
    more.write_text(queries.read_text() + json.dumps({**QUERIES[3], "id": "g", "doc_id": "gamma.v2"}) + "\n")
    result = invoke("--queries", more, "--pdf-dir", pdfs)
    assert result.exit_code == 0, result.output
    assert "3 document(s)" in result.stderr
    assert sorted(line.split("\t")[1] for line in CliRunner().invoke(app, ["docs"]).stdout.splitlines()[1:]) == \
        ["alpha", "beta", "gamma.v2"]


# --------------------------------------------------------------------------- the model scored


class VersionedProbe(ProbeReranker):
    name = "vprobe"

    @property
    def model_version(self) -> str:
        return "probe-model@2025-01-02+abcdef123456"


def test_eval_names_the_model_of_each_reranker_in_every_output(env, probe, monkeypatch):
    """A promoted model or EVIDENTIA_CLASSIFIER_MODEL changes what `hybrid+classifier`
    scores; the table, --json and --report said nothing of which model that was."""
    monkeypatch.setitem(registry._CLASSES, "vprobe", VersionedProbe)
    tmp, pdfs, queries = env
    version = "probe-model@2025-01-02+abcdef123456"
    report = tmp / "report"
    text = invoke("--queries", queries, "--pdf-dir", pdfs, "--compare", "bm25,vprobe,vprobe@0.3,probe",
                  "--report", report)
    assert text.exit_code == 0, text.output
    assert f"model of bm25+vprobe, bm25+vprobe@0.3: {version}" in text.stdout.splitlines()
    assert text.stdout.count(version) == 1  # not for bm25, nor for a reranker without a model version
    page = (report / "index.html").read_text()
    assert f"model of bm25+vprobe, bm25+vprobe@0.3: {version}" in page and f"model: {version}" in page
    data = json.loads(invoke("--queries", queries, "--compare", "bm25,vprobe@0.3,probe", "--json").stdout)
    assert {label: c["model_version"] for label, c in data["configs"].items()} == \
        {"bm25": None, "bm25+vprobe@0.3": version, "bm25+probe": None}


def test_eval_names_the_classifier_model_it_loaded(env, monkeypatch):
    """The real classifier, from EVIDENTIA_CLASSIFIER_MODEL: its directory names it."""
    import shutil

    from evidentia.reranker.classifier_model import SHIPPED_MODEL_DIR

    tmp, pdfs, queries = env
    model = tmp / "my-model"
    shutil.copytree(SHIPPED_MODEL_DIR, model)
    monkeypatch.setenv("EVIDENTIA_CLASSIFIER_MODEL", str(model))
    monkeypatch.setenv("EVIDENTIA_DENSE", "off")
    result = invoke("--queries", queries, "--pdf-dir", pdfs, "--compare", "bm25+classifier@0.1", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["configs"]["bm25+classifier@0.1"]["model_version"].startswith("my-model@")


# --------------------------------------------------------------------------- --reranker and --threshold


@pytest.mark.parametrize("args, message", [
    (["--threshold", "0.1"], "--threshold goes with --reranker (or write it in --compare, e.g. classifier@0.15)"),
    (["--reranker", "classifier", "--threshold", "1.5"], "--threshold must be between 0 and 1"),
    (["--reranker", "classifier", "--threshold", "-0.1"], "--threshold must be between 0 and 1"),
    (["--reranker", "cosine", "--threshold", "0.1"],
     "--threshold: reranker 'cosine' does not output probabilities, so it takes no threshold"),
    (["--reranker", "nosuch"], "--reranker: unknown reranker 'nosuch'; choose one of none, llm, classifier, cosine"),
])
def test_reranker_and_threshold_errors_name_their_flag(env, args, message):
    """They said '--compare: …', quoting 'bm25+classifier@1.5', which the user never wrote."""
    _, _, queries = env
    result = invoke("--queries", queries, *args)
    assert result.exit_code == 2 and result.stderr == f"error: {message}\n", result.output
