"""The reranker interface: question + answer + candidate pages -> kept pages, best first."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Sequence

from evidentia.records import Candidate, RankedPage


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

    @abstractmethod
    def rerank(self, question: str, answer: str, candidates: Sequence[Candidate]) -> RerankResult: ...


def passthrough(candidates: Sequence[Candidate]) -> list[RankedPage]:
    """The first-stage order as ranked pages."""
    return [
        RankedPage(doc_id=c.doc_id, page=c.page, score=c.score, probability=None, snippet=c.snippet, text=c.text)
        for c in candidates
    ]


class NoReranker(Reranker):
    """Keep the first-stage (BM25) ranking as it is."""

    name = "none"

    def rerank(self, question: str, answer: str, candidates: Sequence[Candidate]) -> RerankResult:
        return RerankResult(pages=passthrough(candidates))
