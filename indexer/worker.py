"""Bounded work on untrusted PDFs: every call runs in a fresh child process with a
memory limit and a wall-clock limit, and can be cancelled (killed) from another thread.

Why a process and not a thread: PyMuPDF holds the GIL while it parses, so a
hostile file parsed in the API process stalls the event loop and every tenant
(issue #15: a 1 MB upload whose stream inflates to 1 GB stalled /health for 7 s;
one page inflating to 256 MB of text drove the server past 8 GB). In a child
the parse can use at most ``memory_mb`` more memory than the child started
with (``RLIMIT_AS``: allocations past it fail, MuPDF reports them, and we say
"needs more than N MB of memory"), is killed after ``timeout_s``, and is killed
at once when the document is deleted or uploaded again.

One job per process: a child never carries a previous file's heap or state,
and a kill loses nothing but that job. Children are forked from a
``forkserver`` that has PyMuPDF and the extraction code imported, so a job
starts in tens of milliseconds, and never from the multi-threaded API process
itself (forking a process with threads is unsafe).

``extract_bounded`` runs the whole extraction (``indexer.pdf.extract_pages``,
OCR included when it is there) in such a child, after a cheap check of how big
each page's content streams inflate to, counted with a streaming zlib
decompressor that stops at the limit: the 256 MB bomb is refused after reading
a few MB, before MuPDF builds anything. The extracted text is then checked
against the per-page and per-document character caps before it leaves the child.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import resource
import signal
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from evidentia.config import declared_default

# Modules the forkserver imports once, so that each forked job starts warm.
PRELOAD = ["evidentia.indexer.worker", "evidentia.indexer.pdf", "pymupdf"]
# Background extraction yields the CPU to the API's own threads (validations on a
# 2-core machine waited up to 2 s behind two CPU-bound extractions).
EXTRACTION_NICE = 10
PROGRESS_TIMEOUT_FACTOR = 12
MEMORY_WORDS = ("malloc", "calloc", "realloc", "out of memory", "cannot allocate", "memory")


class WorkFailed(Exception):
    """The bounded call did not produce a result; ``str(exc)`` is one line for a
    person (no server path, no library internals). ``kind`` says why: ``timeout``,
    ``memory``, ``limit`` (a content or size cap), ``invalid`` (the file is not a
    usable PDF), ``crashed`` or ``cancelled``."""

    def __init__(self, reason: str, kind: str) -> None:
        super().__init__(reason)
        self.kind = kind


@dataclass(frozen=True)
class ExtractionLimits:
    """Bounds of one document's extraction (EVIDENTIA_EXTRACT_* / EVIDENTIA_MAX_*);
    the defaults are the settings' declared ones."""

    timeout_s: float = declared_default("extract_timeout_s")
    memory_mb: int = declared_default("extract_memory_mb")
    max_page_chars: int = declared_default("max_page_chars")
    max_document_chars: int = declared_default("max_document_chars")
    max_page_content_mb: int = declared_default("max_page_content_mb")
    max_document_content_mb: int = declared_default("max_document_content_mb")
    max_pages: int = declared_default("max_pages")

    @classmethod
    def from_settings(cls, settings) -> "ExtractionLimits":
        return cls(timeout_s=settings.extract_timeout_s, memory_mb=settings.extract_memory_mb,
                   max_page_chars=settings.max_page_chars, max_document_chars=settings.max_document_chars,
                   max_page_content_mb=settings.max_page_content_mb,
                   max_document_content_mb=settings.max_document_content_mb, max_pages=settings.max_pages)


