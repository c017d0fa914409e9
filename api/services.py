"""Everything one app instance holds: settings, store, search backend, reranker
cache, metrics, rate limiter and the indexing worker. Built by ``create_app``
and hung on ``app.state.services``; started and stopped by the app's lifespan.
Nothing lives at module level, so several apps can run in one process."""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path

from evidentia.api.errors import without_server_details
from evidentia.api.indexing import IndexingWorker
from evidentia.api.metrics import Metrics
from evidentia.api.rendering import PageRenderer
from evidentia.api.ratelimit import RateLimiter
from evidentia.api.tenant_slots import TenantSlots
from evidentia.config import ConfigError, Settings
from evidentia.engine import Engine
from evidentia.reranker.cache import RerankerCache
from evidentia.reranker.llm_runtime import LLMRuntime
from evidentia.retriever.base import SearchBackend
from evidentia.retriever.dense import PageEmbedder
from evidentia.runtime import KeyedLocks
from evidentia.store import Store, store_path, uploads_dir
from evidentia.tenants import is_default_tenants, split_internal_id

log = logging.getLogger("evidentia.api")


class Services:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # the engine assembles every search and owns the backend, detector, embedder and rerankers
        self.engine = Engine(settings, dense_queries=settings.dense)
        self.metrics = Metrics()
        # LLM reranks run in their own bounded executor (EVIDENTIA_LLM_CONCURRENCY), never
        # in the thread pool that authentication and storage use (see reranker/llm_runtime.py)
        self.llm = LLMRuntime(settings.llm_concurrency)
        self.rate_limiter = RateLimiter(settings.rate_limit_per_minute)
        # one tenant's burst of searches or uploads waits for its own slots, not for the
        # shared thread pool that every tenant's requests need (api/tenant_slots.py)
        self.search_slots = TenantSlots(settings.tenant_concurrency)
        self.upload_slots = TenantSlots(settings.tenant_concurrency)
        # serialises a document's index writes with its deletes and reads: one lock a (tenant,
        # document), so that one document's long write holds up no other (KeyedLocks)
        self.document_locks = KeyedLocks()
        self.backend_ready = threading.Event()
        self.store: Store | None = None
        self.worker = IndexingWorker(self)
        # page images: bounded child processes, disk cache; slots kept for the other tenants where there are any
        self.renderer = PageRenderer(settings, shared=lambda: len(self.store.tenants()) > 1)
        self.checks: dict[str, str] = {"store": "not open", "index": "not open",
                                       f"reranker:{settings.default_reranker}": "not loaded"}
        # EVIDENTIA_DENSE=on: uploads get page embeddings, and the dense and hybrid
        # stages can be asked for; the model loads during warm-up ("embedder" check)
        if settings.dense:
            self.checks["embedder"] = "not loaded"
        self._stopping = threading.Event()
        self._warmup: threading.Thread | None = None
        self.metrics.track_queue(self.worker.size)

    @property
    def uploads(self) -> Path:
        return uploads_dir(self.settings.data_dir)

    @property
    def backend(self) -> SearchBackend | None:
        """The search backend once warm-up opened it, else None (503 until then)."""
        return self.engine.backend if self.backend_ready.is_set() else None

    @property
    def detector(self):
        return self.engine.detector

    def doc_lock(self, tenant: str, document_id: str):
        """``with services.doc_lock(tenant, document_id):`` the document's index and store
        rows change together, or are read together."""
        return self.document_locks((tenant, document_id))

    @property
    def rerankers(self) -> RerankerCache:
        return self.engine.rerankers

    @property
    def embedder(self) -> PageEmbedder | None:
        """The page/query embedder; None with EVIDENTIA_DENSE=off. Its model may
        still be loading: see ``load_embedder``."""
        return self.engine.indexing_embedder

    def load_embedder(self) -> PageEmbedder | None:
        """The embedder with its model loaded (None with EVIDENTIA_DENSE=off).
        Raises EmbeddingError (a ConfigError) when the model cannot be loaded."""
        return self.engine.load_embedder() if self.settings.dense else None

    @property
    def ready(self) -> bool:
        return all(v == "ok" for v in self.checks.values())

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> None:
        self.store = Store(store_path(self.settings.data_dir))
        self.checks["store"] = "ok"
        self.uploads.mkdir(parents=True, exist_ok=True)
        self._sweep_files()
        self.engine.ocr  # noqa: B018 (probes Tesseract now: a missing one is logged at start)
        self.worker.start()
        self._warmup = threading.Thread(target=self._warm, name="evidentia-warmup", daemon=True)
        self._warmup.start()
        if self.settings.retrain_interval_s > 0:
            threading.Thread(target=self._retrain_loop, name="evidentia-retrain", daemon=True).start()

    def _retrain_loop(self) -> None:
        """EVIDENTIA_RETRAIN_INTERVAL_S: retrain when feedback arrived since the last
        round. A promoted model is picked up by the reranker cache (hot reload)."""
        from evidentia.training.lifecycle import RetrainOptions, run_retrain, verdicts_from_store
        from evidentia.training.retrain import UnchangedTrainingData

        seen = -1
        while not self._stopping.wait(self.settings.retrain_interval_s):
            if self.backend is None:
                continue
            try:
                verdicts = verdicts_from_store(self.settings)
                if not verdicts or len(verdicts) == seen:
                    continue
                result = run_retrain(self.engine, verdicts, self.settings.retrain_base_data, RetrainOptions(),
                                     log=log.info)
                seen = len(verdicts)
                log.info("scheduled retraining: %s %s", result.version, result.decision.reason)
            except UnchangedTrainingData as exc:  # a restart's first round on the same verdicts
                seen = len(verdicts)
                log.info("scheduled retraining: %s", exc)
            except Exception:
                log.exception("scheduled retraining failed; production model unchanged")

    def stop(self) -> None:
        self._stopping.set()
        self.llm.shutdown()
        self.worker.stop()
        if self._warmup is not None:
            self._warmup.join(5.0)
        if self.engine.backend_open:
            try:
                self.engine.close()
            except Exception:
                log.exception("closing the search backend")
        if self.store is not None:
            self.store.close()

    def _warm(self) -> None:
        """Open the search backend, load the default reranker and (with
        EVIDENTIA_DENSE=on) the embedding model, retrying until all work
        (Elasticsearch may start after us); /ready reports progress."""
        name = self.settings.default_reranker
        while not self._stopping.is_set():
            if self.backend is None:
                try:
                    # the query-side language detector (langdetect's profiles: ~1 s); indexing
                    # no longer loads it in this process (extraction runs in a child)
                    self.engine.detector  # noqa: B018
                    self._sweep_index(self.engine.backend)
                    self.checks["index"] = "ok"
                    self.backend_ready.set()
                except Exception as exc:  # ConfigError, BackendError, connection errors
                    self._check_failed("index", exc)
            if self.checks[f"reranker:{name}"] != "ok":
                if self.checks[f"reranker:{name}"] == "not loaded":
                    self.checks[f"reranker:{name}"] = "loading"
                try:
                    reranker = self.engine.reranker(self.engine.config(reranker=name, stage="bm25"))
                    # an LLM without its key loads but would answer every search with the
                    # first-stage order: not ready
                    problem = reranker.problem()
                    if problem:
                        raise ConfigError(problem)
                    self.checks[f"reranker:{name}"] = "ok"
                except Exception as exc:
                    self._check_failed(f"reranker:{name}", exc)
            if "embedder" in self.checks and self.checks["embedder"] != "ok":
                if self.checks["embedder"] == "not loaded":
                    self.checks["embedder"] = "loading"
                try:
                    self.load_embedder()
                    self.checks["embedder"] = "ok"
                except Exception as exc:  # EmbeddingError: bad EVIDENTIA_DENSE_MODEL, missing package
                    self._check_failed("embedder", exc)
            if self.ready:
                return
            self._stopping.wait(2.0)

    def _check_failed(self, check: str, exc: Exception) -> None:
        """/ready answers anyone: it shows the reason without the server's paths and URLs,
        which the log keeps (once per new reason, not every retry)."""
        shown = f"error: {without_server_details(str(exc))}"
        if self.checks.get(check) != shown:
            log.warning("%s: %s", check, exc)
        self.checks[check] = shown

    # -- crash leftovers -----------------------------------------------------
    def _sweep_files(self) -> None:
        """Remove temporary uploads and upload folders no document refers to
        (a crash between writing the file and committing the row), and the page
        images of uploads no longer stored (a render that ended after its document's
        delete, or a crash before a delete's ``forget``)."""
        documents = self.store.all_documents()
        live = {Path(f).parent.resolve() for d in documents
                for f in (d.file_path, d.next_file_path) if f}  # next_file_path: a re-upload being indexed
        for tenant_dir in self.uploads.iterdir():
            if not tenant_dir.is_dir():
                continue
            for entry in tenant_dir.iterdir():
                if entry.name.startswith(".tmp-") or (entry.is_dir() and entry.resolve() not in live):
                    shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
        generations = {(d.tenant, g) for d in documents for g in (d.generation, d.next_generation) if g}
        cache = self.renderer.cache_dir  # <tenant>/<generation>/ (api/rendering.py)
        for tenant_dir in cache.iterdir() if cache.is_dir() else ():
            for entry in tenant_dir.iterdir() if tenant_dir.is_dir() else ():
                if (tenant_dir.name, entry.name) not in generations:
                    shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)

    def _sweep_index(self, backend: SearchBackend) -> None:
        """Remove tenant documents that are in the index but no longer in the store
        (a crash or a backend error between a delete's two steps). The default
        tenant's (plain ids) are left alone: `eval` and `dataset` index documents
        there without registering them in the store."""
        tenants = set(self.store.tenants())
        for info in backend.list_documents():
            if is_default_tenants(info.doc_id):
                continue
            parts = split_internal_id(info.doc_id)
            if parts[0] in tenants and self.store.get_document(*parts) is None:
                log.info("removing orphan %s from the index", info.doc_id)
                backend.delete_document(info.doc_id)
