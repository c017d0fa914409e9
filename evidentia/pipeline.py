"""Retrieve then rerank: the one path every entry point (CLI, eval, API) takes."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

from evidentia.indexer.language import LanguageDetector
from evidentia.records import Candidate, RankedPage
from evidentia.reranker.base import NoReranker, Reranker
from evidentia.retriever.base import SearchBackend
from evidentia.retriever.query import build_query


@dataclass(frozen=True)
class PipelineResult:
    candidates: list[Candidate]  # the first-stage pool, best first
    pages: list[RankedPage]  # what the reranker kept, best first
    reranker: str
    fallback_reason: str | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)


@dataclass
class Pipeline:
    backend: SearchBackend
    detector: LanguageDetector
    reranker: Reranker = field(default_factory=NoReranker)
    pool_size: int = 20

    def run(self, question: str, answer: str, doc_ids: Sequence[str]) -> PipelineResult:
        t0 = time.perf_counter()
        query = build_query(question, answer, self.detector)
        candidates = self.backend.search(query.keywords, doc_ids, self.pool_size)
        t1 = time.perf_counter()
        result = self.reranker.rerank(question, answer, candidates)
        t2 = time.perf_counter()
        return PipelineResult(
            candidates=candidates,
            pages=result.pages,
            reranker=self.reranker.name,
            fallback_reason=result.fallback_reason,
            timings_ms={"retrieve": (t1 - t0) * 1000, "rerank": (t2 - t1) * 1000},
        )
