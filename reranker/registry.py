"""Reranker names -> constructors, and the configuration strings that name a
first stage plus a reranker (``bm25``, ``hybrid``, ``classifier@0.15``,
``bm25+llm``, ``hybrid+classifier@0.15``).

Adding a reranker means adding one entry to ``_FACTORIES``; the CLI, evaluation
and API take every name listed here without other change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from evidentia.config import STAGES, ConfigError, Settings
from evidentia.reranker.base import NoReranker, Reranker

# bm25 (keywords), dense (page embeddings), hybrid (both, reciprocal-rank fused).
FIRST_STAGES = STAGES


def _none(settings: Settings, threshold: float | None) -> Reranker:
    return NoReranker()


def _llm(settings: Settings, threshold: float | None) -> Reranker:
    from evidentia.reranker.llm import LLMReranker

    return LLMReranker.from_settings(settings)


def _classifier(settings: Settings, threshold: float | None) -> Reranker:
    from evidentia.reranker.classifier import ClassifierReranker
    from evidentia.reranker.classifier_model import ModelLoadError

    try:
        return ClassifierReranker.from_settings(settings, threshold)
    except ModelLoadError as exc:
        raise ConfigError(str(exc)) from None


def _cosine(settings: Settings, threshold: float | None) -> Reranker:
    from evidentia.reranker.cosine import CosineReranker
    from evidentia.retriever.dense import PageEmbedder

    return CosineReranker(PageEmbedder.from_settings(settings))


# Imports happen inside the factories: torch and openai load only when used.
_FACTORIES: dict[str, Callable[[Settings, float | None], Reranker]] = {
    "none": _none,
    "llm": _llm,
    "classifier": _classifier,
    "cosine": _cosine,  # untrained bi-encoder baseline (no probability)
}


def reranker_names() -> list[str]:
    return list(_FACTORIES)


def create_reranker(name: str, settings: Settings, threshold: float | None = None) -> Reranker:
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise ConfigError(f"unknown reranker {name!r}; choose one of {', '.join(_FACTORIES)}") from None
    if threshold is not None and not 0.0 <= threshold <= 1.0:
        raise ConfigError(f"threshold must be between 0 and 1, not {threshold}")
    return factory(settings, threshold)


@dataclass(frozen=True)
class PipelineConfig:
    """A named configuration: first stage, reranker and its threshold."""

    stage: str = "bm25"
    reranker: str = "none"
    threshold: float | None = None

    @property
    def label(self) -> str:
        parts = [self.stage] if self.reranker == "none" else [self.stage, self.reranker]
        label = "+".join(parts)
        return f"{label}@{self.threshold:g}" if self.threshold is not None else label


def parse_config(spec: str) -> PipelineConfig:
    """``[stage+]reranker[@threshold]``; a bare stage means no reranker, a bare
    reranker runs on the bm25 stage (``classifier@0.15`` = ``bm25+classifier@0.15``)."""
    spec = spec.strip()
    if not spec:
        raise ConfigError("empty configuration")
    body, _, thr = spec.partition("@")
    threshold = None
    if thr:
        try:
            threshold = float(thr)
        except ValueError:
            raise ConfigError(f"{spec!r}: threshold {thr!r} is not a number") from None
        if not 0.0 <= threshold <= 1.0:
            raise ConfigError(f"{spec!r}: threshold must be between 0 and 1")
    parts = [p.strip() for p in body.split("+") if p.strip()]
    stage, reranker = "bm25", "none"
    if len(parts) == 1:
        if parts[0] in FIRST_STAGES:
            stage = parts[0]
        else:
            reranker = parts[0]
    elif len(parts) == 2:
        stage, reranker = parts
    else:
        raise ConfigError(f"{spec!r}: expected [stage+]reranker[@threshold]")
    if stage not in FIRST_STAGES:
        raise ConfigError(f"{spec!r}: unknown first stage {stage!r}; choose one of {', '.join(FIRST_STAGES)}")
    if reranker not in _FACTORIES:
        raise ConfigError(f"{spec!r}: unknown reranker {reranker!r}; choose one of {', '.join(_FACTORIES)}")
    if threshold is not None and reranker == "none":
        raise ConfigError(f"{spec!r}: a threshold needs a reranker that outputs probabilities")
    return PipelineConfig(stage=stage, reranker=reranker, threshold=threshold)
