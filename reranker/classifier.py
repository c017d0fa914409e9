"""Supervised reranker: a sequence-classification model (LoRA-tuned) scores each
candidate page; its calibrated probability ranks the pages and a threshold t
drops the weak ones."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from evidentia.config import Settings
from evidentia.records import Candidate, Query, RankedPage
from evidentia.reranker.base import Reranker, RerankResult
from evidentia.reranker.model_registry import resolve_model_dir
from evidentia.reranker.classifier_model import (
    SHIPPED_MODEL_DIR,
    InputFormat,
    load_trained,
    score_margins,
    set_torch_threads,
)


class ClassifierReranker(Reranker):
    name = "classifier"
    outputs_probabilities = True
    computes_locally = True

    def __init__(self, model_dir: str | Path | None = None, threshold: float | None = None,
                 batch_size: int = 16, max_length: int | None = None, window_overlap: int | None = None,
                 device: str | None = None, threads: int | None = None) -> None:
        """``model_dir``: a directory written by `evidentia train` (default: the
        shipped CPU model). ``threshold`` None keeps every page (with its probability)."""
        self.model_dir = Path(model_dir) if model_dir else SHIPPED_MODEL_DIR
        self.threshold = threshold
        self.batch_size = batch_size
        set_torch_threads(threads)
        self.model, self.tokenizer, self.metadata = load_trained(self.model_dir, device=device)
        trained = self.metadata.input_format
        # Windows may be made longer or shorter than in training (a larger GPU,
        # a faster CPU run); the default is what the model was trained with.
        self.input_format = InputFormat(
            max_length=max_length or trained.max_length,
            window_overlap=trained.window_overlap if window_overlap is None else window_overlap,
            max_windows=trained.max_windows,
        )

    @classmethod
    def from_settings(cls, settings: Settings, threshold: float | None = None) -> "ClassifierReranker":
        return cls(
            model_dir=resolve_model_dir(settings),
            threshold=threshold,
            batch_size=settings.classifier_batch_size,
            max_length=settings.classifier_max_length,
            window_overlap=settings.classifier_window_overlap,
            threads=settings.torch_threads,
        )

    @property
    def model_version(self) -> str:
        """``<model dir>@<created>+<data sha256[:12]>``: which trained model scored."""
        extra = self.metadata.extra or {}
        created = extra.get("created") or "unknown"
        data = str(extra.get("data_sha256") or "")[:12] or "unknown"
        return f"{self.model_dir.name}@{created}+{data}"

    def margins(self, question: str, answer: str, texts: Sequence[str]) -> list[float]:
        """The model's logit margin (relevant minus not) of each page: its best window's."""
        return score_margins(self.model, self.tokenizer, [(question, answer, t) for t in texts],
                             self.input_format, self.batch_size)

    def probabilities(self, question: str, answer: str, texts: Sequence[str]) -> list[float]:
        """Calibrated probability of each page, ``texts`` being a first-stage pool in
        its order (the calibration may weigh a page's place in the pool)."""
        calibration = self.metadata.calibration
        return [calibration.probability(m, rank)
                for rank, m in enumerate(self.margins(question, answer, texts), start=1)]

    def rerank(self, query: Query, candidates: Sequence[Candidate]) -> RerankResult:
        if not candidates:
            return RerankResult(pages=[])
        probs = self.probabilities(query.question, query.answer, [c.text for c in candidates])
        ranked = sorted(zip(candidates, probs), key=lambda cp: (-cp[1], -cp[0].score, cp[0].doc_id, cp[0].page))
        pages = [
            RankedPage(doc_id=c.doc_id, page=c.page, score=p, probability=p, snippet=c.snippet, text=c.text)
            for c, p in ranked
            if self.threshold is None or p >= self.threshold
        ]
        # the best probability tells the user how far the threshold is from keeping anything
        return RerankResult(pages=pages, info={"model": str(self.model_dir), "scored": len(candidates),
                                               "best_probability": max(probs),
                                               "below_threshold": len(candidates) - len(pages)})
