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
