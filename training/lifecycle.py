"""Glue for the model life cycle used by the CLI and the API's schedule: where
verdicts come from, how a retraining round is run with the current settings."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from evidentia.config import Settings
from evidentia.indexer.language import LanguageDetector
from evidentia.retriever.base import SearchBackend
from evidentia.training.dataset import TrainingRecord, read_records
from evidentia.training.registry import registry_for
from evidentia.training.retrain import RetrainResult, Verdict, retrain
from evidentia.training.train import TrainParams


def verdicts_from_store(settings: Settings) -> list[Verdict]:
    """Every tenant's feedback in the API's store, keyed by the index's document ids."""
    from evidentia.api.indexing import internal_id
    from evidentia.api.services import store_path
    from evidentia.api.store import Store

    path = store_path(settings)
    if not path.exists():
        return []
    store = Store(path)
    try:
        out = []
        for tenant in store.tenants():
            for f in store.iter_feedback(tenant):
                out.append(Verdict(f.question, f.answer, internal_id(tenant, f.document_id), f.page,
                                   f.relevant, f.created))
        return out
    finally:
        store.close()


def verdicts_from_records(records: Sequence[TrainingRecord]) -> list[Verdict]:
    """Verdicts from an exported feedback file; line order stands in for time."""
    return [Verdict(r.question, r.answer, r.doc_id, int(r.page), bool(r.relevance), f"{i:012d}")
            for i, r in enumerate(records) if r.page is not None and r.doc_id]


def run_retrain(settings: Settings, backend: SearchBackend, detector: LanguageDetector,
                verdicts: Sequence[Verdict], base_data: Path | None, base_model: str,
                params: TrainParams, held_out_fraction: float, ece_margin: float,
                log: Callable[[str], None] = print, kind: str | None = None) -> RetrainResult:
    """``kind`` None: the kind of the model in use now (production, or the shipped one)."""
    from evidentia.reranker.classifier import ClassifierReranker
    from evidentia.reranker.classifier_model import ModelMetadata, resolve_model_dir

    if kind is None:
        kind = ModelMetadata.read(resolve_model_dir(settings)).extra.get("kind", "lora")

    base_records = read_records(base_data) if base_data else []

    def load(path: Path | None):
        if path is None:  # production is the default model: the shipped one or EVIDENTIA_CLASSIFIER_MODEL
            from evidentia.reranker.classifier_model import resolve_model_dir

            path = resolve_model_dir(settings)
        reranker = ClassifierReranker(path, threshold=None, batch_size=settings.classifier_batch_size)
        reranker.attach_backend(backend)  # stored page vectors for features models (same numbers, faster)
        return reranker

    return retrain(verdicts, base_records, backend, detector, registry_for(settings.data_dir), base_model, load,
                   params=params, held_out_fraction=held_out_fraction, ece_margin=ece_margin, log=log, kind=kind)
