"""indexer/worker.py: bounded extraction of hostile PDFs in a child process.
Every hostile file is generated (tests/utils/hostile_pdfs.py) and the limits are
kept small so that each case takes about a second."""

from __future__ import annotations

import threading
import time
import zlib
from pathlib import Path

import pytest

from tests.utils import hostile_pdfs as H
from tests.utils.processes import running
from evidentia.indexer.pdf import PdfError
from evidentia.indexer.worker import (
    BoundedCall,
    ExtractionLimits,
    WorkFailed,
    extract_bounded,
    extraction_call,
    inflated_size,
)

SMALL = ExtractionLimits(timeout_s=20, memory_mb=300, max_page_chars=20_000, max_document_chars=200_000,
                         max_page_content_mb=4, max_document_content_mb=40, max_pages=100)


def reason_of(path: Path, limits: ExtractionLimits = SMALL) -> str:
    with pytest.raises(PdfError) as info:
        extract_bounded(path, path.stem, 400, limits)
    reason = str(info.value)
    # one line, no server path, no PyMuPDF text
    assert "\n" not in reason and str(path.parent) not in reason and "/" not in reason.split(":")[0]
    assert "code=" not in reason and "Failed to open" not in reason and "Traceback" not in reason
    return reason


def test_a_real_report_is_extracted_whole(tmp_path):
    document = extract_bounded(H.real_report(tmp_path / "real.pdf", pages=5), "real", 400, SMALL)
    assert document.page_count == 5 and all("Revenue line" in p.text for p in document.pages)


def test_inflated_size_stops_counting_past_the_cap():
    raw = zlib.compress(b" " * (50 << 20), 9)
    t0 = time.perf_counter()
    assert inflated_size(raw, 1 << 20) <= 3 << 20  # gave up after a few chunks
    assert inflated_size(raw, 100 << 20) == 50 << 20
    assert time.perf_counter() - t0 < 5
    assert inflated_size(b"not deflate", 10) == 0


def test_a_content_bomb_is_refused_before_extraction(tmp_path):
    t0 = time.perf_counter()
    reason = reason_of(H.content_bomb(tmp_path / "bomb.pdf", inflated_mb=64))
    assert reason == "bomb.pdf: page 1: its content inflates to more than 4 MB (EVIDENTIA_MAX_PAGE_CONTENT_MB)"
    assert time.perf_counter() - t0 < 5


def test_a_stream_shared_by_many_pages_counts_once_per_page(tmp_path):
    reason = reason_of(H.shared_stream(tmp_path / "shared.pdf", pages=60, inflated_mb=1))
    assert "pages 1-" in reason and "more than 40 MB (EVIDENTIA_MAX_DOCUMENT_CONTENT_MB)" in reason


def test_page_and_document_character_caps(tmp_path):
    long = H.long_page(tmp_path / "long.pdf", chars=60_000)
    assert reason_of(long) == "long.pdf: page 1: more than 20000 characters (EVIDENTIA_MAX_PAGE_CHARS)"
    report = H.real_report(tmp_path / "report.pdf", pages=6)  # about 2,200 characters a page
    capped = ExtractionLimits(**{**SMALL.__dict__, "max_document_chars": 5_000})
    assert "more than 5000 characters of text (EVIDENTIA_MAX_DOCUMENT_CHARS), reached at page 3" in reason_of(
        report, capped)


def test_memory_limit_ends_the_extraction_with_a_reason(tmp_path):
    bomb = H.content_bomb(tmp_path / "bomb.pdf", inflated_mb=128)
    no_caps = ExtractionLimits(timeout_s=60, memory_mb=150, max_page_content_mb=10_000,
                               max_document_content_mb=10_000)
    reason = reason_of(bomb, no_caps)
    assert reason == "bomb.pdf: extraction needs more than 150 MB of memory (EVIDENTIA_EXTRACT_MEMORY_MB)"


def test_timeout_kills_the_extraction(tmp_path):
    spaces = H.spaces_bomb(tmp_path / "spaces.pdf", inflated_mb=512)
    no_caps = ExtractionLimits(timeout_s=1.0, memory_mb=1024, max_page_content_mb=10_000,
                               max_document_content_mb=10_000)
    t0 = time.perf_counter()
    reason = reason_of(spaces, no_caps)
    assert reason == "spaces.pdf: extraction took longer than 1 s (EVIDENTIA_EXTRACT_TIMEOUT_S)"
    assert time.perf_counter() - t0 < 6


def test_cancel_kills_the_child_at_once(tmp_path):
    spaces = H.spaces_bomb(tmp_path / "spaces.pdf", inflated_mb=512)
    no_caps = ExtractionLimits(timeout_s=60, memory_mb=1024, max_page_content_mb=10_000,
                               max_document_content_mb=10_000)
    call = extraction_call(spaces, "spaces", 400, no_caps)
    outcome: list[BaseException] = []
    thread = threading.Thread(target=lambda: outcome.append(pytest.raises(WorkFailed, call.run).value))
    thread.start()
    deadline = time.monotonic() + 10
    while call.child_pid is None and time.monotonic() < deadline:
        time.sleep(0.01)
    pid = call.child_pid
    time.sleep(0.3)
    t0 = time.perf_counter()
    call.cancel()
    thread.join(10)
    assert time.perf_counter() - t0 < 3
    assert outcome and outcome[0].kind == "cancelled"
    assert not running(pid)


