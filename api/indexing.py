"""Background indexing: worker threads take uploaded documents off a queue,
extract their pages in a bounded child process (indexer/worker.py) and write
them to the search backend in one step.

A document is indexed whole or not at all (``SearchBackend.index_document``);
a file that cannot be read, or that passes a limit (memory, time, characters,
content size), ends ``failed`` with the reason and leaves nothing in the index.
The threads only wait on the child (no GIL held), so the API's event loop
never stalls on a hostile file, and EVIDENTIA_INDEX_WORKERS documents are
extracted at once, served fairly between tenants (TenantFairQueue: with several
tenants, one holds at most all workers but one), so one tenant's slow files never
hold up another's.
With EVIDENTIA_DENSE=on its pages are embedded (the services'
one ``PageEmbedder``) before anything is written, so an embedding failure
also ends ``failed`` and leaves nothing behind. Every status change names the upload's ``generation``, so a
document deleted or uploaded again while it was being indexed is never
overwritten by the stale run, and its child process is killed at once.

Re-uploading a ``ready`` document indexes the new file as the document's next
version while the ready one is still served; the backend swaps the pages in
one step and the store then points at the new file. A failed re-index leaves
the served version alone and reports its reason (``reindex_status``).

On startup, documents a crash left ``queued`` or ``indexing`` are queued again
(indexing is idempotent: it replaces), at most EVIDENTIA_INDEX_MAX_ATTEMPTS
times: a file that brings the whole server down is then failed, not retried
in a crash loop.
"""

from __future__ import annotations

import collections
import itertools
import logging
import shutil
import sqlite3
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from evidentia.api.errors import out_of_space, without_server_details
from evidentia.indexer.ocr import OcrBacklog
from evidentia.indexer.pdf import PdfError
from evidentia.indexer.worker import BoundedCall, ExtractionLimits, WorkFailed, extraction_call
from evidentia.indexing import embed_document, ocr_stats
from evidentia.retriever.base import BackendError
from evidentia.runtime import release_freed_memory
from evidentia.tenants import internal_id

if TYPE_CHECKING:
    from evidentia.api.services import Services

log = logging.getLogger("evidentia.api.indexing")

BACKEND_ATTEMPTS = 3


class TenantFairQueue:
    """The uploads waiting for an indexing worker, served so that no tenant waits on
    another's: the next upload is the oldest of the tenant with the fewest in hand and,
    among those, the one served least recently (round robin), and where there are other
    tenants (``shared()``) a tenant holds at most ``workers - 1`` workers, so another
    tenant's upload finds one free, or the next to free up when more tenants are busy
    than there are workers. Why: with one queue, two slow uploads of one tenant (a
    350,000-stroke page, a 2,000-page scan) held both workers, and another tenant's
    three-page report waited 167 s (up to the extraction limit, 300 s); served by the
    age of their oldest upload, two tenants' backlogs took every freed worker in turn,
    and a third's report waited for one of them to run out (72 s for three uploads of
    23 s each, an hour for ten of 300 s). A server of one tenant keeps every worker.
    ``None`` (stop) is served before any upload."""

    def __init__(self, workers: int, shared: "Callable[[], bool]" = lambda: True) -> None:
        self._workers = workers
        self._shared = shared
        self._waiting: dict[str, collections.deque] = {}
        self._in_hand: collections.Counter = collections.Counter()
        self._stops = 0
        self._ticket = itertools.count()  # arrival order across tenants
        self._started: dict[str, int] = {}  # a tenant's last upload taken, by the same count
        self._ready = threading.Condition()

    def put(self, item: "tuple[str, str, str] | None") -> None:
        with self._ready:
            if item is None:
                self._stops += 1
            else:
                self._waiting.setdefault(item[0], collections.deque()).append((next(self._ticket), item))
            self._ready.notify_all()

    def _next(self) -> "tuple[str, str, str] | None | bool":
        if self._stops:
            self._stops -= 1
            return None
        try:
            shared = self._shared()
        except Exception:  # the store unreadable (shutting down): keep the worker free, the safe side
            shared = True
        per_tenant = max(1, self._workers - 1) if shared else self._workers
        open_tenants = [t for t, q in self._waiting.items() if q and self._in_hand[t] < per_tenant]
        if not open_tenants:
            return False
        tenant = min(open_tenants, key=lambda t: (self._in_hand[t], self._started.get(t, -1),
                                                  self._waiting[t][0][0]))
        _, item = self._waiting[tenant].popleft()
        if not self._waiting[tenant]:
            del self._waiting[tenant]
        self._in_hand[tenant] += 1
        self._started[tenant] = next(self._ticket)
        return item

    def get(self) -> "tuple[str, str, str] | None":
        """The next upload to index (blocks until one may be taken), or None to stop."""
        with self._ready:
            while (item := self._next()) is False:
                self._ready.wait()
            return item

    def task_done(self, item: "tuple[str, str, str] | None") -> None:
        if item is None:
            return
        with self._ready:
            self._in_hand[item[0]] -= 1
            if self._in_hand[item[0]] <= 0:
                del self._in_hand[item[0]]
                if item[0] not in self._waiting:  # nothing left of it: no state kept per tenant ever seen
                    self._started.pop(item[0], None)
            self._ready.notify_all()

    def qsize(self) -> int:
        with self._ready:
            return sum(len(q) for q in self._waiting.values())


