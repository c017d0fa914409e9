"""``evidentia retrain`` and ``evidentia models list|promote|rollback``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from evidentia.console import App
from evidentia.training.lifecycle import RetrainOptions

models_app = App(no_args_is_help=True, help="The model registry: list, promote, roll back.")


def retrain_command(
    feedback: Optional[Path] = typer.Option(None, "--feedback", help="Exported feedback JSONL "
                                            "(default: the API's feedback store in EVIDENTIA_DATA_DIR)."),
    tenant: Optional[str] = typer.Option(None, "--tenant", help="With --feedback: the tenant whose documents its "
                                         "records name (GET /v1/feedback/export writes no tenant: the one of the "
                                         "key that exported it; default: 'default'). The store's feedback knows "
                                         "its tenants."),
    base_data: Optional[Path] = typer.Option(None, "--base-data", help="Base training records merged with the "
                                             "feedback (default EVIDENTIA_RETRAIN_BASE_DATA)."),
    base_model: str = typer.Option(RetrainOptions.base_model, "--base-model"),
    epochs: float = typer.Option(RetrainOptions.epochs, "--epochs"),
    learning_rate: float = typer.Option(RetrainOptions.learning_rate, "--lr"),
    max_steps: Optional[int] = typer.Option(RetrainOptions.max_steps, "--max-steps"),
    held_out_fraction: float = typer.Option(RetrainOptions.held_out_fraction, "--held-out-fraction",
                                            help="Share of documents held out for the promotion gate."),
    ece_margin: float = typer.Option(RetrainOptions.ece_margin, "--ece-margin",
                                     help="How much worse ECE may get and still promote."),
    as_json: bool = typer.Option(False, "--json"),
    kind: Optional[str] = typer.Option(None, "--kind", help="features (the shipped CPU model's kind: seconds) or "
                                       "lora (fine-tune --base-model; QLoRA on a GPU); default: the kind of the "
                                       "model in use."),
    force: bool = typer.Option(False, "--force", help="Train even when the records and settings are those a "
                               "registered version was trained on (without it: nothing is registered again)."),
):
    """Train a candidate from feedback + base data and evaluate it against production on held-out
    documents. It is promoted when at least EVIDENTIA_RETRAIN_MIN_HELDOUT_QUERIES held-out queries judge it
    and they do not show it worse: P@3 lower in 90 % or more of paired resamples of the held-out documents
    (of their queries with fewer than three such documents), or ECE worse by more than --ece-margin."""
    from evidentia.console import EXIT_BAD_INPUT, Context, fail, require_files
    from evidentia.library import Library, LibraryError
    from evidentia.reranker.classifier_model import ModelLoadError
    from evidentia.reranker.model_registry import RegistryError
    from evidentia.reranker.relevance_model import FeatureModelError
    from evidentia.retriever.base import UnknownDocumentError
    from evidentia.tenants import split_internal_id
    from evidentia.training.dataset import DatasetError, read_records
    from evidentia.training.lifecycle import (missing_documents_message, run_retrain, verdicts_from_records,
                                              verdicts_from_store)
    from evidentia.training.retrain import UnchangedTrainingData
    from evidentia.training.train import TrainingError

    if tenant is not None and feedback is None:
        raise fail("--tenant goes with --feedback (the store's feedback knows its tenants)")
    if kind is not None and kind not in ("lora", "features"):
        raise fail("--kind must be lora or features")
    if not 0.0 < held_out_fraction < 1.0:
        raise fail("--held-out-fraction must be between 0 and 1 (exclusive)")
    if not 0.0 <= ece_margin < float("inf"):  # NaN too: `ce > pe + nan` never held a candidate back
        raise fail("--ece-margin must be a number of 0 or more")
    ctx = Context()
    library = Library(ctx.engine)
    try:
        tenant = library.tenant(tenant)
    except LibraryError as exc:
        raise fail(f"--tenant: {exc}")
    base = base_data or ctx.settings.retrain_base_data
    base_name = "--base-data" if base_data else "EVIDENTIA_RETRAIN_BASE_DATA"
    require_files(("--feedback", feedback), (base_name, base))  # the base data's too, before the feedback is read
    try:
        verdicts = (verdicts_from_records(read_records(feedback), tenant) if feedback else
                    verdicts_from_store(ctx.settings))
    except (DatasetError, OSError) as exc:
        raise fail(str(exc), EXIT_BAD_INPUT)
    if not verdicts:
        raise fail("no feedback to learn from (the store is empty; give --feedback FILE)", EXIT_BAD_INPUT)
    ctx.backend  # noqa: B018 (opens it, or fails with the right exit code)
    if feedback is not None:
        # checked before the round (which met them half a minute in, with a traceback)
        missing = ctx.engine.missing_documents(sorted({v.doc_id for v in verdicts}))
        if missing:
            raise fail(missing_documents_message(library, tenant, [split_internal_id(d)[1] for d in missing],
                                                 "--feedback"), EXIT_BAD_INPUT)
    options = RetrainOptions(base_model=base_model, epochs=epochs, learning_rate=learning_rate, max_steps=max_steps,
                             held_out_fraction=held_out_fraction, ece_margin=ece_margin, kind=kind, force=force)
    try:
        result = run_retrain(ctx.engine, verdicts, base, options, log=lambda m: typer.echo(m, err=True))
    except UnchangedTrainingData as exc:  # nothing failed: said, exit 0
        typer.echo(json.dumps({"version": None, "promoted": False, "same_as": exc.same_as.version,
                               "reason": str(exc)}, indent=2) if as_json else str(exc))
        return
    except (TrainingError, ModelLoadError, RegistryError, DatasetError, FeatureModelError) as exc:
        raise fail(str(exc), EXIT_BAD_INPUT)
    except UnknownDocumentError as exc:  # the store's feedback on a document deleted since
        raise fail(f"{exc}; `evidentia docs` lists the indexed ones", EXIT_BAD_INPUT)
    summary = {"version": result.version, "promoted": result.decision.promote, "reason": result.decision.reason,
               "candidate": result.decision.candidate, "production": result.decision.production,
               "train_records": result.train_records, "held_out_queries": result.held_out_queries}
    typer.echo(json.dumps(summary, indent=2) if as_json else
               f"{result.version}: {'promoted' if result.decision.promote else 'not promoted'} — {result.decision.reason}")


@models_app.command("list")
def models_list(as_json: bool = typer.Option(False, "--json")):
    """Every trained model with its metadata and what it is now (in production, rolled back, replaced,
    never promoted), the gate's reason and production's score on the same held-out queries; the last
    line is the default model (shipped, or EVIDENTIA_CLASSIFIER_MODEL). * marks the model searches use."""
    from evidentia.console import EXIT_BAD_INPUT, Context, fail
    from evidentia.reranker.classifier_model import SHIPPED_MODEL_DIR
    from evidentia.reranker.model_registry import RegistryError, registry_for

    ctx = Context()
    try:
        entries = registry_for(ctx.settings.data_dir).entries()
    except RegistryError as exc:
        raise fail(str(exc), EXIT_BAD_INPUT)
    if as_json:
        typer.echo(json.dumps([{**e.__dict__, "path": str(e.path)} for e in entries], indent=2))
        return
    # EVIDENTIA_CLASSIFIER_MODEL wins over the registry (resolve_model_dir): the * says so
    override = ctx.settings.classifier_model
    in_production = any(e.production for e in entries)
    if not entries:
        typer.echo("no trained model registered (`evidentia retrain` registers one)")
    for e in entries:
        held = e.metrics.get("held_out") or {}
        typer.echo(f"{'*' if e.production and not override else ' '} {e.version}  {e.created}  "
                   f"{_base_label(e.path)}={e.base_model}  data={e.data_sha256[:12]}  "
                   f"P@1={held.get('P@1')}  P@3={held.get('P@3')}  "
                   f"ECE={held.get('ECE')}  "
                   f"{e.status}")  # `promoted` stays true after a rollback: the registry's history says more
        then = e.metrics.get("production_on_same_split") or {}
        if then:
            typer.echo(f"      production then, on the same {then.get('queries')} held-out queries: "
                       f"P@1={then.get('P@1')}  P@3={then.get('P@3')}  ECE={then.get('ECE')}")
        if e.note:
            typer.echo(f"      gate: {e.note}")
    if override:
        typer.echo(f"* EVIDENTIA_CLASSIFIER_MODEL={override}  in use: it overrides the registry's production")
    else:
        typer.echo(f"{' ' if in_production else '*'} default  {SHIPPED_MODEL_DIR.name}, shipped with Evidentia  "
                   + ("in use when no version is in production" if in_production else "in use"))


def _base_label(model_dir: Path) -> str:
    """"base" for a fine-tuned model; a features model's is the embedding model its features read."""
    from evidentia.reranker.classifier_model import ModelMetadata

    try:
        kind = ModelMetadata.read(model_dir).extra.get("kind", "lora")
    except Exception:  # noqa: BLE001 (a version whose files are gone still gets its line)
        return "base"
    return "embeddings" if kind == "features" else "base"


