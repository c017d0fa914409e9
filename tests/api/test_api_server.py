"""A real `evidentia serve` process on a free loopback port: upload, validate,
feedback; then kill -9 right after the 201 and restart on the same data dir:
the acknowledged feedback must still be there."""

from __future__ import annotations

import json
import os
import subprocess
import time

import httpx
import pytest

from evidentia.samples import SAMPLE_ANSWER, SAMPLE_QUESTION, write_sample_report
from tests.utils.server import Server, evidentia_exe, free_port  # noqa: F401

pytestmark = pytest.mark.slow  # a real server process, killed and restarted


@pytest.fixture
def server_env(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVIDENTIA_")}
    env.update(EVIDENTIA_DATA_DIR=str(tmp_path / "data"), EVIDENTIA_BACKEND="embedded")
    return env


def test_feedback_survives_kill_9(tmp_path, server_env):
    key = subprocess.run([evidentia_exe(), "keys", "create", "--tenant", "acme"], env=server_env, check=True,
                         capture_output=True, text=True).stdout.strip()
    assert key.startswith("evk_")
    headers = {"X-API-Key": key}
    pdf = write_sample_report(tmp_path / "acme-2023.pdf")
    servers: list[Server] = []
    try:
        first = Server(server_env, tmp_path / "server.log")
        servers.append(first)
        first.wait_ready()
        with httpx.Client(base_url=first.url, headers=headers, timeout=30) as c:
            r = c.post("/v1/documents", files={"file": (pdf.name, pdf.read_bytes(), "application/pdf")})
            assert r.status_code == 202, r.text
            deadline = time.monotonic() + 30
            while (doc := c.get("/v1/documents/acme-2023").json())["status"] not in ("ready", "failed"):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert doc["status"] == "ready", doc
            r = c.post("/v1/validate", json={"question": SAMPLE_QUESTION, "answer": SAMPLE_ANSWER,
                                             "document_ids": ["acme-2023"], "top_k": 5, "reranker": "none"})
            assert r.status_code == 200, r.text
            validation = r.json()
            top = validation["pages"][0]
            assert top["page"] == 2
            r = c.post("/v1/feedback", json={"validation_id": validation["validation_id"], "document_id": "acme-2023",
                                             "page": top["page"], "relevant": True, "analyst": "ann"})
            assert r.status_code == 201, r.text
        first.kill9()  # right after the 201: no graceful shutdown, no chance to flush anything

        second = Server(server_env, tmp_path / "server.log")
        servers.append(second)
        second.wait_ready()
        with httpx.Client(base_url=second.url, headers=headers, timeout=30) as c:
            lines = [json.loads(line) for line in c.get("/v1/feedback/export").text.splitlines()]
            assert lines == [{"question": SAMPLE_QUESTION, "answer": SAMPLE_ANSWER,
                              "page_text": lines[0]["page_text"], "relevance": 1, "doc_id": "acme-2023",
                              "page": 2, "source": "feedback"}]
            assert "12,450" in lines[0]["page_text"]
            assert c.get("/v1/documents/acme-2023").json()["status"] == "ready"
            again = c.post("/v1/validate", json={"question": SAMPLE_QUESTION, "answer": SAMPLE_ANSWER,
                                                 "document_ids": ["acme-2023"]})
            assert again.status_code == 200 and again.json()["pages"][0]["page"] == 2
    finally:
        for s in servers:
            s.stop()


def test_a_port_in_use_is_said_before_anything_loads(tmp_path, server_env):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        proc = subprocess.run([evidentia_exe(), "serve", "--port", str(port)], env=server_env, capture_output=True,
                              text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr == (f"error: --port {port}: 127.0.0.1:{port} is already in use (another server?); "
                           "choose another --port\n"), proc.stderr
    assert time.monotonic() - started < 20  # no model, no index was loaded first
    bad = subprocess.run([evidentia_exe(), "serve", "--port", "70000"], env=server_env, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and bad.stderr == "error: --port 70000: use a TCP port from 1 to 65535\n"


def test_ocr_languages_tesseract_does_not_know_stop_the_server_before_it_starts(server_env):
    """EVIDENTIA_OCR_LANGUAGES=xyz was dropped without a word, and every scan uploaded read
    in English: the server refuses to start, in one line, as for any bad setting."""
    env = {**server_env, "EVIDENTIA_OCR": "on", "EVIDENTIA_OCR_LANGUAGES": "eng+xyz"}
    proc = subprocess.run([evidentia_exe(), "serve", "--port", str(free_port())], env=env, capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: EVIDENTIA_OCR_LANGUAGES must be Tesseract language names joined by +, "
                                  "not 'eng+xyz': xyz is not a Tesseract language"), proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