@pytest.mark.parametrize("name, expected", [
    ("random_after_header", "corrupted PDF (its structure cannot be read"),
    ("header_only", "corrupted PDF (its structure cannot be read"),
    ("html_polyglot", "not a PDF (an HTML document"),
    ("truncated", "the file is truncated (its end is missing)"),
])
def test_broken_files_fail_with_a_reason_for_a_person(tmp_path, name, expected):
    path = H.HOSTILE[name](tmp_path / f"{name}.pdf")
    reason = reason_of(path)
    assert reason.startswith(f"{name}.pdf: ") and expected in reason, reason


def test_page_limit_is_checked_in_the_child(tmp_path):
    report = H.real_report(tmp_path / "report.pdf", pages=6)
    few = ExtractionLimits(**{**SMALL.__dict__, "max_pages": 5})
    assert reason_of(report, few) == "report.pdf: 6 pages, over the limit of 5 (EVIDENTIA_MAX_PAGES)"


def _boom() -> None:
    raise RuntimeError("code=2: something internal at /srv/secret/path")


def test_unexpected_errors_in_the_child_never_leak_their_text():
    with pytest.raises(WorkFailed) as info:
        BoundedCall(_boom, (), timeout_s=10, memory_mb=100, what="extraction", setting="EVIDENTIA_EXTRACT").run()
    assert info.value.kind == "invalid" and "/srv" not in str(info.value) and "code=" not in str(info.value)


def _returns_at_once() -> int:
    return 1


def test_cancel_after_the_run_ended_does_nothing():
    """The API's shutdown cancels every call still listed as running; one whose run had
    just ended (its process closed) raised "process object is closed" from the shutdown."""
    call = BoundedCall(_returns_at_once, (), timeout_s=10, memory_mb=100, what="extraction",
                       setting="EVIDENTIA_EXTRACT")
    assert call.run() == 1
    call.cancel()  # raised ValueError
    assert call.cancelled


def _reports_slowly(pages: int, pause: float, report=None) -> int:
    for page in range(pages):
        time.sleep(pause)
        report(page + 1)
    return pages


def _stalls(report=None) -> None:
    report(1)
    time.sleep(30)


def test_progress_extends_the_time_limit_up_to_a_bound():
    """A job that reports (OCR'd pages) may run past the time limit while it keeps
    reporting; one that stops reporting is killed one limit after its last report."""
    seen: list[int] = []
    call = BoundedCall(_reports_slowly, (6, 0.4), timeout_s=1.0, memory_mb=100, what="extraction",
                       setting="EVIDENTIA_EXTRACT", on_progress=seen.append)
    assert call.run() == 6 and seen == [1, 2, 3, 4, 5, 6]  # 2.4 s with a 1 s limit
    t0 = time.perf_counter()
    with pytest.raises(WorkFailed) as info:
        BoundedCall(_stalls, (), timeout_s=1.0, memory_mb=100, what="extraction", setting="EVIDENTIA_EXTRACT",
                    on_progress=lambda _: None).run()
    assert info.value.kind == "timeout" and time.perf_counter() - t0 < 6


def _starts_a_helper(pid_file: str, report=None) -> None:
    """A job that starts a process of its own (as OCR starts Tesseract) and waits."""
    import subprocess

    helper = subprocess.Popen(["sleep", "120"])
    Path(pid_file).write_text(str(helper.pid))
    report(helper.pid)
    time.sleep(120)


@pytest.mark.parametrize("ending", ["cancel", "timeout"])
def test_ending_a_job_ends_what_it_started(tmp_path, ending):
    """A scan cancelled (deleted, uploaded again) or timed out left its Tesseract
    processes running for minutes, re-parented to init, outside every limit."""
    pid_file = tmp_path / "helper.pid"
    started = threading.Event()
    call = BoundedCall(_starts_a_helper, (str(pid_file),), timeout_s=30 if ending == "cancel" else 1.5,
                       memory_mb=200, what="extraction", setting="EVIDENTIA_EXTRACT",
                       on_progress=lambda _pid: started.set())
    outcome: list = []
    runner = threading.Thread(target=lambda: outcome.append(pytest.raises(WorkFailed, call.run).value))
    runner.start()
    assert started.wait(20)
    helper = int(pid_file.read_text())
    assert running(helper)
    if ending == "cancel":
        call.cancel()
    runner.join(30)
    assert outcome and outcome[0].kind == ("cancelled" if ending == "cancel" else "timeout")
    deadline = time.monotonic() + 5
    while running(helper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(helper)
