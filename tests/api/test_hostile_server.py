"""Hostile uploads against a real `evidentia serve` with small limits (issue #15):
while they are processed /health answers within 1 s, another tenant's
validations never fail, the server's memory (children included) stays under
a bound, and each file ends `failed` with its reason, nothing of it indexed.
The same flow as bench/bench_hostile.py, on smaller files."""

from __future__ import annotations

import os
import time

import httpx
import psutil
import pytest

from tests.utils import hostile_pdfs as H
from evidentia.samples import write_sample_report
from tests.utils.server import Server
from tests.utils.bench import bench_module

pytestmark = pytest.mark.slow

ADMIN = "admin-secret-for-hostile-tests"
MEMORY_BOUND_MB = 1500  # server (dense off) + one 300 MB extraction child + a 200 MB render child, with margin


def test_hostile_uploads_never_take_the_server_down(tmp_path):
    bench = bench_module("bench_hostile")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVIDENTIA_")}
    env.update(EVIDENTIA_DATA_DIR=str(tmp_path / "data"), EVIDENTIA_ADMIN_KEY=ADMIN, EVIDENTIA_DENSE="off",
               EVIDENTIA_EXTRACT_TIMEOUT_S="10", EVIDENTIA_EXTRACT_MEMORY_MB="300",
               EVIDENTIA_MAX_PAGE_CHARS="20000", EVIDENTIA_RENDER_MEMORY_MB="200", EVIDENTIA_RENDER_TIMEOUT_S="3",
               # content caps lifted: the memory and time limits must hold on their own
               EVIDENTIA_MAX_PAGE_CONTENT_MB="100000", EVIDENTIA_MAX_DOCUMENT_CONTENT_MB="100000")
    files = {
        # memory or time, whichever comes first on a loaded machine (each alone: tests/indexer/test_worker.py)
        "bomb": (H.content_bomb(tmp_path / "bomb.pdf", inflated_mb=128), "(EVIDENTIA_EXTRACT_"),
        # ten pages sharing 512 MB of spaces: about a minute of parsing, no text, no memory
        "spaces": (H.shared_stream(tmp_path / "spaces.pdf", pages=10, inflated_mb=512, chunk=b" " * 4096),
                   "took longer than 10 s"),
        "shared": (H.shared_stream(tmp_path / "shared.pdf", pages=10, inflated_mb=64), "(EVIDENTIA_EXTRACT_"),
        "long": (H.long_page(tmp_path / "long.pdf", chars=40_000), "page 1: more than 20000 characters"),
        "random": (H.random_after_header(tmp_path / "random.pdf"), "corrupted PDF"),
        "html": (H.html_polyglot(tmp_path / "html.pdf"), "not a PDF"),
        "cut": (H.truncated(tmp_path / "cut.pdf"), "truncated"),
    }
    server = Server(env, tmp_path / "server.log")
    try:
        server.wait_ready()
        url = server.url
        keys = {t: httpx.post(url + "/v1/admin/keys", json={"tenant": t}, headers={"X-API-Key": ADMIN}).json()["key"]
                for t in ("victim", "attacker")}
        victim = httpx.Client(timeout=30, headers={"X-API-Key": keys["victim"]})
        sample = write_sample_report(tmp_path / "victim.pdf")
        victim.post(url + "/v1/documents", data={"document_id": "victim"},
                    files={"file": ("victim.pdf", sample.read_bytes(), "application/pdf")})
        assert bench.wait_outcome(victim, url, "victim", 60)["status"] == "ready"
        attacker = httpx.Client(timeout=30, headers={"X-API-Key": keys["attacker"]})
        with bench.Monitor(url, psutil.Process(server.proc.pid), keys["victim"]) as mon:
            for name, (path, _) in files.items():  # all at once: they queue behind each other
                r = attacker.post(url + "/v1/documents", data={"document_id": name},
                                  files={"file": (path.name, path.read_bytes(), "application/pdf")})
                assert r.status_code == 202, r.text
            t0 = time.monotonic()
            outcomes = {name: bench.wait_outcome(attacker, url, name, 60) for name in files}
            elapsed = time.monotonic() - t0
        for name, (_, expected) in files.items():
            d = outcomes[name]
            assert d["status"] == "failed" and expected in d["reason"], (name, d)
            assert str(tmp_path) not in d["reason"], d["reason"]
            page = attacker.get(f"{url}/v1/documents/{name}/pages/1")
            assert page.status_code == 409 and page.json()["error"]["code"] == "document_not_ready"
        assert elapsed < 60
        assert mon.health and max(mon.health) < 1.0, max(mon.health)
        assert mon.health_errors == 0
        assert mon.validate and not mon.validate_errors, mon.validate_errors[:3]
        assert mon.peak_rss < MEMORY_BOUND_MB * 2**20, mon.peak_rss / 2**20
    finally:
        server.stop()
