"""POST /v1/feedback keeps only verdicts that are true of the page: none outlives a
delete, none pairs a question with a re-uploaded file's page, a page's verdicts are
bounded, and the export orders verdicts as the store resolves them."""

from __future__ import annotations

import json

from evidentia.samples import write_pdf
from evidentia.store import MAX_VERDICTS_PER_PAGE
from evidentia.training.dataset import read_records
from evidentia.training.lifecycle import verdicts_from_records, verdicts_from_store
from evidentia.training.retrain import resolve_verdicts
from tests.utils.api import (
    assert_error, new_tenant, ready_document, services_of, upload, validate, wait_indexed,
)


def _tenant(client, headers) -> str:
    return services_of(client).store.authenticate(headers["X-API-Key"]).tenant


def _verdict(client, h, vid, relevant=True, analyst="ann", page=2, doc="acme-2023"):
    return client.post("/v1/feedback", headers=h, json={"validation_id": vid, "document_id": doc, "page": page,
                                                        "relevant": relevant, "analyst": analyst})


def test_a_delete_between_reading_the_page_and_storing_the_verdict_wins(client, sample_pdf, monkeypatch):
    """60 verdicts fired during a DELETE: after its 204 the export still held the deleted
    document's page text. Here the delete lands right after the page is read."""
    h = new_tenant(client)
    ready_document(client, h, sample_pdf)
    vid = validate(client, h, ["acme-2023"]).json()["validation_id"]
    services = services_of(client)
    tenant = _tenant(client, h)
    backend = services.backend
    real = backend.get_page

    def read_then_deleted(doc_id, page):
        found = real(doc_id, page)
        if doc_id.endswith("acme-2023"):
            services.store.delete_document(tenant, "acme-2023")  # the delete's store transaction
        return found

    monkeypatch.setattr(backend, "get_page", read_then_deleted)
    err = assert_error(_verdict(client, h, vid), 409, "document_gone")
    assert "acme-2023" in err["message"]
    assert client.get("/v1/feedback/export", headers=h).text == ""


def test_feedback_on_a_validation_of_the_replaced_file_is_refused(client, sample_pdf, tmp_path):
    """Validated on a.pdf, re-uploaded as b.pdf: the old question was exported with b's
    page ("Lunch menu", relevance 1)."""
    h = new_tenant(client)
    ready_document(client, h, sample_pdf, "swap")
    vid = validate(client, h, ["swap"]).json()["validation_id"]
    other = write_pdf(tmp_path / "b.pdf", ["Lunch menu: soup of the day.", "Lunch menu: dessert."])
    assert upload(client, h, other, document_id="swap").status_code == 202
    assert wait_indexed(client, h, "swap")["status"] == "ready"
    assert "Lunch menu" in client.get("/v1/documents/swap/pages/1", headers=h).json()["text"]
    err = assert_error(_verdict(client, h, vid, page=2, doc="swap"), 409, "document_changed")
    assert "validate again" in err["message"] and err["details"]["document_id"] == "swap"
    assert client.get("/v1/feedback/export", headers=h).text == ""
    # a validation of the new file takes feedback
    body = validate(client, h, ["swap"], question="lunch menu", answer="soup").json()
    page = body["pages"][0]["page"]
    assert _verdict(client, h, body["validation_id"], page=page, doc="swap").status_code == 201


def test_verdicts_on_one_page_are_bounded(client, sample_pdf):
    """3000 analysts on one page all got 201, each copying its text: 273 MB."""
    h = new_tenant(client)
    ready_document(client, h, sample_pdf)
    vid = validate(client, h, ["acme-2023"]).json()["validation_id"]
    for i in range(MAX_VERDICTS_PER_PAGE):
        assert _verdict(client, h, vid, analyst=f"an{i}").status_code == 201
    err = assert_error(_verdict(client, h, vid, analyst="an-extra"), 409, "too_many_verdicts")
    assert err["details"]["limit"] == MAX_VERDICTS_PER_PAGE and "/" not in err["message"]
    assert _verdict(client, h, vid, relevant=False, analyst="an0").status_code == 201  # a change is no new verdict
    assert len(client.get("/v1/feedback/export", headers=h).text.splitlines()) == MAX_VERDICTS_PER_PAGE


def test_the_export_and_the_store_resolve_a_tie_the_same(client, sample_pdf, tmp_path):
    """ann false, bob true, ann false again: the store said false (the latest), the
    export true (ann's row kept its place before bob's)."""
    h = new_tenant(client)
    ready_document(client, h, sample_pdf)
    vid = validate(client, h, ["acme-2023"]).json()["validation_id"]
    ids = [_verdict(client, h, vid, relevant, analyst).json()["feedback_id"]
           for analyst, relevant in (("ann", False), ("bob", True), ("ann", False))]
    assert ids[2] > ids[1]
    export = client.get("/v1/feedback/export", headers=h).text
    assert [json.loads(x)["relevance"] for x in export.splitlines()] == [1, 0]
    path = tmp_path / "export.jsonl"
    path.write_text(export)
    tenant = _tenant(client, h)
    from_export = resolve_verdicts(verdicts_from_records(read_records(path), tenant))
    from_store = {k: v for k, v in resolve_verdicts(verdicts_from_store(services_of(client).settings)).items()
                  if k[2].startswith(f"{tenant}:")}
    assert from_export == from_store and list(from_export.values()) == [False]