@models_app.command("promote")
def models_promote(version: str = typer.Argument(..., help="A registered version, or `default` for the default "
                                                "model (the shipped one, or EVIDENTIA_CLASSIFIER_MODEL).")):
    """Put a registered model in production (the API switches without a restart)."""
    from evidentia.console import EXIT_BAD_INPUT, Context, fail
    from evidentia.reranker.model_registry import RegistryError, registry_for

    ctx = Context()
    registry = registry_for(ctx.settings.data_dir)
    if version == "default":
        try:
            before = registry.production()
            registry.use_default(reason="the default model, by hand")
        except RegistryError as exc:
            raise fail(str(exc), EXIT_BAD_INPUT)
        if before is None:
            typer.echo("the default model was already in use: nothing changed")
        else:
            typer.echo(f"the default model is in use (`evidentia models rollback` puts {before.version} back)")
        _say_override(ctx.settings)
        return
    try:
        before = registry.production()
        known = [e.version for e in registry.entries()]
        if version not in known:
            shown = ", ".join(known[-10:]) if known else "none yet (`evidentia retrain` registers one)"
            raise RegistryError(f"unknown model version {version!r}; registered: {shown}")
        entry = registry.promote(version, reason="promoted by hand")
    except RegistryError as exc:
        raise fail(str(exc), EXIT_BAD_INPUT)
    if before is not None and before.version == entry.version:
        typer.echo(f"{entry.version} was already in production: nothing changed")
        return
    _say_override(ctx.settings)
    if "production kept" in entry.note:  # the gate's words when it kept the candidate out
        typer.echo(f"note: the retrain gate had kept it out: {entry.note}", err=True)
    undo = f"`evidentia models rollback` puts {before.version if before else 'the default model'} back"
    typer.echo(f"{entry.version} is in production ({undo})")


@models_app.command("rollback")
def models_rollback():
    """Go back to the model that was in production before the current one."""
    from evidentia.console import EXIT_BAD_INPUT, Context, fail
    from evidentia.reranker.model_registry import RegistryError, registry_for

    ctx = Context()
    try:
        entry = registry_for(ctx.settings.data_dir).rollback()
    except RegistryError as exc:
        raise fail(str(exc), EXIT_BAD_INPUT)
    typer.echo(f"{entry.version} is in production" if entry else "back to the default model")
    _say_override(ctx.settings)


def _say_override(settings) -> None:
    """Searches read EVIDENTIA_CLASSIFIER_MODEL before the registry (resolve_model_dir)."""
    if settings.classifier_model:
        typer.echo(f"note: EVIDENTIA_CLASSIFIER_MODEL={settings.classifier_model} overrides the registry: searches "
                   "keep using it until it is unset", err=True)
