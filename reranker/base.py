"""The reranker interface: a query + candidate pages -> kept pages, best first.

Everything a caller needs to know about a reranker is on this interface (its
name, whether it computes on this machine, its model version, a copy with
another threshold), so no caller inspects an implementation."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from evidentia.config import ConfigError
from evidentia.records import Candidate, Query, RankedPage


@dataclass(frozen=True)
class RerankResult:
    pages: list[RankedPage]
    # Set when the reranker could not do its job and handed back the first-stage
    # order instead (e.g. the LLM endpoint failed): says why, for the user.
    fallback_reason: str | None = None
    info: dict = field(default_factory=dict)


class Reranker(ABC):
    """One implementation per method; constructed once, then called per query."""

    name: str = "reranker"
    # True when RankedPage.probability is a calibrated relevance probability,
    # which evaluation uses for calibration metrics and threshold sweeps.
    outputs_probabilities: bool = False
    # True when scoring runs on this machine's cores (a local model): the API
    # bounds how many such calls run at once instead of thrashing the CPU.
    computes_locally: bool = False
    # True when rerank() takes ``deadline=`` (a reranker.llm_runtime.Deadline or a
    # time.monotonic() instant) and returns by it, falling back to the first-stage
    # order: it waits on a remote model, so the API awaits it in its own bounded
    # executor (EVIDENTIA_LLM_CONCURRENCY) instead of holding a thread of the pool.
    takes_deadline: bool = False
    # Pages whose probability is below it are dropped (probability rerankers only).
    threshold: float | None = None
    # The model directory it loaded, when it loads one (hot reload compares it).
    model_dir: Path | None = None

    @classmethod
    def from_settings(cls, settings, threshold: float | None = None, embedder=None) -> "Reranker":
        """The reranker as the settings configure it (the registry calls this).
        ``embedder``: the process's page embedder, for rerankers that encode text,
        so its model is loaded once per process rather than once per reranker."""
        return cls().with_threshold(threshold)

    @property
    def model_version(self) -> str | None:
        """A version string of the loaded model, stored with each validation."""
        return None

    def problem(self) -> str | None:
        """Why every call would fall back to the first-stage order (a remote model
        without its key), found without calling anything; None when it can work."""
        return None

    def with_threshold(self, threshold: float | None) -> "Reranker":
        """This reranker with another threshold, sharing whatever it has loaded."""
        if threshold == self.threshold:
            return self
        if threshold is not None and not self.outputs_probabilities:
            raise ConfigError(f"reranker {self.name!r} does not output probabilities, so it takes no threshold")
        if threshold is not None and not 0.0 <= threshold <= 1.0:
            raise ConfigError(f"threshold must be between 0 and 1, not {threshold}")
        twin = copy.copy(self)
        twin.threshold = threshold
        return twin

    def attach_backend(self, backend) -> None:
        """The search backend, for rerankers that read what indexing stored (the page
        vectors); the others need nothing from it."""

    @abstractmethod
    def rerank(self, query: Query, candidates: Sequence[Candidate]) -> RerankResult: ...


def passthrough(candidates: Sequence[Candidate]) -> list[RankedPage]:
    """The first-stage order as ranked pages."""
    return [
        RankedPage(doc_id=c.doc_id, page=c.page, score=c.score, probability=None, snippet=c.snippet, text=c.text)
        for c in candidates
    ]


class NoReranker(Reranker):
    """Keep the first-stage ranking as it is."""

    name = "none"

    def rerank(self, query: Query, candidates: Sequence[Candidate]) -> RerankResult:
        return RerankResult(pages=passthrough(candidates))
