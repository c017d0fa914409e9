"""Findings of an attack on the API, each held here: page images reusable across keys and
versions from a browser's cache, upstream LLM errors (with the key) in `fallback_reason`,
megabyte echoes in 422s, control and bidi characters in `analyst`, and `filename=""`
uploads that all got one id."""

from __future__ import annotations

import json
import logging

import pytest
from fastapi.testclient import TestClient

from tests.utils.api import (
    ADMIN, assert_error, make_app, new_tenant, ready_document, upload, validate, wait_indexed, wait_ready,
)
from tests.utils.fake_openai import FakeOpenAI

SECRET_KEY = "sk-SECRET-abc123-0123456789"
INTERNAL = "llm-gw.corp.internal:8443 reading /srv/models/llama/ggml.bin"


# -- 1. page images: per key, per version, revalidated ------------------------------
def png(client, headers, etag: str | None = None, width: int = 120):
    extra = {"If-None-Match": etag} if etag else {}
    return client.get(f"/v1/documents/acme-2023/pages/1.png?width={width}", headers={**headers, **extra})


def test_a_page_image_is_revalidated_and_never_reused_across_keys_or_versions(client, sample_pdf, tmp_path):
    a, b = new_tenant(client), new_tenant(client)
    ready_document(client, a, sample_pdf)
    ready_document(client, b, sample_pdf)  # the same id, and even the same file, in another tenant
    first = png(client, a)
    assert first.status_code == 200 and first.headers["content-type"] == "image/png"
    cache_control = first.headers["cache-control"]
    assert "max-age" not in cache_control and "no-cache" in cache_control and "private" in cache_control
    vary = {v.strip().lower() for v in first.headers["vary"].split(",")}
    assert {"x-api-key", "authorization"} <= vary
    etag = first.headers["etag"]
    assert etag.startswith('"') and not etag.startswith("W/")
    # unchanged: a 304 without the image, with the same validators
    again = png(client, a, etag)
    assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == etag
    assert "no-cache" in again.headers["cache-control"]
    assert png(client, a, f'"other", W/{etag}').status_code == 304
    # another width is another image
    assert png(client, a, etag, width=121).status_code == 200
    # tenant B, same URL: never A's validator, never a 304 on it
    other = png(client, b, etag)
    assert other.status_code == 200 and other.headers["etag"] != etag
    # a re-upload is another version: the old validator gets the new image
    reuploaded = upload(client, a, sample_pdf)
    assert reuploaded.status_code == 202
    wait_indexed(client, a, "acme-2023")
    fresh = png(client, a, etag)
    assert fresh.status_code == 200 and fresh.headers["etag"] != etag
    # a revoked key: the revalidation is refused, not answered 304
    key_id = client.post("/v1/admin/keys", json={"tenant": "revoked-one"}, headers={"X-API-Key": ADMIN}).json()
    revoked = {"X-API-Key": key_id["key"]}
    ready_document(client, revoked, sample_pdf)
    kept = png(client, revoked).headers["etag"]
    assert client.delete(f"/v1/admin/keys/{key_id['key_id']}", headers={"X-API-Key": ADMIN}).status_code == 204
    assert_error(png(client, revoked, kept), 401)


# -- 2. the LLM's upstream errors stay in the server's log --------------------------
def echo_upstream(status: int):
    def answer(request: dict):
        return status, {"error": {"message": f"Incorrect API key provided: Bearer {SECRET_KEY}. internal host "
                                             f"{INTERNAL}", "type": "invalid_request_error"}}
    return answer


@pytest.mark.parametrize("status, reason", [
    (401, "LLM request rejected: 401 Unauthorized: check EVIDENTIA_LLM_API_KEY; first-stage order returned"),
    (500, "LLM unavailable after 1 attempt: 500 Internal Server Error; first-stage order returned"),
])
def test_fallback_reason_never_carries_the_upstream_body_or_the_key(tmp_path, sample_pdf, caplog, status, reason):
    with FakeOpenAI(handler=echo_upstream(status)) as llm:
        app = make_app(tmp_path / "app", llm_base_url=llm.base_url, llm_api_key=SECRET_KEY, llm_max_retries=0,
                       llm_tokenizer="chars", llm_structured_output="off")
        with TestClient(app) as c, caplog.at_level(logging.WARNING):
            wait_ready(c)
            h = new_tenant(c)
            ready_document(c, h, sample_pdf)
            response = validate(c, h, ["acme-2023"], reranker="llm")
            assert response.status_code == 200, response.text
            body = response.json()
            stored = c.app.state.services.store.get_validation(c.app.state.services.store.authenticate(
                h["X-API-Key"]).tenant, body["validation_id"])
    assert llm.requests, "the stub was not asked"
    assert body["fallback_reason"] == reason
    assert stored.fallback_reason == reason
    for leak in (SECRET_KEY, "Incorrect API key", "llm-gw", "/srv/models"):
        assert leak not in response.text
    # the server's log has what the upstream said, less the key
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "Incorrect API key provided" in logged and "llm-gw.corp.internal" in logged
    assert SECRET_KEY not in logged


