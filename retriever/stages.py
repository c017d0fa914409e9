"""First stages: small interchangeable retrievers that turn a ``Query`` into a
candidate pool, in the spirit of Haystack's retrievers + joiner. ``bm25`` reads
keywords, ``dense`` the query embedding; ``hybrid`` runs both and joins them by
weighted reciprocal-rank fusion (``retriever.fusion.rrf``)."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import replace
from typing import TYPE_CHECKING, Sequence

from evidentia.records import Candidate, Query
from evidentia.retriever.base import SearchBackend
from evidentia.retriever.fusion import DEFAULT_K, keep_each_first, rrf
from evidentia.retriever.snippet import make_snippet

if TYPE_CHECKING:  # pragma: no cover
    from evidentia.retriever.dense import PageEmbedder


class FirstStage(ABC):
    """Query + documents -> at most ``top_k`` candidate pages, best first."""

    name: str = "stage"

    @abstractmethod
    def retrieve(self, query: Query, doc_ids: Sequence[str], top_k: int,
                 timings: dict[str, float] | None = None) -> list[Candidate]: ...


class BM25Retriever(FirstStage):
    name = "bm25"

    def __init__(self, backend: SearchBackend) -> None:
        self.backend = backend

    def retrieve(self, query: Query, doc_ids: Sequence[str], top_k: int,
                 timings: dict[str, float] | None = None) -> list[Candidate]:
        return [replace(c, found_by=("bm25",)) for c in self.backend.search(query.keywords, doc_ids, top_k)]


class DenseRetriever(FirstStage):
    name = "dense"

    def __init__(self, backend: SearchBackend, embedder: "PageEmbedder") -> None:
        self.backend = backend
        self.embedder = embedder

    def retrieve(self, query: Query, doc_ids: Sequence[str], top_k: int,
                 timings: dict[str, float] | None = None) -> list[Candidate]:
        t0 = time.perf_counter()
        vector = self.embedder.embed_query(query.text)
        if timings is not None:
            timings["embed_query"] = (time.perf_counter() - t0) * 1000
        found = self.backend.search_dense(vector, doc_ids, top_k, model=self.embedder.name)
        # dense hits carry no keyword snippet: make one, so every stage shows the same kind
        return [replace(c, snippet=c.snippet or make_snippet(c.text, query.keywords, language=c.language),
                        found_by=("dense",)) for c in found]


class HybridRetriever(FirstStage):
    """Both rankings, each ``depth`` pools deep, fused into one pool (the joiner)."""

    name = "hybrid"

    def __init__(self, bm25: FirstStage, dense: FirstStage, weights: tuple[float, float] = (1.0, 1.0),
                 rrf_k: int = DEFAULT_K, depth: int = 2) -> None:
        self.bm25 = bm25
        self.dense = dense
        self.weights = weights
        self.rrf_k = rrf_k
        self.depth = depth

    def retrieve(self, query: Query, doc_ids: Sequence[str], top_k: int,
                 timings: dict[str, float] | None = None) -> list[Candidate]:
        deep = top_k * self.depth
        # dense first: a document without vectors fails before any BM25 work
        dense = self.dense.retrieve(query, doc_ids, deep, timings)
        bm25 = self.bm25.retrieve(query, doc_ids, deep, timings)
        # each ranking's best page stays a candidate (keep_each_first), in fused order
        return keep_each_first(rrf([bm25, dense], self.weights, k=self.rrf_k), [bm25, dense], self.weights, top_k)
