"""All settings in one place, read from ``EVIDENTIA_*`` environment variables.

A ``Settings`` object is built once by the entry point (CLI, API) and passed down
explicitly; nothing below reads the environment on its own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

BACKENDS = ("embedded", "elasticsearch")


class ConfigError(ValueError):
    """A setting has a value Evidentia cannot use."""


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
    classifier_batch_size: int = 16
    classifier_max_length: int | None = None  # None: as trained
    classifier_window_overlap: int | None = None  # None: as trained

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
            classifier_threshold=_probability(env, "EVIDENTIA_CLASSIFIER_THRESHOLD", defaults.classifier_threshold),
            classifier_batch_size=_positive_int(env, "EVIDENTIA_CLASSIFIER_BATCH_SIZE", defaults.classifier_batch_size),
            classifier_max_length=_positive_int(env, "EVIDENTIA_CLASSIFIER_MAX_LENGTH", 0) or None,
            classifier_window_overlap=(_non_negative_int(env, "EVIDENTIA_CLASSIFIER_WINDOW_OVERLAP", -1)
                                       if env.get("EVIDENTIA_CLASSIFIER_WINDOW_OVERLAP") else None),
        )

    def with_(self, **changes) -> "Settings":
        return replace(self, **changes)


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a positive integer, not {raw!r}") from None
    if value <= 0:
        raise ConfigError(f"{name} must be a positive integer, not {raw!r}")
    return value


def _non_negative_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if not raw.strip().isdigit():
        raise ConfigError(f"{name} must be a whole number >= 0, not {raw!r}")
    return int(raw)


def _positive_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a positive number, not {raw!r}") from None
    if value <= 0:
        raise ConfigError(f"{name} must be a positive number, not {raw!r}")
    return value


def _probability(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number between 0 and 1, not {raw!r}") from None
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{name} must be a number between 0 and 1, not {raw!r}")
    return value
