"""Retrieve then rerank: the one path every entry point (CLI, eval, API) takes.

The first stage (``stage``) builds the candidate pool: ``bm25`` (keywords),
``dense`` (cosine between the question + answer embedding and the page
windows) or ``hybrid`` (both, fused by weighted reciprocal-rank fusion).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Sequence

from evidentia.config import STAGES, ConfigError
from evidentia.indexer.language import LanguageDetector
from evidentia.records import Candidate, RankedPage
from evidentia.reranker.base import NoReranker, Reranker
from evidentia.retriever.base import MissingVectorsError, SearchBackend
from evidentia.retriever.fusion import rrf
from evidentia.retriever.query import KeywordQuery, build_query
from evidentia.retriever.snippet import make_snippet

if TYPE_CHECKING:  # pragma: no cover
    from evidentia.config import Settings
    from evidentia.retriever.dense import PageEmbedder


@dataclass(frozen=True)
class PipelineResult:
    candidates: list[Candidate]  # the first-stage pool, best first
    pages: list[RankedPage]  # what the reranker kept, best first
    reranker: str
    fallback_reason: str | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    stage: str = ""  # the first stage that built the pool (bm25 when hybrid fell back)
    stage_note: str | None = None  # why the stage fell back, and how to add the missing vectors
    without_vectors: tuple[str, ...] = ()  # the documents that made it fall back


@dataclass
class Pipeline:
    backend: SearchBackend
    detector: LanguageDetector
    reranker: Reranker = field(default_factory=NoReranker)
    pool_size: int = 20
    stage: str = "bm25"
    embedder: "PageEmbedder | None" = None  # needed by the dense and hybrid stages
    rrf_k: int = 60
    hybrid_weights: tuple[float, float] = (1.0, 1.0)  # (bm25, dense)
    hybrid_depth: int = 2  # each ranking fused is pool_size * hybrid_depth deep
    # hybrid on documents without page vectors: search them with bm25 and say so
    # (the default stage), instead of raising MissingVectorsError (a stage asked for).
    bm25_fallback: bool = False

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ConfigError(f"unknown first stage {self.stage!r}; choose one of {', '.join(STAGES)}")
        if self.stage != "bm25" and self.embedder is None:
            raise ConfigError(f"the {self.stage} stage needs an embedding model (PageEmbedder)")

    @classmethod
    def from_settings(cls, settings: "Settings", backend: SearchBackend, detector: LanguageDetector,
                      reranker: Reranker | None = None, *, stage: str | None = None,
                      embedder: "PageEmbedder | None" = None, pool_size: int | None = None) -> "Pipeline":
        """A pipeline with the settings' first stage (or ``stage``); the embedder is
        created from the settings when the stage needs one and none is given."""
        fallback = stage is None  # the default stage falls back; a stage asked for raises
        stage = stage or settings.stage
        if stage != "bm25" and embedder is None:
            from evidentia.retriever.dense import PageEmbedder

            embedder = PageEmbedder.from_settings(settings)
        return cls(backend=backend, detector=detector, reranker=reranker or NoReranker(),
                   pool_size=pool_size or settings.pool_size, stage=stage, embedder=embedder,
                   rrf_k=settings.rrf_k, hybrid_weights=tuple(settings.hybrid_weights),
                   hybrid_depth=settings.hybrid_depth, bm25_fallback=fallback)

    def retrieve(self, question: str, answer: str, doc_ids: Sequence[str],
                 timings: dict[str, float] | None = None) -> list[Candidate]:
        """The first-stage pool, best first, at most ``pool_size`` pages."""
        query = build_query(question, answer, self.detector)
        if self.stage == "bm25":
            return self.backend.search(query.keywords, doc_ids, self.pool_size)
        if self.stage == "dense":
            return self._dense(query, doc_ids, self.pool_size, timings)
        depth = self.pool_size * self.hybrid_depth
        # dense first: a document without vectors fails before any BM25 work
        dense = self._dense(query, doc_ids, depth, timings)
        bm25 = self.backend.search(query.keywords, doc_ids, depth)
        return rrf([bm25, dense], self.hybrid_weights, k=self.rrf_k, top_k=self.pool_size)

    def _dense(self, query: KeywordQuery, doc_ids: Sequence[str], top_k: int,
               timings: dict[str, float] | None) -> list[Candidate]:
        t0 = time.perf_counter()
        vector = self.embedder.embed_query(query.text)
        if timings is not None:
            timings["embed_query"] = (time.perf_counter() - t0) * 1000
        found = self.backend.search_dense(vector, doc_ids, top_k, model=self.embedder.name)
        return [replace(c, snippet=c.snippet or make_snippet(c.text, query.keywords)) for c in found]

    def run(self, question: str, answer: str, doc_ids: Sequence[str]) -> PipelineResult:
        t0 = time.perf_counter()
        timings: dict[str, float] = {}
        stage, note, without = self.stage, None, ()
        try:
            candidates = self.retrieve(question, answer, doc_ids, timings)
        except MissingVectorsError as exc:
            if self.stage != "hybrid" or not self.bm25_fallback:
                raise
            stage, note, without = "bm25", missing_vectors_note(exc.doc_ids), tuple(exc.doc_ids)
            query = build_query(question, answer, self.detector)
            candidates = self.backend.search(query.keywords, doc_ids, self.pool_size)
        t1 = time.perf_counter()
        result = self.reranker.rerank(question, answer, candidates)
        t2 = time.perf_counter()
        timings.update({"retrieve": (t1 - t0) * 1000, "rerank": (t2 - t1) * 1000})
        return PipelineResult(
            candidates=candidates,
            pages=result.pages,
            reranker=self.reranker.name,
            fallback_reason=result.fallback_reason,
            timings_ms=timings,
            stage=stage,
            stage_note=note,
            without_vectors=without,
        )


def missing_vectors_note(doc_ids: Sequence[str]) -> str:
    shown = ", ".join(doc_ids[:5]) + (f" and {len(doc_ids) - 5} more" if len(doc_ids) > 5 else "")
    args = " ".join(f"--doc {d}" for d in doc_ids[:5])
    return (f"searched with bm25: no page embeddings for {shown} (indexed with EVIDENTIA_DENSE=off or before "
            f"dense retrieval); `evidentia embed {args}` adds them from the indexed text, "
            f"then searches use the hybrid stage")