class _Abandoned(Exception):
    """Raised between embedding batches: the document was deleted or uploaded again, or
    the server is stopping (it stays 'indexing' and is re-queued at the next start)."""


class IndexingWorker:
    def __init__(self, services: "Services") -> None:
        self.services = services
        # a worker is kept free for the other tenants where the server has any
        self.queue = TenantFairQueue(services.settings.index_workers, lambda: len(services.store.tenants()) > 1)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._running: dict[tuple[str, str, str], BoundedCall] = {}
        self._running_lock = threading.Lock()
        # (tenant, document_id) -> (pages done, pages in the document) while it is being
        # indexed: transient, so kept in memory rather than written to the store
        self._progress: dict[tuple[str, str], tuple[int, int]] = {}
        # while a scan is extracted: pages OCR'd so far, and what OCR has still to look at
        self._ocr_done: dict[tuple[str, str], int] = {}
        self._ocr_backlog: dict[tuple[str, str], OcrBacklog] = {}
        self._progress_lock = threading.Lock()

    def progress(self, tenant: str, document_id: str) -> tuple[int, int] | None:
        """(pages done, pages in all) of a document being indexed, else None."""
        with self._progress_lock:
            return self._progress.get((tenant, document_id))

    def ocr_progress(self, tenant: str, document_id: str) -> tuple[int, OcrBacklog | None]:
        """Pages of a document being indexed that OCR has read so far (0 for digital PDFs),
        and how many it has still to look at (None before its text layers are read)."""
        with self._progress_lock:
            key = (tenant, document_id)
            return self._ocr_done.get(key, 0), self._ocr_backlog.get(key)

    def _count_ocr_page(self, tenant: str, document_id: str) -> None:
        with self._progress_lock:
            key = (tenant, document_id)
            self._ocr_done[key] = self._ocr_done.get(key, 0) + 1

    def _set_ocr_backlog(self, tenant: str, document_id: str, backlog: OcrBacklog) -> None:
        with self._progress_lock:
            self._ocr_backlog[(tenant, document_id)] = backlog

    def _set_progress(self, tenant: str, document_id: str, done: int | None, total: int = 0) -> None:
        with self._progress_lock:
            if done is None:
                self._progress.pop((tenant, document_id), None)
                self._ocr_done.pop((tenant, document_id), None)
                self._ocr_backlog.pop((tenant, document_id), None)
            else:
                self._progress[(tenant, document_id)] = (done, total)

    def start(self) -> None:
        pending = self.services.store.pending_documents()
        for row in pending:
            generation = row.next_generation if row.next_status in ("queued", "indexing") else row.generation
            self.queue.put((row.tenant, row.document_id, generation))
        if pending:
            log.info("re-queued %d document(s) left queued or indexing", len(pending))
        for number in range(self.services.settings.index_workers):
            thread = threading.Thread(target=self._run, name=f"evidentia-indexing-{number}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def submit(self, tenant: str, document_id: str, generation: str) -> None:
        self.queue.put((tenant, document_id, generation))

    def cancel(self, tenant: str, document_id: str, generations: "list[str | None] | None" = None) -> int:
        """Kill the extraction of the document's uploads (all, or those of
        ``generations``); returns how many were running. Queued ones are skipped
        when their turn comes (their generation is stale by then)."""
        with self._running_lock:
            calls = [call for (t, d, g), call in self._running.items()
                     if t == tenant and d == document_id and (generations is None or g in generations)]
        for call in calls:
            call.cancel()
        return len(calls)

    def running_pids(self) -> list[int]:
        with self._running_lock:
            return [c.child_pid for c in self._running.values() if c.child_pid]

    def size(self) -> int:
        return self.queue.qsize()

    def stop(self, timeout: float = 30.0) -> None:
        """Kill the extractions in hand (their documents stay 'indexing' and are
        re-queued at the next start, counting one attempt), then stop."""
        self._stop.set()
        for _ in self._threads:
            self.queue.put(None)
        with self._running_lock:
            calls = list(self._running.values())
        for call in calls:
            call.cancel()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self) -> None:
        services = self.services
        while not self._stop.is_set() and not services.backend_ready.wait(0.2):
            pass
        while not self._stop.is_set():
            item = self.queue.get()
            try:
                if item is None:
                    break
                self._index(*item)
            except Exception:  # one bad document must not stop the worker
                log.exception("indexing %s failed unexpectedly", item)
            finally:
                self.queue.task_done(item)

    def _fail(self, tenant: str, document_id: str, generation: str, reason: str) -> None:
        services = self.services
        # a warning: `--log-level warning` hid a document's failure
        log.warning("document %s:%s failed: %s", tenant, document_id, reason)
        # the reason is the document's, shown to its tenant: a search engine's error names the
        # index's folder or the cluster's URL
        reason = without_server_details(reason)
        with services.doc_lock(tenant, document_id):
            row = services.store.get_document(tenant, document_id)
            if row is None:
                return
            which = row.version(generation)
            if which == "next":
                # the served version stays as it is, in the store and in the index
                services.store.fail_next(tenant, document_id, generation, reason)
                if row.next_file_path:
                    shutil.rmtree(Path(row.next_file_path).parent, ignore_errors=True)
            elif which == "current":
                # an earlier upload of the same id may still be in the index: a failed
                # document has no pages there
                try:
                    services.backend.delete_document(internal_id(tenant, document_id))
                except BackendError as exc:
                    log.warning("cannot remove %s:%s from the index: %s", tenant, document_id, exc)
                services.store.set_status(tenant, document_id, generation, "failed", reason=reason)
            else:
                return
        services.metrics.indexed.labels("failed").inc()

    def _extract(self, tenant: str, document_id: str, generation: str, file_path: str):
        """The document, or None after recording why it failed (or when cancelled)."""
        services = self.services
        settings = services.settings
        # the whole extraction (OCR of pages without text included) runs in the child;
        # each page it OCRs is reported back for the progress counter
        call = extraction_call(Path(file_path), internal_id(tenant, document_id), settings.language_probe_chars,
                               ExtractionLimits.from_settings(settings),
                               {"ocr": services.engine.ocr.shared_by(settings.index_workers)},
                               on_ocr_page=lambda _page: self._count_ocr_page(tenant, document_id),
                               on_ocr_backlog=lambda backlog: self._set_ocr_backlog(tenant, document_id, backlog))
        key = (tenant, document_id, generation)
        with self._running_lock:
            self._running[key] = call
        try:
            return call.run()
        except PdfError as exc:
            self._fail(tenant, document_id, generation, str(exc))
        except WorkFailed as exc:
            if exc.kind != "cancelled":
                self._fail(tenant, document_id, generation, f"{Path(file_path).name}: {exc}")
        except Exception:  # the child's plumbing itself (cannot start a process: out of pids, fds)
            log.exception("extracting %s:%s", tenant, document_id)
            self._fail(tenant, document_id, generation, f"{Path(file_path).name}: the extraction could not run "
                       f"on the server; upload the file again later")
        finally:
            with self._running_lock:
                if self._running.get(key) is call:
                    del self._running[key]
        return None

    def _index(self, tenant: str, document_id: str, generation: str) -> None:
        try:
            self._index_document(tenant, document_id, generation)
        except Exception as exc:
            log.exception("indexing %s:%s failed unexpectedly", tenant, document_id)
            if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                return  # the store was busy: the document stays 'indexing' and the next start re-queues it
            # a disk full while the vectors were written left the document 'indexing' for
            # good, even once space was freed: it fails, with the reason, and can be uploaded again.
            # The exception's text stays in the log: it may name the server's files
            reason = ("the server ran out of disk space" if out_of_space(exc)
                      else f"the server could not index the file ({type(exc).__name__})")
            try:
                self._fail(tenant, document_id, generation, f"{reason}; upload it again")
            except Exception:  # the store cannot be written either: the next start re-queues it
                log.exception("cannot record the failure of %s:%s", tenant, document_id)
        finally:
            self._set_progress(tenant, document_id, None)
            # the document's text, tokens and vectors, freed now, would stay in this thread's arena
            release_freed_memory()

    def _index_document(self, tenant: str, document_id: str, generation: str) -> None:
        services = self.services
        store = services.store
        row = store.get_document(tenant, document_id)
        if row is None or row.version(generation) is None:
            return  # deleted or uploaded again since it was queued
        which = row.version(generation)
        file_path = row.file_path if which == "current" else row.next_file_path
        attempt = store.begin_indexing(tenant, document_id, generation)
        if attempt is None or not file_path:
            return
        limit = services.settings.index_max_attempts
        if attempt > limit:
            self._fail(tenant, document_id, generation,
                       f"{Path(file_path).name}: indexing was interrupted {attempt - 1} times (the server stopped "
                       f"while it ran; EVIDENTIA_INDEX_MAX_ATTEMPTS={limit}); upload the file again")
            return
        t0 = time.perf_counter()
        document = self._extract(tenant, document_id, generation, file_path)
        if document is None:
            return
        self._set_progress(tenant, document_id, 0, document.page_count)
        if services.settings.dense:
            done = 0

            def on_embedded(pages: int) -> None:
                nonlocal done
                done += pages
                self._set_progress(tenant, document_id, done, document.page_count)
                # a delete, a re-upload or a shutdown stopped only the extraction: a 252-page
                # document went on being embedded for 12 s (a 947-page one for 57 s), holding
                # the worker the tenant's next upload waited for
                if self._stop.is_set():
                    raise _Abandoned
                current = store.get_document(tenant, document_id)
                if current is None or current.version(generation) != which:
                    raise _Abandoned

            try:
                document = embed_document(document, services.load_embedder(), on_embedded)
            except _Abandoned:
                log.info("indexing %s:%s abandoned while embedding (deleted, uploaded again or stopping)",
                         tenant, document_id)
                return
            except Exception as exc:  # EmbeddingError (model cannot load), tokenizer or torch errors
                log.exception("embedding %s:%s", tenant, document_id)
                self._fail(tenant, document_id, generation,
                           f"{Path(file_path).name}: cannot compute the page embeddings (EVIDENTIA_DENSE=on, "
                           f"EVIDENTIA_DENSE_MODEL): {without_server_details(str(exc))}")
                return
        reason = ""
        for attempt in range(BACKEND_ATTEMPTS):
            replaced, written = None, False
            with services.doc_lock(tenant, document_id):
                current = store.get_document(tenant, document_id)
                if current is None or current.version(generation) != which:
                    return
                try:
                    services.backend.index_document(document)
                except BackendError as exc:
                    reason = str(exc)
                else:
                    written = True
                    if which == "current":
                        store.set_status(tenant, document_id, generation, "ready", pages=document.page_count,
                                         empty_pages=document.empty_pages, languages=document.languages,
                                         ocr=ocr_stats(document))
                    else:
                        replaced = store.promote_next(tenant, document_id, generation, document.page_count,
                                                      document.empty_pages, document.languages,
                                                      ocr_stats(document))
                    services.metrics.indexed.labels("ready").inc()
                    services.metrics.indexed_pages.inc(document.page_count)
                    services.metrics.indexing_seconds.observe(time.perf_counter() - t0)
            if written:
                log.info("document %s:%s indexed: %d pages in %.1f s", tenant, document_id, document.page_count,
                         time.perf_counter() - t0)
                if replaced is not None:  # the previous version is no longer served
                    shutil.rmtree(Path(replaced.file_path).parent, ignore_errors=True)
                    services.renderer.forget(tenant, replaced.generation)
                return
            log.warning("indexing %s:%s, attempt %d: %s", tenant, document_id, attempt + 1, reason)
            if self._stop.wait(2.0 ** attempt):
                return  # shutting down: stays 'indexing', re-queued at the next start
        self._fail(tenant, document_id, generation, f"search engine error: {reason}; upload the file again")