def _context():
    """A forkserver context where the platform has one (Linux), else spawn."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        return ctx
    return multiprocessing.get_context("spawn")


class BoundedCall:
    """``fn(*args)`` in a child process under ``memory_mb`` (extra address space
    past what the child starts with) and ``timeout_s``. ``run()`` blocks the
    calling thread (never holding the GIL while it waits) and returns the value
    or raises ``WorkFailed``; ``cancel()`` kills the child from any thread.
    ``fn`` must be a module-level function; exceptions it raises whose class is
    in ``passthrough`` are re-raised as they are (e.g. ``PdfError``), others
    become ``WorkFailed``. ``what`` names the work in reasons ("extraction")
    and ``setting`` is the prefix of the settings named in them."""

    def __init__(self, fn: Callable[..., Any], args: tuple, *, timeout_s: float, memory_mb: int, what: str,
                 setting: str, passthrough: tuple[type[BaseException], ...] = (), nice: int = 0,
                 on_progress: Callable[[Any], None] | None = None) -> None:
        self.fn = fn
        self.args = args
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.what = what
        self.setting = setting
        self.passthrough = passthrough
        self.nice = nice
        self.on_progress = on_progress
        self._lock = threading.Lock()
        self._process = None
        self._cancelled = False
        self.child_pid: int | None = None
        # On a timeout, the CPU time the child had used (None where unknown): a child cut
        # at the limit with little CPU waited for the machine (a loaded server), one that
        # had its share of it did the work and did not finish it.
        self.cpu_s: float | None = None

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            if self._process is not None:
                _kill_group(self._process)

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def run(self) -> Any:
        ctx = _context()
        receiver, sender = ctx.Pipe(duplex=False)
        process = ctx.Process(target=_child_main, args=(self.fn, self.args, self.memory_mb, self.nice, sender,
                                                          self.on_progress is not None),
                              name=f"evidentia-{self.what}", daemon=True)
        with self._lock:
            if self._cancelled:
                raise WorkFailed(f"{self.what} cancelled", "cancelled")
            process.start()
            self._process = process
            self.child_pid = process.pid
        sender.close()
        started = time.monotonic()
        deadline = started + self.timeout_s
        # A job that reports progress (OCR'd pages) may run past timeout_s as long as
        # each report comes within timeout_s of the last, up to PROGRESS_TIMEOUT_FACTOR
        # times timeout_s in all: a long scan is OCR'd, a stuck or endless one is not.
        hard_deadline = started + self.timeout_s * PROGRESS_TIMEOUT_FACTOR
        try:
            message = None
            while message is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.cpu_s = _cpu_seconds(process.pid)  # read before the kill below
                    if deadline > started + self.timeout_s:
                        raise WorkFailed(f"{self.what} took longer than {deadline - started:.0f} s (no progress for "
                                         f"{self.timeout_s:g} s, or past {PROGRESS_TIMEOUT_FACTOR}x "
                                         f"{self.setting}_TIMEOUT_S)", "timeout")
                    raise WorkFailed(f"{self.what} took longer than {self.timeout_s:g} s "
                                     f"({self.setting}_TIMEOUT_S)", "timeout")
                ready = multiprocessing.connection.wait([receiver, process.sentinel], remaining)
                if receiver in ready:
                    try:
                        message = receiver.recv()
                    except (EOFError, OSError):
                        message = ("crashed", None)
                    if message[0] == "progress":  # the child reports as it goes (OCR'd pages)
                        deadline = min(hard_deadline, max(deadline, time.monotonic() + self.timeout_s))
                        if self.on_progress is not None and not self._cancelled:
                            self.on_progress(message[1])
                        message = None
                        continue
                elif process.sentinel in ready:
                    # the child ended without a word: killed (cancel, the OOM killer) or crashed
                    if receiver.poll(0):
                        continue
                    message = ("crashed", None)
            if self._cancelled:
                raise WorkFailed(f"{self.what} cancelled", "cancelled")
            status, value = message
            if status == "ok":
                return value
            if status == "raised" and isinstance(value, self.passthrough):
                if "(out of memory)" in str(value):  # indexer/pdf.py's words for a failed allocation
                    raise self._memory_failure()
                raise value
            if status == "memory" or (status == "raised" and _is_memory_error(str(value))):
                raise self._memory_failure()
            if status == "crashed":
                code = process.exitcode
                raise WorkFailed(f"the {self.what} process stopped unexpectedly"
                                 + (f" (signal {-code})" if code is not None and code < 0 else "")
                                 + "; the PDF is malformed or too complex", "crashed")
            raise WorkFailed(f"the {self.what} failed on this PDF (it is malformed or uses unsupported "
                             f"features)", "invalid")
        finally:
            receiver.close()
            with self._lock:
                # the child and whatever it started (Tesseract) that still runs: a cancelled
                # or timed-out scan's OCR went on for minutes after, re-parented to init
                _kill_group(process)
                # nothing is left to cancel: a cancel after this (the server stopping while the
                # call is still listed as running) met the process closed below, and raised
                self._process = None
            process.join(5.0)
            if hasattr(process, "close") and not process.is_alive():
                process.close()

    def _memory_failure(self) -> WorkFailed:
        return WorkFailed(f"{self.what} needs more than {self.memory_mb} MB of memory ({self.setting}_MEMORY_MB)",
                          "memory")


def _is_memory_error(text: str) -> bool:
    low = text.lower()
    return any(word in low for word in MEMORY_WORDS) and ("fail" in low or "out of" in low or "cannot" in low)


def _child_main(fn, args, memory_mb: int, nice: int, sender, reports: bool = False) -> None:
    """Runs in the child: cap the address space, lower the priority, call, send back
    one message (after ``("progress", item)`` messages when ``fn`` reports: it is then
    called with ``report=``)."""
    try:
        _lead_own_group()
        if nice > 0:
            os.nice(nice)
        current = _virtual_memory_bytes() if memory_mb > 0 else None
        if current is not None:  # None where /proc is missing (macOS does not enforce RLIMIT_AS anyway)
            limit = current + memory_mb * (1 << 20)
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        if reports:
            value = fn(*args, report=lambda item: sender.send(("progress", item)))
        else:
            value = fn(*args)
        message = ("ok", value)
    except MemoryError:
        message = ("memory", None)
    except BaseException as exc:  # anything: the parent decides what a person reads
        message = ("raised", exc)
    try:
        sender.send(message)
    except MemoryError:
        sender.send(("memory", None))
    except Exception:  # an exception that cannot be pickled
        sender.send(("raised", RuntimeError(str(message[1])[:500])))
    finally:
        sender.close()


def _lead_own_group() -> None:
    """In the child: lead a process group of its own, so that the parent ends it with
    everything it started (``_kill_group``), and end that group when asked to stop
    (SIGTERM: the parent exiting terminates its daemon children)."""
    try:
        os.setsid()
    except OSError:  # already a group leader: the group is then this process's own
        pass
    if os.getpgrp() == os.getpid():
        signal.signal(signal.SIGTERM, lambda *_: os.killpg(os.getpgrp(), signal.SIGKILL))


def _kill_group(process) -> None:
    """SIGKILL the child's process group (the child and the processes it started),
    or the child alone where it leads none."""
    pid = process.pid
    if pid is None:
        return
    # A group keeps the id of its leader while any member lives, even after the leader
    # died (the OOM killer): its orphans are found by it. Without a group of that id
    # (the child could not lead one, or all is gone) this fails and harms no one.
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if process.is_alive():
        process.kill()


def _cpu_seconds(pid: int | None) -> float | None:
    """The CPU time (user + system) process ``pid`` has used, from /proc; None where
    it cannot be read (not Linux, or the process is gone)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()  # past the name, which may hold spaces
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    except (OSError, IndexError, ValueError):
        return None


