"""Supervised reranker: a trained model gives each candidate page a calibrated
probability of relevance; the probability ranks the pages and a threshold t
drops the weak ones.

Two kinds of model directory (both written by `evidentia train`):

- ``features`` (the shipped CPU default, ``reranker/relevance_model.py``): a
  logistic regression over pool-independent features of (question, answer,
  page): bi-encoder cosines, keyword coverage, the answer's figures on the page.
  The probability is a property of the page: the same whatever pool, first stage
  or place in the pool it comes in. Window vectors stored at indexing time are
  used when the reranker is attached to the backend (``attach_backend``).
- ``lora``: a sequence-classification model (MiniLM, or a Llama-class model with
  QLoRA on a GPU) with a logistic calibration of its margin.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from evidentia.config import Settings
from evidentia.records import Candidate, Query, RankedPage
from evidentia.reranker.base import Reranker, RerankResult
from evidentia.reranker.classifier_model import (
    SHIPPED_MODEL_DIR,
    InputFormat,
    ModelLoadError,
    ModelMetadata,
    load_trained,
    score_margins,
)
from evidentia.reranker.model_registry import resolve_model_dir
from evidentia.runtime import set_torch_threads


class ClassifierReranker(Reranker):
    name = "classifier"
    outputs_probabilities = True
    computes_locally = True

    def __init__(self, model_dir: str | Path | None = None, threshold: float | None = None,
                 batch_size: int = 16, max_length: int | None = None, window_overlap: int | None = None,
                 device: str | None = None, threads: int | None = None, embedder=None) -> None:
        """``model_dir``: a directory written by `evidentia train` (default: the
        shipped CPU model). ``threshold`` None keeps every page (with its probability).
        ``embedder``: a PageEmbedder to share (features models; default: the model's own)."""
        self.model_dir = Path(model_dir) if model_dir else SHIPPED_MODEL_DIR
        self.threshold = threshold
        self.batch_size = batch_size
        self._backend = None
        metadata = ModelMetadata.read(self.model_dir)
        self.kind = metadata.extra.get("kind", "lora")
        if self.kind == "features":
            from evidentia.reranker.features import FeatureExtractor, TermStatistics
            from evidentia.reranker.relevance_model import FeatureModel, FeatureModelError
            from evidentia.retriever.dense import PageEmbedder

            try:
                self.feature_model = FeatureModel.from_dict(metadata.extra["feature_model"])
                stats = metadata.extra.get("term_statistics")
                stats = TermStatistics.from_dict(stats) if stats else None
            except (KeyError, TypeError, ValueError, FeatureModelError) as exc:
                raise ModelLoadError(f"{self.model_dir}: unusable feature model ({exc})") from None
            # a model whose metadata names no windows was trained before they were recorded, on 256/32/8
            emb = metadata.extra.get("embedding", {})
            windows = {"max_tokens": emb.get("max_tokens", 256), "window_overlap": emb.get("window_overlap", 32),
                       "max_windows": emb.get("max_windows", 8)}
            if embedder is not None and embedder.name == _canonical(metadata.base_model):
                # the shared model, with the windows the model was trained on
                embedder = embedder.load().with_windows(**windows)
            else:
                embedder = PageEmbedder(metadata.base_model, device=device, **windows)
            from evidentia.reranker.query_adapter import QueryAdapter
            from evidentia.reranker.question_memory import QuestionMemory

            try:
                adapter = QueryAdapter.load(self.model_dir)
            except ValueError as exc:
                raise ModelLoadError(f"{self.model_dir}: unusable query adapter ({exc})") from None
            self.extractor = FeatureExtractor(embedder, stats, memory=QuestionMemory.load(self.model_dir),
                                              adapter=adapter)
            self.model = self.tokenizer = None
            self.metadata = metadata
        else:
            self.model, self.tokenizer, self.metadata = load_trained(self.model_dir, device=device)
            # after the load, which imports torch: the features kind never needs it (1.3 s of start-up)
            set_torch_threads(threads or 0)
        trained = self.metadata.input_format
        # Windows may be made longer or shorter than in training (a larger GPU,
        # a faster CPU run); the default is what the model was trained with.
        self.input_format = InputFormat(
            max_length=max_length or trained.max_length,
            window_overlap=trained.window_overlap if window_overlap is None else window_overlap,
            max_windows=trained.max_windows,
        )

    @classmethod
    def from_settings(cls, settings: Settings, threshold: float | None = None,
                      embedder=None) -> "ClassifierReranker":
        return cls(
            embedder=embedder,
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

    @property
    def default_threshold(self) -> float | None:
        """The threshold chosen on held-out pools when the model was trained (features models)."""
        if self.kind == "features":
            return self.feature_model.threshold
        return None

    def attach_backend(self, backend) -> None:
        """Read the page window vectors stored at indexing time from ``backend``
        instead of computing them (the pipeline calls this; same numbers, faster)."""
        self._backend = backend

    def margins(self, question: str, answer: str, texts: Sequence[str]) -> list[float]:
        """LoRA models: the logit margin (relevant minus not) of each page, its best
        window's. Features models: ``pool_margins`` (their pages are read with their documents)."""
        if self.kind == "features":
            raise TypeError("a features model scores candidates with their documents: use pool_margins")
        return score_margins(self.model, self.tokenizer, [(question, answer, t) for t in texts],
                             self.input_format, self.batch_size)

    def pool_margins(self, question: str, answer: str, candidates: Sequence[Candidate]) -> list[float]:
        """The margin of each candidate as reranking computes it, its probability
        being sigmoid(margin): a features model's final logit, read with the
        candidate's whole document when the reranker is attached to the index (the
        document features and the document gap; page texts alone would score every
        page as its document's only one); a LoRA model's margin of the page text."""
        if self.kind == "features":
            pages = [(c.doc_id, c.page, c.text) for c in candidates]
            return self.feature_model.pool_logits(self._pool_features(question, answer, pages)).tolist()
        return self.margins(question, answer, [c.text for c in candidates])

    def _pool_features(self, question: str, answer: str, pages):
        vectors = documents = None
        if self._backend is not None:
            from evidentia.reranker.features import stored_document_source, stored_vector_source

            # the document features score the document's other pages from their stored vectors
            embedder = self.extractor.embedder
            vectors = stored_vector_source(self._backend, embedder.name, embedder.window_settings)
            documents = stored_document_source(self._backend)
        return self.extractor.pool_features(question, answer, pages, vector_source=vectors,
                                            document_source=documents)

    def probabilities(self, question: str, answer: str, texts: Sequence[str]) -> list[float]:
        """Calibrated probability of each page, ``texts`` being a first-stage pool in
        its order (a pool-calibrated LoRA model may weigh a page's place in the pool;
        a features model never does)."""
        if self.kind == "features":
            return self._page_probabilities(question, answer, [(None, None, t) for t in texts])
        calibration = self.metadata.calibration
        return [calibration.probability(m, rank)
                for rank, m in enumerate(self.margins(question, answer, texts), start=1)]

    def _page_probabilities(self, question: str, answer: str, pages) -> list[float]:
        return self.feature_model.pool_probabilities(self._pool_features(question, answer, pages)).tolist()

    def rerank(self, query: Query, candidates: Sequence[Candidate]) -> RerankResult:
        if not candidates:
            return RerankResult(pages=[])
        question, answer = query.question, query.answer
        if self.kind == "features":
            probs = self._page_probabilities(question, answer, [(c.doc_id, c.page, c.text) for c in candidates])
        else:
            probs = self.probabilities(question, answer, [c.text for c in candidates])
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


def _canonical(model: str) -> str:
    from evidentia.retriever.dense import canonical_model_name

    return canonical_model_name(model)
