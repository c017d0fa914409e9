"""The untrained baseline: rerank the pool by the all-MiniLM-L6-v2 cosine between
question + answer and the page's best window (the stored index vectors when the
pipeline attaches the backend). No training, no probability: the bar a trained
reranker has to clear."""

from __future__ import annotations

from typing import Sequence

from evidentia.records import Candidate, Query, RankedPage
from evidentia.reranker.base import Reranker, RerankResult


class CosineReranker(Reranker):
    name = "cosine"

    def __init__(self, embedder) -> None:
        from evidentia.reranker.features import FeatureExtractor

        self.extractor = FeatureExtractor(embedder)
        self._backend = None

    @classmethod
    def from_settings(cls, settings, threshold: float | None = None, embedder=None) -> "CosineReranker":
        from evidentia.retriever.dense import PageEmbedder

        return cls(embedder or PageEmbedder.from_settings(settings)).with_threshold(threshold)

    def attach_backend(self, backend) -> None:
        self._backend = backend

    def rerank(self, query: Query, candidates: Sequence[Candidate]) -> RerankResult:
        from evidentia.reranker.features import stored_vector_source

        if not candidates:
            return RerankResult(pages=[])
        embedder = self.extractor.embedder
        source = (stored_vector_source(self._backend, embedder.name, embedder.window_settings)
                  if self._backend is not None else None)
        feats = self.extractor.features(query.question, query.answer, [(c.doc_id, c.page, c.text) for c in candidates],
                                        vector_source=source)
        scored = sorted(zip(candidates, feats[:, 0].tolist()), key=lambda cs: (-cs[1], cs[0].doc_id, cs[0].page))
        return RerankResult(pages=[RankedPage(doc_id=c.doc_id, page=c.page, score=s, probability=None,
                                              snippet=c.snippet, text=c.text) for c, s in scored])
