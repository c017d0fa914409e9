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


def test_cli_index_of_a_digital_pdf_says_nothing_of_ocr(tmp_path):
    """The sample report has a text layer on every page, most of them short: its progress
    said "0 pages written, 6 to read by OCR", and no page was OCR'd."""
    from evidentia.samples import write_sample_report

    exe = Path(sys.executable).with_name("evidentia")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVIDENTIA_")}
    env.update(EVIDENTIA_DATA_DIR=str(tmp_path / "data"), EVIDENTIA_DENSE="off", EVIDENTIA_OCR="on",
               EVIDENTIA_PROGRESS_INTERVAL_S="0.001")  # a line for each step, as in a pipe
    proc = subprocess.run([str(exe), "index", str(write_sample_report(tmp_path / "acme.pdf"))], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "indexing: 1/1 documents, 6 pages written (" in proc.stderr
    assert "OCR" not in proc.stderr, proc.stderr  # (it showed only where Tesseract is installed)


def test_a_document_that_failed_during_ocr_leaves_no_count_on_the_next_ones(tmp_path, monkeypatch, capsys):
    """A scan that fails while OCR reads it (a cap, a time limit) reported pages to read:
    the next document, a digital one, went on showing them."""
    import evidentia.indexing as indexing
    from evidentia.indexer.ocr import OcrBacklog
    from evidentia.indexer.pdf import PdfError
    from evidentia.language import LanguageDetector
    from evidentia.retriever.tantivy_backend import TantivyBackend
    from evidentia.samples import write_pdf

    real = indexing.extract_pages

    def extract_pages(path, doc_id, detector, on_ocr_backlog=None, **kwargs):
        if path.name == "a-scan.pdf":  # OCR starts on its 3 scanned pages, then the document fails
            on_ocr_backlog(OcrBacklog(3, 3))
            on_ocr_backlog(OcrBacklog(3, 2))
            raise PdfError("a-scan.pdf: page 1: more than 100000 characters")
        return real(path, doc_id, detector, on_ocr_backlog=on_ocr_backlog, **kwargs)

    monkeypatch.setattr(indexing, "extract_pages", extract_pages)
    write_pdf(tmp_path / "a-scan.pdf", ["scanned"] * 3)
    write_pdf(tmp_path / "b-digital.pdf", ["A digital page of the annual report."] * 2)
    with TantivyBackend(tmp_path / "index") as backend:
        summary = indexing.index_paths_with_progress([tmp_path / "a-scan.pdf", tmp_path / "b-digital.pdf"], backend,
                                                     LanguageDetector(), every_s=0)
    assert summary.documents == 1 and len(summary.failures) == 1
    lines = capsys.readouterr().err.splitlines()
    assert any("2 to read by OCR" in line for line in lines), lines  # while the scan was read
    after = lines[next(i for i, line in enumerate(lines) if "1/2 documents" in line):]
    assert after and not any("OCR" in line for line in after), lines
