"""Reranker names -> implementations.

Adding a reranker means one entry in ``_CLASSES`` (module, class), its name in
evidentia/config.py's ``RERANKERS`` (EVIDENTIA_DEFAULT_RERANKER is checked against it
at start-up) and a class with ``from_settings(settings, threshold)``; the engine, and so the CLI,
evaluation and API, take every name listed here without other change. Classes
are imported by name, so torch and openai load only when a reranker is used.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from evidentia.config import RERANKERS, ConfigError, Settings
from evidentia.reranker.base import Reranker

# name -> (module, class), imported on first use; a class object is taken as it is.
_CLASSES: dict[str, "tuple[str, str] | type[Reranker]"] = {
    "none": ("evidentia.reranker.base", "NoReranker"),
    "llm": ("evidentia.reranker.llm", "LLMReranker"),
    "classifier": ("evidentia.reranker.classifier", "ClassifierReranker"),
    "cosine": ("evidentia.reranker.cosine", "CosineReranker"),  # untrained bi-encoder baseline (no probability)
}
# config.py validates EVIDENTIA_DEFAULT_RERANKER with these names without importing this package
assert tuple(_CLASSES) == RERANKERS, f"config.RERANKERS {RERANKERS} differs from the registry's {tuple(_CLASSES)}"


def reranker_names() -> list[str]:
    return list(_CLASSES)


def reranker_class(name: str) -> type[Reranker]:
    """The implementation of ``name`` (cheap: no model is loaded)."""
    try:
        entry = _CLASSES[name]
    except KeyError:
        raise ConfigError(f"unknown reranker {name!r}; choose one of {', '.join(_CLASSES)}") from None
    if isinstance(entry, type):
        return entry
    module, cls = entry
    return getattr(importlib.import_module(module), cls)


def create_reranker(name: str, settings: Settings, threshold: float | None = None, embedder=None) -> Reranker:
    """A new reranker (loading its model); ConfigError says what is wrong when it cannot be made.
    ``embedder``: a page embedder to share (see ``Reranker.from_settings``)."""
    cls = reranker_class(name)
    if threshold is not None and not 0.0 <= threshold <= 1.0:
        raise ConfigError(f"threshold must be between 0 and 1, not {threshold}")
    return cls.from_settings(settings, threshold, embedder=embedder)


def current_model_dir(name: str, settings: Settings) -> Path | None:
    """The model directory a reranker of this name should have loaded now (None:
    it loads no model): a promotion or rollback in the registry changes it."""
    if name != "classifier":
        return None
    from evidentia.reranker.model_registry import resolve_model_dir

    return resolve_model_dir(settings)
