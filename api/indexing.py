"""Background indexing: one worker thread takes uploaded documents off a queue,
extracts their pages and writes them to the search backend in one step.

A document is indexed whole or not at all (``SearchBackend.index_document``);
a file that cannot be read ends ``failed`` with the reason and leaves nothing
in the index. With EVIDENTIA_DENSE=on its pages are embedded (the services'
one ``PageEmbedder``) before anything is written, so an embedding failure
also ends ``failed`` and leaves nothing behind. Every status change names the upload's ``generation``, so a
document deleted or uploaded again while it was being indexed is never
overwritten by the stale run. On startup, documents a crash left ``queued`` or
``indexing`` are queued again (indexing is idempotent: it replaces).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from evidentia.indexer.pdf import PdfError, extract_pages
from evidentia.indexing import embed_document, unread_reason
from evidentia.retriever.base import BackendError
from evidentia.tenants import internal_id

if TYPE_CHECKING:
    from evidentia.api.services import Services

log = logging.getLogger("evidentia.api.indexing")

BACKEND_ATTEMPTS = 3


class IndexingWorker:
    def __init__(self, services: "Services") -> None:
        self.services = services
        self.queue: "queue.Queue[tuple[str, str, str] | None]" = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # (tenant, document_id) -> (pages done, pages in the document) while it is being
        # indexed: transient, so kept in memory rather than written to the store
        self._progress: dict[tuple[str, str], tuple[int, int]] = {}
        self._ocr_done: dict[tuple[str, str], int] = {}  # pages OCR'd so far while extracting a scan
        self._progress_lock = threading.Lock()

    def progress(self, tenant: str, document_id: str) -> tuple[int, int] | None:
        """(pages done, pages in all) of a document being indexed, else None."""
        with self._progress_lock:
            return self._progress.get((tenant, document_id))

    def ocr_progress(self, tenant: str, document_id: str) -> int:
        """Pages of a document being indexed that OCR has read so far (0 for digital PDFs)."""
        with self._progress_lock:
            return self._ocr_done.get((tenant, document_id), 0)

    def _count_ocr_page(self, tenant: str, document_id: str) -> None:
        with self._progress_lock:
            key = (tenant, document_id)
            self._ocr_done[key] = self._ocr_done.get(key, 0) + 1

    def _set_progress(self, tenant: str, document_id: str, done: int | None, total: int = 0) -> None:
        with self._progress_lock:
            if done is None:
                self._progress.pop((tenant, document_id), None)
                self._ocr_done.pop((tenant, document_id), None)
            else:
                self._progress[(tenant, document_id)] = (done, total)

    def start(self) -> None:
        pending = self.services.store.pending_documents()
        for row in pending:
            self.queue.put((row.tenant, row.document_id, row.generation))
        if pending:
            log.info("re-queued %d document(s) left queued or indexing", len(pending))
        self._thread = threading.Thread(target=self._run, name="evidentia-indexing", daemon=True)
        self._thread.start()

    def submit(self, tenant: str, document_id: str, generation: str) -> None:
        self.queue.put((tenant, document_id, generation))

    def size(self) -> int:
        return self.queue.qsize()

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the document in hand (a half-done one stays 'indexing' and is
        re-queued at the next start), then stop."""
        self._stop.set()
        self.queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

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
                self.queue.task_done()

    def _fail(self, tenant: str, document_id: str, generation: str, reason: str) -> None:
        services = self.services
        with services.doc_lock:
            row = services.store.get_document(tenant, document_id)
            if row is None or row.generation != generation:
                return
            # an earlier upload of the same id may still be in the index: a failed
            # document has no pages there
            try:
                services.backend.delete_document(internal_id(tenant, document_id))
            except BackendError as exc:
                log.warning("cannot remove %s:%s from the index: %s", tenant, document_id, exc)
            services.store.set_status(tenant, document_id, generation, "failed", reason=reason)
        services.metrics.indexed.labels("failed").inc()
        log.info("document %s:%s failed: %s", tenant, document_id, reason)

    def _index(self, tenant: str, document_id: str, generation: str) -> None:
        try:
            self._index_document(tenant, document_id, generation)
        finally:
            self._set_progress(tenant, document_id, None)

    def _index_document(self, tenant: str, document_id: str, generation: str) -> None:
        services = self.services
        store = services.store
        row = store.get_document(tenant, document_id)
        if row is None or row.generation != generation:
            return  # deleted or uploaded again since it was queued
        if not store.set_status(tenant, document_id, generation, "indexing"):
            return
        t0 = time.perf_counter()
        try:
            document = extract_pages(Path(row.file_path), internal_id(tenant, document_id), services.detector,
                                     ocr=services.engine.ocr,
                                     on_ocr_page=lambda _read: self._count_ocr_page(tenant, document_id))
        except PdfError as exc:
            self._fail(tenant, document_id, generation, str(exc))
            return
        except Exception as exc:  # PyMuPDF can raise anything on a hostile file
            log.exception("extracting %s:%s", tenant, document_id)
            self._fail(tenant, document_id, generation, f"{row.filename}: cannot read the PDF ({exc})")
            return
        limit = services.settings.max_pages
        if document.page_count > limit:
            self._fail(tenant, document_id, generation,
                       f"{row.filename}: {document.page_count} pages, over the limit of {limit} (EVIDENTIA_MAX_PAGES)")
            return
        self._set_progress(tenant, document_id, 0, document.page_count)
        if services.settings.dense:
            done = 0

            def on_embedded(pages: int) -> None:
                nonlocal done
                done += pages
                self._set_progress(tenant, document_id, done, document.page_count)

            try:
                document = embed_document(document, services.load_embedder(), on_embedded)
            except Exception as exc:  # EmbeddingError (model cannot load), tokenizer or torch errors
                log.exception("embedding %s:%s", tenant, document_id)
                self._fail(tenant, document_id, generation,
                           f"{row.filename}: cannot compute the page embeddings (EVIDENTIA_DENSE=on, "
                           f"EVIDENTIA_DENSE_MODEL={services.settings.dense_model}): {exc}")
                return
        reason = ""
        for attempt in range(BACKEND_ATTEMPTS):
            with services.doc_lock:
                current = store.get_document(tenant, document_id)
                if current is None or current.generation != generation:
                    return
                try:
                    services.backend.index_document(document)
                except BackendError as exc:
                    reason = str(exc)
                else:
                    store.set_status(tenant, document_id, generation, "ready", pages=document.page_count,
                                     empty_pages=document.empty_pages, languages=document.languages,
                                     ocr=ocr_stats(document))
                    services.metrics.indexed.labels("ready").inc()
                    services.metrics.indexed_pages.inc(document.page_count)
                    services.metrics.indexing_seconds.observe(time.perf_counter() - t0)
                    return
            log.warning("indexing %s:%s, attempt %d: %s", tenant, document_id, attempt + 1, reason)
            if self._stop.wait(2.0 ** attempt):
                return  # shutting down: stays 'indexing', re-queued at the next start
        self._fail(tenant, document_id, generation, f"search engine error: {reason}; upload the file again")


def ocr_stats(document) -> dict:
    """What the document row keeps of how its pages were read (see indexer/ocr.py)."""
    stats: dict = {"ocr_pages": document.ocr_pages, "unread_pages": document.unread_pages,
                   "ocr_confidence": document.ocr_confidence, "ocr_seconds": round(document.ocr_seconds, 2)}
    if document.unread_pages:
        stats["unread_reason"] = unread_reason(document.ocr_problem)
    return stats
