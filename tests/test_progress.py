"""Progress where a person looks: a bar on a terminal, plain lines in a pipe, and
page counts in the API's document status."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from evidentia.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_pipe_gets_plain_lines_and_a_last_one():
    out = io.StringIO()
    with Progress(3, "indexing", "documents", every_s=0, stream=out) as bar:
        bar.update()
        bar.note("120 pages")
        bar.update(2)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("indexing: 1/3 documents (")
    assert lines[-1].startswith("indexing: 3/3 documents, 120 pages (")
    assert "\r" not in out.getvalue()


def test_a_pipe_is_not_flooded():
    out = io.StringIO()
    with Progress(1000, "scoring", "pages", every_s=3600, stream=out) as bar:
        for _ in range(1000):
            bar.update()
    assert out.getvalue().splitlines() == [out.getvalue().splitlines()[-1]]  # the final line only
    assert "1000/1000 pages" in out.getvalue()


def test_a_terminal_gets_a_live_bar():
    out = Terminal()
    with Progress(2, "indexing", "documents", stream=out) as bar:
        bar.update(2)
    assert "\r" in out.getvalue() and "2/2" in out.getvalue()


def test_hidden_progress_prints_nothing():
    out = io.StringIO()
    with Progress(2, "x", stream=out, show=False, every_s=0) as bar:
        bar.update(2)
    assert out.getvalue() == ""


def test_cli_index_in_a_pipe_prints_progress_lines(multilingual_pdf, tmp_path):
    exe = Path(sys.executable).with_name("evidentia")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVIDENTIA_")}
    env.update(EVIDENTIA_DATA_DIR=str(tmp_path / "data"), EVIDENTIA_DENSE="off", EVIDENTIA_PROGRESS_INTERVAL_S="0.01")
    proc = subprocess.run([str(exe), "index", str(multilingual_pdf.path)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "indexing: 1/1 documents, 9 pages written (" in proc.stderr
    # no third-party noise in normal output
    assert "Warning" not in proc.stderr and "Loading weights" not in proc.stderr
    # a path that does not exist: its error, and no "indexing: 0/0 documents" line before it
    missing = subprocess.run([str(exe), "index", str(tmp_path / "nope.pdf")], capture_output=True, text=True,
                             env=env, timeout=120)
    assert missing.returncode == 1
    assert missing.stderr == f"error: {tmp_path / 'nope.pdf'}: no such file or folder\n", missing.stderr


def test_api_document_status_counts_pages_while_indexing(tmp_path):
    from fastapi.testclient import TestClient

    from tests.utils.api import make_app, new_tenant, wait_ready

    with TestClient(make_app(tmp_path)) as client:
        wait_ready(client)
        headers = new_tenant(client, "prog")
        services = client.app.state.services
        path = tmp_path / "r.pdf"
        path.write_bytes(b"%PDF-1.4")
        services.store.put_document("prog", "big", "big.pdf", 8, str(path), "g1")
        services.store.set_status("prog", "big", "g1", "indexing")
        services.worker._set_progress("prog", "big", 120, 300)
        body = client.get("/v1/documents/big", headers=headers).json()
        assert body["status"] == "indexing"
        assert body["progress"] == {"pages_done": 120, "pages_total": 300, "ocr_pages": 0, "ocr_pages_left": None}
        services.worker._set_progress("prog", "big", None)
        assert client.get("/v1/documents/big", headers=headers).json()["progress"] is None


def test_the_indexing_worker_reports_its_pages(tmp_path, monkeypatch):
    from fastapi.testclient import TestClient

    from evidentia.samples import write_sample_report
    from tests.utils.api import make_app, new_tenant, upload, wait_indexed, wait_ready

    with TestClient(make_app(tmp_path)) as client:
        wait_ready(client)
        headers = new_tenant(client)
        worker = client.app.state.services.worker
        seen = []
        real = worker._set_progress
        monkeypatch.setattr(worker, "_set_progress", lambda *a, **k: (seen.append(a[2:]), real(*a, **k)))
        upload(client, headers, write_sample_report(tmp_path / "acme.pdf"))
        assert wait_indexed(client, headers, "acme")["status"] == "ready"
    assert seen[0] == (0, 6) and seen[-1] == (None,)  # counted once its pages are known, cleared when done
