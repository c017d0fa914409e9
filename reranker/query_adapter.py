"""A learned linear map of the query vector, kept with the model: the bi-encoder's
page vectors stay as indexed, only the query moves towards what the judged pages
of training say relevance looks like.

The untrained all-MiniLM-L6-v2 cosine ranks a report's pages for "adaptation
targets" by topic, and every page of a climate report is on the topic; its pages
for *other* questions of the same report were most of what the model returned above
the threshold. The adapter (``q' = q + M q``, normalised) is fitted on the training
pools, listwise (each pool's relevant pages against its other pages), with an L2
penalty that keeps it near the identity (``training/query_adapter.py``). Pages keep
their stored vectors, so it costs one 384 x 384 product per query at search time,
and the page's adapted cosine is still a property of (question, answer, page).

It moves only the query of a question the model's question memory matches
(``reranker/features.py``): learnt on the remembered questions, it cost the new ones
(docs/BENCHMARKS.md 8s). Without an adapter file (models trained before it), ``M`` is zero: the adapted
cosine is the plain one, and such models give the feature no weight anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

FILE_NAME = "query-adapter.npy"


@dataclass(frozen=True)
class QueryAdapter:
    matrix: np.ndarray  # (dim, dim): q' = q + matrix @ q

    def adapt(self, vector: np.ndarray) -> np.ndarray:
        """The adapted query vector, unit length (the zero vector stays zero)."""
        vector = np.asarray(vector, dtype=np.float32)
        if self.matrix.shape != (len(vector), len(vector)):
            return vector  # another encoder's vectors: nothing learnt for them
        moved = vector + self.matrix @ vector
        norm = float(np.linalg.norm(moved))
        return moved / norm if norm > 0 else moved

    def save(self, directory: Path) -> Path:
        path = Path(directory) / FILE_NAME
        np.save(path, self.matrix.astype(np.float32))
        return path

    @classmethod
    def load(cls, directory: Path) -> "QueryAdapter | None":
        path = Path(directory) / FILE_NAME
        if not path.exists():
            return None
        matrix = np.load(path, allow_pickle=False)
        if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
            raise ValueError(f"{FILE_NAME}: expected a square matrix, got shape {matrix.shape}")
        return cls(matrix.astype(np.float32))
