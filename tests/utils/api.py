"""Helpers for the API tests: an app on a temporary data dir, tenants, uploads,
polling, and the one error shape."""

from __future__ import annotations

import itertools
import struct
import time
from pathlib import Path

from fastapi.testclient import TestClient

from evidentia.api.app import create_app
from evidentia.config import Settings
from evidentia.samples import SAMPLE_ANSWER, SAMPLE_QUESTION

ADMIN = "admin-secret-for-tests"
_tenants = itertools.count(1)


def wait_ready(client: TestClient, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.get("/ready").status_code == 200:
            return
        time.sleep(0.02)
    raise AssertionError(f"not ready: {client.get('/ready').json()}")


def assert_error(response, status: int, code: str | None = None) -> dict:
    """The one error shape: {"error": {"code", "message", "details"}}."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "details"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code, body
    return body["error"]


def new_tenant(client: TestClient, tenant: str | None = None) -> dict[str, str]:
    tenant = tenant or f"t{next(_tenants)}"
    r = client.post("/v1/admin/keys", json={"tenant": tenant}, headers={"X-API-Key": ADMIN})
    assert r.status_code == 201, r.text
    return {"X-API-Key": r.json()["key"]}


def upload(client: TestClient, headers, path: Path, document_id: str | None = None, filename: str | None = None):
    data = {"document_id": document_id} if document_id else {}
    return client.post("/v1/documents", headers=headers, data=data,
                       files={"file": (filename or path.name, path.read_bytes(), "application/pdf")})


def wait_indexed(client: TestClient, headers, document_id: str, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = client.get(f"/v1/documents/{document_id}", headers=headers)
        assert r.status_code == 200, r.text
        if r.json()["status"] in ("ready", "failed"):
            return r.json()
        time.sleep(0.02)
    raise AssertionError(f"{document_id} still {r.json()['status']}")


def ready_document(client, headers, path: Path, document_id: str | None = None) -> str:
    r = upload(client, headers, path, document_id)
    assert r.status_code == 202, r.text
    doc = wait_indexed(client, headers, r.json()["document_id"])
    assert doc["status"] == "ready", doc
    return doc["document_id"]


def validate(client, headers, document_ids, **extra):
    body = {"question": SAMPLE_QUESTION, "answer": SAMPLE_ANSWER, "document_ids": document_ids, **extra}
    return client.post("/v1/validate", headers=headers, json=body)


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def make_app(tmp_path: Path, **overrides):
    # dense off unless a test asks for it (as conftest does for EVIDENTIA_DENSE): no embedding model to load
    settings = Settings(data_dir=tmp_path / "api-data", admin_key=ADMIN, rate_limit_per_minute=100_000,
                        dense=False).with_(**overrides)
    return create_app(settings)



def services_of(client: TestClient):
    return client.app.state.services