def _virtual_memory_bytes() -> int | None:
    try:
        with open(f"/proc/{os.getpid()}/statm") as fh:
            return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return None


# -- extraction ---------------------------------------------------------------

def inflated_size(raw: bytes, cap: int) -> int:
    """How many bytes ``raw`` (a deflate stream) inflates to, counted chunk by
    chunk and given up as soon as it passes ``cap`` (then some value > cap).
    A broken stream counts what inflated before the damage (MuPDF does the same)."""
    inflater = zlib.decompressobj()
    total = 0
    data = raw
    try:
        while data:
            out = inflater.decompress(data, 1 << 20)
            total += len(out)
            if total > cap:
                return total
            data = inflater.unconsumed_tail
            if inflater.eof or (not out and data):
                break
    except zlib.error:
        pass
    return total


def _stream_size(doc, xref: int, cap: int) -> int:
    kind, value = doc.xref_get_key(xref, "Filter")
    filters = value.replace("[", " ").replace("]", " ").split() if kind != "null" else []
    if not filters:
        return len(doc.xref_stream_raw(xref) or b"")
    if filters == ["/FlateDecode"] or filters == ["/Fl"]:
        return inflated_size(doc.xref_stream_raw(xref) or b"", cap)
    # other or chained filters (rare for content streams): MuPDF decodes it,
    # still under the child's memory limit
    return len(doc.xref_stream(xref) or b"")


def check_content_size(path: Path, limits: ExtractionLimits) -> None:
    """Refuse a document before extraction when a page's content streams (its
    /Contents and the form XObjects it draws) inflate past
    ``max_page_content_mb``, or all pages together past ``max_document_content_mb``.
    A stream shared by many pages counts once per page: each page parses it."""
    from evidentia.indexer.pdf import PdfError, open_pdf

    page_cap = limits.max_page_content_mb << 20
    doc_cap = limits.max_document_content_mb << 20
    doc = open_pdf(path)
    name = Path(path).name
    try:
        if doc.page_count > limits.max_pages:
            raise PdfError(f"{name}: {doc.page_count} pages, over the limit of {limits.max_pages} "
                           f"(EVIDENTIA_MAX_PAGES)")
        sizes: dict[int, int] = {}
        total = 0
        for index in range(doc.page_count):
            try:
                page = doc.load_page(index)
                xrefs = list(page.get_contents()) + [x[0] for x in page.get_xobjects()]
            except Exception:
                continue  # extraction reports the unreadable page with its own reason
            page_size = 0
            for xref in dict.fromkeys(xrefs):
                if xref not in sizes:
                    try:
                        sizes[xref] = _stream_size(doc, xref, page_cap)
                    except Exception:  # a broken stream: MuPDF reads what it can of it
                        sizes[xref] = 0
                page_size += sizes[xref]
                if page_size > page_cap:
                    raise PdfError(f"{name}: page {index + 1}: its content inflates to more than "
                                   f"{limits.max_page_content_mb} MB (EVIDENTIA_MAX_PAGE_CONTENT_MB)")
            total += page_size
            if total > doc_cap:
                raise PdfError(f"{name}: pages 1-{index + 1}: their content inflates to more than "
                               f"{limits.max_document_content_mb} MB (EVIDENTIA_MAX_DOCUMENT_CONTENT_MB)")
    finally:
        doc.close()


