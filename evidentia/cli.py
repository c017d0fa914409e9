"""The ``evidentia`` command line."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import List, Optional

import typer

from evidentia.config import ConfigError
from evidentia.console import EXIT_BACKEND, EXIT_BAD_INPUT, Context, fail

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Find the PDF pages that support a supplier's answer.")


def _index(ctx: Context, paths: list[Path]) -> int:
    from evidentia.indexing import find_pdfs
    from evidentia.retriever.dense import EmbeddingError

    files, _ = find_pdfs(paths)
    embedder = ctx.engine.indexing_embedder if files else None
    if embedder is not None:
        try:
            ctx.engine.load_embedder()  # a bad EVIDENTIA_DENSE_MODEL fails before any work
        except EmbeddingError as exc:
            raise fail(f"{exc} (EVIDENTIA_DENSE=off indexes without embeddings)")
    ctx.backend  # noqa: B018 (opens it, or fails with the right exit code)
    summary = ctx.engine.index_paths(paths)
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
    reranker: Optional[str] = typer.Option(None, "--reranker", help="none, llm or classifier "
                                           "(default EVIDENTIA_DEFAULT_RERANKER, none)."),
    stage: Optional[str] = typer.Option(None, "--stage", help="First stage: bm25, dense or hybrid "
                                        "(default EVIDENTIA_STAGE, bm25)."),
    threshold: Optional[float] = typer.Option(None, "--threshold", help="Drop pages whose relevance probability is "
                                              "below T (classifier; default EVIDENTIA_CLASSIFIER_THRESHOLD, 0.15)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
):
    """Rank the pages of the given documents for a question and its answer."""
    from evidentia.retriever.base import BackendError, UnknownDocumentError
    from evidentia.retriever.dense import EmbeddingError

    ctx = Context()
    if not question.strip():
        raise fail("--question is empty")
    config = ctx.config(stage=stage, reranker=reranker, threshold=threshold, pool_size=top_k)
    try:
        ctx.backend  # noqa: B018 (opens it, or fails with the right exit code)
        result = ctx.engine.search(question, answer, doc, config)
    except (ConfigError, EmbeddingError) as exc:
        raise fail(str(exc))
    except UnknownDocumentError as exc:
        raise fail(f"{exc}; `evidentia docs` lists the indexed ones", EXIT_BAD_INPUT)
    except BackendError as exc:
        raise fail(str(exc), EXIT_BACKEND)
    if result.fallback_reason:
        typer.echo(f"warning: {result.fallback_reason}", err=True)
    if as_json:
        typer.echo(json.dumps({"pages": [
            {"doc_id": p.doc_id, "page": p.page, "score": round(p.score, 6),
             **({"probability": round(p.probability, 6)} if p.probability is not None else {}),
             "snippet": p.snippet}
            for p in result.pages
        ], "reranker": result.reranker, "fallback_reason": result.fallback_reason}, ensure_ascii=False))
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
    from evidentia.samples import SAMPLE_ANSWER, SAMPLE_QUESTION, write_sample_report

    ctx = Context()
    with tempfile.TemporaryDirectory() as tmp:
        pdf = write_sample_report(Path(tmp) / "acme-sustainability-2023.pdf")
        _index(ctx, [pdf])
    result = ctx.engine.search(SAMPLE_QUESTION, SAMPLE_ANSWER, ["acme-sustainability-2023"],
                               ctx.config(stage="bm25", reranker="none", pool_size=3))
    typer.echo(f"\nQ: {SAMPLE_QUESTION}\nA: {SAMPLE_ANSWER}\n")
    for rank, c in enumerate(result.candidates, 1):
        typer.echo(f"{rank}. page {c.page} (score {c.score:.2f}, {c.language}): {c.snippet[:200]}")


def main() -> None:
    app()


# Each package's commands live beside it and are registered here so that
# `evidentia --help` lists everything in one place. They import what they share
# from evidentia.console, never from this module, so there is no import cycle.
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
app.add_typer(keys_app, name="keys")


if __name__ == "__main__":
    main()