# -- 3. echoes of a client's values are a prefix ------------------------------------
BASE = '"question": "What were the emissions?", "document_ids": ["acme-2023"]'


@pytest.mark.parametrize("content, field, prefix", [
    ("{" + BASE + ', "reranker": "' + "r" * 1_000_000 + '"}', "reranker", "'" + "r" * 99 + "…"),
    ("{" + BASE + ', "top_k": ' + "9" * 4000 + "}", "top_k", "9" * 100 + "…"),
    ("{" + BASE + ', "' + "k" * 100_000 + '": 1}', "k" * 100 + "…", "k" * 100 + "…"),
], ids=["reranker", "top_k", "unknown-field"])
def test_a_422_echoes_a_short_prefix_of_a_huge_value(client, sample_pdf, content, field, prefix):
    h = new_tenant(client)
    ready_document(client, h, sample_pdf)
    response = client.post("/v1/validate", headers={**h, "content-type": "application/json"}, content=content)
    err = assert_error(response, 422, "validation_error")
    assert len(response.content) < 3_000
    assert prefix in err["message"]
    assert any(d["loc"][-1] == field and len(d["message"]) < 1_100 for d in err["details"]), err["details"]


# -- 4. analyst: plain text on one line ----------------------------------------------
def test_analyst_refuses_control_and_bidi_characters(client, sample_pdf):
    h = new_tenant(client)
    ready_document(client, h, sample_pdf)
    body = validate(client, h, ["acme-2023"], top_k=2).json()
    fb = {"validation_id": body["validation_id"], "document_id": "acme-2023", "page": body["pages"][0]["page"],
          "relevant": True}
    for bad in ("ana\x00lyst", "\u202emoc.elpmaxe@ana", "ana\u2028lyst", "ana\r\nInjected: yes", "ana\nlyst",
                "ana\x1b[31m", "ana\u2066x\u2069", "ana\u200b", "\ufeffana"):
        err = assert_error(client.post("/v1/feedback", headers=h, json={**fb, "analyst": bad}), 422,
                           "validation_error")
        assert any(d["loc"][-1] == "analyst" for d in err["details"]), err
        assert "control, bidi or invisible character" in err["message"]
    ok = client.post("/v1/feedback", headers=h, json={**fb, "analyst": "ana.lyst@example.com (ESG team) é"})
    assert ok.status_code == 201, ok.text
    assert ok.json()["analyst"] == "ana.lyst@example.com (ESG team) é"


@pytest.mark.parametrize("field", ["question", "answer"])
def test_a_lone_surrogate_in_the_text_is_422_not_500(client, sample_pdf, field):
    """JSON's "\\udfff" is a character UTF-8 cannot hold: the answer reached the
    tokenizer and the store, and each request was a 500 with its traceback logged."""
    h = new_tenant(client)
    ready_document(client, h, sample_pdf)
    body = {"question": "net sales", "answer": "12 tCO2e", "document_ids": ["acme-2023"]}
    content = json.dumps(body).replace(f'"{body[field]}"', f'"12 \\udc80 {body[field]}"').encode()
    response = client.post("/v1/validate", headers={**h, "content-type": "application/json"}, content=content)
    err = assert_error(response, 422, "validation_error")
    assert any(d["loc"][-1] == field for d in err["details"]), err


# -- 5. a file part with an empty file name ------------------------------------------
def multipart(filename: str, data: bytes, document_id: str | None = None) -> tuple[bytes, str]:
    """A form whose file part says `filename=""` (httpx leaves an empty name out)."""
    boundary = "evidentia-test-boundary"
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
             "Content-Type: application/pdf\r\n\r\n".encode() + data + b"\r\n"]
    if document_id is not None:
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="document_id"\r\n\r\n'
                     f"{document_id}\r\n".encode())
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def test_a_file_part_with_an_empty_name_is_the_422_of_a_part_without_one(client, sample_pdf):
    h = new_tenant(client)
    boundary = "evidentia-test-boundary"  # a form (multipart) with no file part at all
    no_file = (f'--{boundary}\r\nContent-Disposition: form-data; name="document_id"\r\n\r\n\r\n'
               f"--{boundary}--\r\n").encode()
    without_name = assert_error(client.post("/v1/documents", content=no_file, headers={
        **h, "content-type": f"multipart/form-data; boundary={boundary}"}), 422, "validation_error")
    for name in ("", "/", "\x00"):
        body, content_type = multipart(name, sample_pdf.read_bytes())
        err = assert_error(client.post("/v1/documents", headers={**h, "content-type": content_type}, content=body),
                           422, "validation_error")
        assert err["message"] == without_name["message"] and err["details"] == without_name["details"]
    assert client.get("/v1/documents", headers=h).json() == {"documents": []}
    # with an id of its own, the name is not needed
    body, content_type = multipart("", sample_pdf.read_bytes(), document_id="named-by-id")
    accepted = client.post("/v1/documents", headers={**h, "content-type": content_type}, content=body)
    assert accepted.status_code == 202 and accepted.json()["document_id"] == "named-by-id"