class TextCaps:
    """The per-page and per-document character caps, checked page by page as the
    text is read (``extract_pages(check_page=...)``): a 100-million-character page
    stops the extraction at that page instead of reaching the index."""

    def __init__(self, limits: ExtractionLimits, name: str) -> None:
        self.limits = limits
        self.name = name
        self.total = 0

    def __call__(self, page: int, text: str) -> None:
        from evidentia.indexer.pdf import PdfError

        if len(text) > self.limits.max_page_chars:
            raise PdfError(f"{self.name}: page {page}: more than {self.limits.max_page_chars} characters "
                           f"(EVIDENTIA_MAX_PAGE_CHARS)")
        self.total += len(text)
        if self.total > self.limits.max_document_chars:
            raise PdfError(f"{self.name}: more than {self.limits.max_document_chars} characters of text "
                           f"(EVIDENTIA_MAX_DOCUMENT_CHARS), reached at page {page}")


def extract_checked(path: Path, doc_id: str, probe_chars: int, limits: ExtractionLimits,
                    extract_kwargs: dict | None = None, report: Callable[[Any], None] | None = None):
    """The child's job: size checks, the whole extraction (OCR included, with the
    ``ocr`` engine of ``extract_kwargs``), the text caps; ``report(page_text)``
    after each page OCR'd, ``report(ocr_backlog)`` as OCR goes through the scan."""
    from evidentia.language import LanguageDetector
    from evidentia.indexer.pdf import extract_pages

    path = Path(path)
    check_content_size(path, limits)
    detector = LanguageDetector(probe_chars=probe_chars)
    kwargs = dict(extract_kwargs or {})
    if report is not None:
        kwargs["on_ocr_page"] = report  # each OCR'd page (its PageText) goes back to the parent
        kwargs["on_ocr_backlog"] = report  # and how many pages OCR has still to look at (an OcrBacklog)
    return extract_pages(path, doc_id, detector, check_page=TextCaps(limits, path.name), **kwargs)


def extraction_call(path: Path, doc_id: str, probe_chars: int, limits: ExtractionLimits,
                    extract_kwargs: dict | None = None, on_ocr_page: Callable[[Any], None] | None = None,
                    on_ocr_backlog: Callable[[Any], None] | None = None) -> BoundedCall:
    """A ``BoundedCall`` extracting ``path``; ``run()`` returns the ``Document`` or
    raises ``PdfError`` (the file's own problem) or ``WorkFailed`` (a limit, a crash,
    a cancel), each with a one-line reason that names the file, never a server path.
    The child's reports come back to ``on_ocr_page`` (each page OCR'd, its PageText) and
    ``on_ocr_backlog`` (an OcrBacklog), as ``extract_pages`` calls them."""
    from evidentia.indexer.ocr import OcrBacklog
    from evidentia.indexer.pdf import PdfError

    def on_progress(item: Any) -> None:  # one channel from the child: each report to its own callback
        callback = on_ocr_backlog if isinstance(item, OcrBacklog) else on_ocr_page
        if callback is not None:
            callback(item)

    reports = on_ocr_page is not None or on_ocr_backlog is not None
    return BoundedCall(extract_checked, (Path(path), doc_id, probe_chars, limits, extract_kwargs),
                       timeout_s=limits.timeout_s, memory_mb=limits.memory_mb, what="extraction",
                       setting="EVIDENTIA_EXTRACT", passthrough=(PdfError,), nice=EXTRACTION_NICE,
                       on_progress=on_progress if reports else None)


def extract_bounded(path: Path, doc_id: str, probe_chars: int, limits: ExtractionLimits,
                    extract_kwargs: dict | None = None, on_ocr_page: Callable[[Any], None] | None = None,
                    on_ocr_backlog: Callable[[Any], None] | None = None):
    """``extraction_call(...).run()``, with ``WorkFailed`` turned into ``PdfError``
    prefixed by the file name, so callers handle one exception type."""
    from evidentia.indexer.pdf import PdfError

    try:
        return extraction_call(path, doc_id, probe_chars, limits, extract_kwargs, on_ocr_page, on_ocr_backlog).run()
    except WorkFailed as exc:
        raise PdfError(f"{Path(path).name}: {exc}") from None
