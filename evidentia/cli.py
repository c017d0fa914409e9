"""The ``evidentia`` command line."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import List, Optional

import typer

from evidentia.config import ConfigError, Settings

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Find the PDF pages that support a supplier's answer.")

EXIT_BAD_INPUT = 1
EXIT_USAGE = 2
EXIT_BACKEND = 3


def fail(message: str, code: int = EXIT_USAGE) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


class Context:
    """Opened lazily so that `--help` needs no index."""

    def __init__(self) -> None:
        try:
            self.settings = Settings.from_env()
        except ConfigError as exc:
            raise fail(str(exc))
        self._backend = None
        self._detector = None
        self._embedder = None

    @property
    def backend(self):
        if self._backend is None:
            from evidentia.retriever.base import BackendError
            from evidentia.retriever.factory import open_backend

            try:
                self._backend = open_backend(self.settings)
            except ConfigError as exc:
                raise fail(str(exc))
            except BackendError as exc:
                raise fail(str(exc), EXIT_BACKEND)
        return self._backend

    @property
    def detector(self):
        if self._detector is None:
            from evidentia.indexer.language import LanguageDetector

            self._detector = LanguageDetector(probe_chars=self.settings.language_probe_chars)
        return self._detector

    @property
    def embedder(self):
        """The page/query embedder (EVIDENTIA_DENSE_MODEL); its model loads on first use."""
        if self._embedder is None:
            from evidentia.retriever.dense import PageEmbedder

            try:
                self._embedder = PageEmbedder.from_settings(self.settings)
            except ValueError as exc:
                raise fail(f"EVIDENTIA_DENSE_*: {exc}")
        return self._embedder

    @property
    def indexing_embedder(self):
        """The embedder used while indexing, None with EVIDENTIA_DENSE=off."""
        return self.embedder if self.settings.dense else None


def index_missing_documents(ctx: Context, queries, folder: Path) -> None:
    """Index, from ``folder``, the documents of ``queries`` that the index lacks
    (commands that take labelled queries and a PDF folder); each bad PDF and a
    summary line go to stderr."""
    from evidentia.evaluation.runner import index_missing

    summary = index_missing(queries, ctx.backend, ctx.detector, folder, embedder=ctx.indexing_embedder)
    if summary is not None:
        for failure in summary.failures:
            typer.echo(f"error: {failure.reason}", err=True)
        typer.echo(f"indexed from {folder}: {summary.line()}", err=True)


def _index(ctx: Context, paths: list[Path]) -> int:
    from evidentia.indexer.pipeline import find_pdfs, index_paths_with_progress
    from evidentia.retriever.dense import EmbeddingError

    files, _ = find_pdfs(paths)
    embedder = ctx.indexing_embedder
    if embedder is not None and files:
        try:
            embedder.dim  # load the model now: a bad EVIDENTIA_DENSE_MODEL fails before any work
        except EmbeddingError as exc:
            raise fail(f"{exc} (EVIDENTIA_DENSE=off indexes without embeddings)")
    summary = index_paths_with_progress(paths, ctx.backend, ctx.detector, embedder=embedder)
    for failure in summary.failures:
        typer.echo(f"error: {failure.reason}", err=True)
    cost = summary.embedding_line()
    if cost:
        typer.echo(cost, err=True)
    typer.echo(summary.line())
    return EXIT_BAD_INPUT if summary.failures else 0


@app.command()
def index(paths: List[Path] = typer.Argument(..., help="PDF files or folders (searched recursively).")):
    """Index PDFs page by page. Re-indexing a file replaces the document of the same id (its stem)."""
    from evidentia.retriever.base import BackendError

    ctx = Context()
    try:
        code = _index(ctx, paths)
    except BackendError as exc:
        raise fail(str(exc), EXIT_BACKEND)
    raise typer.Exit(code)


@app.command()
def search(
    doc: List[str] = typer.Option(..., "--doc", help="Document id to search in (repeatable)."),
    question: str = typer.Option(..., "--question", "-q"),
    answer: str = typer.Option("", "--answer", "-a"),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="Candidate pool size (default EVIDENTIA_POOL_SIZE, 20)."),
    reranker: str = typer.Option("none", "--reranker", help="none, llm or classifier."),
    stage: Optional[str] = typer.Option(None, "--stage", help="First stage: bm25, dense or hybrid "
                                        "(default EVIDENTIA_STAGE, hybrid; bm25 with EVIDENTIA_DENSE=off)."),
    threshold: Optional[float] = typer.Option(None, "--threshold", help="Drop pages whose relevance probability is "
                                              "below T (classifier; default EVIDENTIA_CLASSIFIER_THRESHOLD, 0.15)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
):
    """Rank the pages of the given documents for a question and its answer."""
    from evidentia.config import STAGES
    from evidentia.pipeline import Pipeline
    from evidentia.reranker.registry import create_reranker
    from evidentia.retriever.base import BackendError, UnknownDocumentError
    from evidentia.retriever.dense import EmbeddingError

    ctx = Context()
    if not question.strip():
        raise fail("--question is empty")
    k = top_k if top_k is not None else ctx.settings.pool_size
    if k <= 0:
        raise fail("--top-k must be a positive integer")
    if threshold is not None and not 0.0 <= threshold <= 1.0:
        raise fail("--threshold must be between 0 and 1")
    if reranker == "classifier" and threshold is None:
        threshold = ctx.settings.classifier_threshold
    if stage is not None and stage not in STAGES:
        raise fail(f"--stage must be one of {', '.join(STAGES)}")
    asked, stage = stage, stage or ctx.settings.stage  # the default stage may fall back to bm25, one asked for not
    try:
        pipeline = Pipeline.from_settings(ctx.settings, ctx.backend, ctx.detector,
                                          create_reranker(reranker, ctx.settings, threshold), stage=asked,
                                          embedder=ctx.embedder if stage != "bm25" else None, pool_size=k)
        result = pipeline.run(question, answer, doc)
    except (ConfigError, EmbeddingError) as exc:
        raise fail(str(exc))
    except UnknownDocumentError as exc:
        raise fail(f"{exc}; `evidentia docs` lists the indexed ones", EXIT_BAD_INPUT)
    except BackendError as exc:
        raise fail(str(exc), EXIT_BACKEND)
    for note in (result.stage_note, result.fallback_reason):
        if note:
            typer.echo(f"warning: {note}", err=True)
    if as_json:
        typer.echo(json.dumps({"pages": [
            {"doc_id": p.doc_id, "page": p.page, "score": round(p.score, 6),
             **({"probability": round(p.probability, 6)} if p.probability is not None else {}),
             "snippet": p.snippet}
            for p in result.pages
        ], "reranker": result.reranker, "fallback_reason": result.fallback_reason, "stage": result.stage,
            "stage_note": result.stage_note}, ensure_ascii=False))
        return
    if not result.pages:
        typer.echo("no matching page")
    for rank, p in enumerate(result.pages, 1):
        prob = f" p={p.probability:.2f}" if p.probability is not None else ""
        typer.echo(f"{rank:>3}. {p.doc_id}  p.{p.page:<4} score {p.score:7.3f}{prob}  {p.snippet[:160]}")


@app.command()
def docs(as_json: bool = typer.Option(False, "--json")):
    """List indexed documents with their page counts."""
    ctx = Context()
    infos = ctx.backend.list_documents()
    if as_json:
        typer.echo(json.dumps({"documents": [
            {"doc_id": d.doc_id, "pages": d.pages, "empty_pages": d.empty_pages, "languages": d.languages}
            for d in infos
        ]}))
        return
    if not infos:
        typer.echo("no document indexed")
    for d in infos:
        langs = ", ".join(f"{k}:{v}" for k, v in d.languages.items()) or "-"
        typer.echo(f"{d.doc_id}\t{d.pages} pages\t{d.empty_pages} empty\t{langs}")


@app.command()
def delete(doc_id: str = typer.Argument(...)):
    """Remove a document and all its pages."""
    ctx = Context()
    if not ctx.backend.delete_document(doc_id):
        raise fail(f"unknown document id: {doc_id}", EXIT_BAD_INPUT)
    typer.echo(f"deleted {doc_id}")


@app.command()
def demo():
    """Generate a small multilingual sample report, index it and answer one question."""
    from evidentia.retriever.query import build_query
    from evidentia.samples import SAMPLE_ANSWER, SAMPLE_QUESTION, write_sample_report

    ctx = Context()
    with tempfile.TemporaryDirectory() as tmp:
        pdf = write_sample_report(Path(tmp) / "acme-sustainability-2023.pdf")
        _index(ctx, [pdf])
    query = build_query(SAMPLE_QUESTION, SAMPLE_ANSWER, ctx.detector)
    typer.echo(f"\nQ: {SAMPLE_QUESTION}\nA: {SAMPLE_ANSWER}\n")
    for rank, c in enumerate(ctx.backend.search(query.keywords, ["acme-sustainability-2023"], 3), 1):
        typer.echo(f"{rank}. page {c.page} (score {c.score:.2f}, {c.language}): {c.snippet[:200]}")


def main() -> None:
    app()


# Evaluation lives in its own package; its command is registered here so that
# `evidentia --help` lists everything in one place. evaluation/cli.py imports
# only typer at module level (and evidentia.cli lazily), so this stays cheap
# and free of import cycles.
from evidentia.evaluation.cli import eval_command  # noqa: E402

app.command("eval")(eval_command)

from evidentia.training.cli import calibrate_command, dataset_command, distill_command, train_command  # noqa: E402

app.command("dataset")(dataset_command)
app.command("train")(train_command)
app.command("calibrate")(calibrate_command)
app.command("distill")(distill_command)

from evidentia.training.models_cli import models_app, retrain_command  # noqa: E402

app.command("retrain")(retrain_command)
app.add_typer(models_app, name="models")

from evidentia.api.cli import keys_app, serve_command  # noqa: E402

app.command("serve")(serve_command)

from evidentia.retriever.embed_cli import embed_command  # noqa: E402

app.command("embed")(embed_command)
app.add_typer(keys_app, name="keys")


if __name__ == "__main__":
    main()
