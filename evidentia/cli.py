"""The ``evidentia`` command line."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import List, Optional

import typer

from evidentia.config import ConfigError, declared_default
from evidentia.console import (EXIT_BACKEND, EXIT_BAD_INPUT, EXIT_FALLBACK, App, Context, fail, quiet_libraries,
                               warn_about_environment)
from evidentia.text import listed

app = App(add_completion=False, no_args_is_help=True, help="Find the PDF pages that support a supplier's answer.")


def _print_version(asked: bool) -> None:
    """`--version`: the installed package's version, from its metadata (the one pip reports)."""
    if not asked:
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("evidentia")
    except PackageNotFoundError:  # run from a source tree that was never installed
        installed = "unknown (not installed)"
    typer.echo(f"evidentia {installed}")
    raise typer.Exit()


@app.callback()
def main_options(verbose: bool = typer.Option(False, "--verbose", "-v",
                                              help="Also show third-party progress bars and warnings."),
                 version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                              help="Print the version and exit.")):
    quiet_libraries(verbose)
    warn_about_environment()


TENANT_HELP = ("Tenant whose documents these are, as the API sees them (default: 'default'; "
               "`evidentia keys create --tenant default` gives the API access to them).")


def _library(ctx: Context):
    from evidentia.library import Library

    ctx.backend  # noqa: B018 (opens it, or fails with the right exit code)
    return Library(ctx.engine)


def _tenant(library, tenant: Optional[str]) -> str:
    from evidentia.library import LibraryError

    try:
        return library.tenant(tenant)
    except LibraryError as exc:
        raise fail(f"--tenant: {exc}")


def _index(ctx: Context, paths: list[Path], tenant: Optional[str] = None, kept: bool = True) -> int:
    """``kept``: the documents stay in the data directory (the demo's do not), so say where."""
    from evidentia.indexing import find_pdfs
    from evidentia.retriever.dense import EmbeddingError
    from evidentia.tenants import split_internal_id

    library = _library(ctx)
    tenant = _tenant(library, tenant)
    files, _ = find_pdfs(paths)
    # an upload that failed or is still queued was not indexed: indexing it replaces nothing
    before = {d.document_id for d in library.documents(tenant) if d.status == "ready"} if files else set()
    if files:
        ctx.ocr  # noqa: B018 (probes Tesseract: a bad EVIDENTIA_OCR_LANGUAGES fails before any work)
    if ctx.engine.indexing_embedder is not None and files:
        typer.echo(f"loading the embedding model ({ctx.settings.dense_model})…", err=True)
        try:
            ctx.engine.load_embedder()  # a bad EVIDENTIA_DENSE_MODEL fails before any work
        except EmbeddingError as exc:
            raise fail(f"{exc} (EVIDENTIA_DENSE=off indexes without embeddings)")
    summary = library.index(tenant, paths)
    for failure in summary.failures:
        typer.echo(f"error: {failure.reason}", err=True)
    for cost in (summary.ocr_line(), summary.embedding_line()):
        if cost:
            typer.echo(cost, err=True)
    if not files and not summary.failures:
        shown = ", ".join(str(p) for p in paths)
        typer.echo(f"no PDF found in {shown} (files ending in .pdf, folders searched recursively)", err=True)
    typer.echo(summary.line())
    # a file's id is its name's (README): a document of the same id indexed before is replaced
    ids = [split_internal_id(d)[1] for d in summary.doc_ids]
    new = [i for i in ids if i not in before]
    if new and kept:
        # ids are made from file names ("Foot Locker 8K (May).PDF" is Foot-Locker-8K-May), and
        # every later command takes one: only `evidentia docs` showed them
        typer.echo(f"document id(s): {listed(new)} (what search --doc, page and delete take)", err=True)
    replaced = [i for i in ids if i in before]
    if replaced:
        shown = listed(replaced)
        typer.echo(f"replaced {len(replaced)} document(s) indexed before under the same id: {shown}", err=True)
    if summary.documents and kept:
        typer.echo(f"tenant {tenant}: `evidentia docs --tenant {tenant}` lists them; an API key of this tenant "
                   "sees them too", err=True)
    return EXIT_BAD_INPUT if summary.failures or not files else 0


@app.command()
def index(paths: List[Path] = typer.Argument(..., help="PDF files or folders (searched recursively)."),
          tenant: Optional[str] = typer.Option(None, "--tenant", help=TENANT_HELP)):
    """Index PDFs page by page. Re-indexing a file replaces the document of the same id (its stem)."""
    from evidentia.retriever.base import BackendError

    ctx = Context(batch=True)
    try:
        code = _index(ctx, paths, tenant)
    except BackendError as exc:
        raise fail(str(exc), EXIT_BACKEND)
    raise typer.Exit(code)


@app.command()
def search(
    doc: List[str] = typer.Option(..., "--doc", metavar="ID", help="Document id to search in (repeatable)."),
    question: str = typer.Option(..., "--question", "-q", help="The questionnaire's question."),
    answer: str = typer.Option("", "--answer", "-a", help="The supplier's answer, to check against the pages "
                               "(optional: without it the question alone is searched)."),
    tenant: Optional[str] = typer.Option(None, "--tenant", help=TENANT_HELP),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="Candidate pool size (default EVIDENTIA_POOL_SIZE, "
                                      f"{declared_default('pool_size')})."),
    reranker: Optional[str] = typer.Option(None, "--reranker", help="none, llm, classifier or cosine "
                                           f"(default EVIDENTIA_DEFAULT_RERANKER, {declared_default('default_reranker')})."),
    stage: Optional[str] = typer.Option(None, "--stage", help="First stage: bm25, dense or hybrid "
                                        "(default EVIDENTIA_STAGE, hybrid; bm25 with EVIDENTIA_DENSE=off)."),
    threshold: Optional[float] = typer.Option(None, "--threshold", help="Drop pages whose relevance probability is "
                                              "below T (classifier; default EVIDENTIA_CLASSIFIER_THRESHOLD, "
                                              f"{declared_default('classifier_threshold')})."),
    strict: bool = typer.Option(False, "--strict", help=f"Exit with code {EXIT_FALLBACK} when the reranker could not "
                                "rank and the first-stage order was returned instead."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
):
    """Rank the pages of the given documents for a question and its answer."""
    from evidentia.retriever.base import BackendError, MissingVectorsError, UnknownDocumentError
    from evidentia.retriever.dense import EmbeddingError
    from evidentia.retriever.embed_cli import missing_vectors_note

    ctx = Context()
    if not question.strip():
        raise fail("--question is empty")
    ctx.check_text(question, answer)
    config = ctx.config(stage=stage, reranker=reranker, threshold=threshold, pool_size=top_k)
    library = _library(ctx)
    tenant = _tenant(library, tenant)
    try:
        result = ctx.engine.search(question, answer, library.resolve(tenant, doc), config)
    except (ConfigError, EmbeddingError) as exc:
        raise fail(str(exc))
    except UnknownDocumentError as exc:
        raise fail(_unknown_documents_message(library, tenant, _external(exc.doc_ids), "--doc"), EXIT_BAD_INPUT)
    except MissingVectorsError as exc:  # a stage asked for; the default one falls back to bm25
        raise fail(str(MissingVectorsError(_external(exc.doc_ids), tenant)), EXIT_BACKEND)
    except BackendError as exc:
        raise fail(str(exc), EXIT_BACKEND)
    stage_note = (missing_vectors_note(_external(result.without_vectors), tenant) if result.without_vectors
                  else result.meaning_only_note)
    if stage_note:
        typer.echo(f"warning: {stage_note}", err=True)
    note = result.note
    if result.fallback_reason:
        from evidentia.reranker.llm_runtime import FALLBACK_SUFFIX

        # the reason ends by saying the first-stage order was returned, which this line says already
        typer.echo(f"warning: the {result.reranker} reranker could not rank, so the {config.stage} order is "
                   f"shown: {result.fallback_reason.removesuffix(FALLBACK_SUFFIX)}", err=True)
    if as_json:
        typer.echo(json.dumps({"pages": [
            {"document_id": _external([p.doc_id])[0], "page": p.page, "score": round(p.score, 6),
             **({"probability": round(p.probability, 6)} if p.probability is not None else {}),
             "snippet": p.snippet}
            for p in result.pages
        ], "tenant": tenant, "stage": result.stage, "stage_note": stage_note, "reranker": result.reranker,
            # the API's /v1/validate field: which classifier model scored (null for other rerankers)
            "model_version": result.model_version, "threshold": config.threshold,
            "fallback": result.fallback_reason is not None, "fallback_reason": result.fallback_reason,
            "candidates": len(result.candidates), "note": note}, ensure_ascii=False))
    else:
        if note:
            typer.echo(note)
        for rank, p in enumerate(result.pages, 1):
            if p.probability is not None and p.probability == p.score:
                value = f"p={p.probability:.3f}"  # the classifier's score is its probability: one number
            else:
                value = f"score {p.score:7.3f}" + (f" p={p.probability:.2f}" if p.probability is not None else "")
            typer.echo(f"{rank:>3}. {_external([p.doc_id])[0]}  p.{p.page:<4} {value}  {p.snippet[:160]}")
    if strict and result.fallback_reason:
        raise typer.Exit(EXIT_FALLBACK)


def _unknown_documents_message(library, tenant: str, unknown: list[str], option: str | None = None) -> str:
    """Why documents of ``tenant`` cannot be searched: an upload the API is still
    indexing, or one that failed, is not unknown, and nor is one of another tenant.
    ``option``: the repeatable option that named them (search's --doc)."""
    from evidentia.retriever.base import UnknownDocumentError

    why = {d: library.why_unsearchable(tenant, d) for d in unknown}
    parts = [w for w in why.values() if w]
    elsewhere, covered = library.elsewhere(tenant, [d for d in unknown if not why[d]])
    if elsewhere:
        parts.append(elsewhere)
    rest = [d for d in unknown if not why[d] and d not in covered]
    if rest:
        parts.append(f"{UnknownDocumentError(rest)}; `evidentia docs` lists the indexed ones")
        parts += _file_name_hints(library, tenant, rest)
        parts += _typo_hints(library, tenant, rest, option)
    return "; ".join(parts)


def _file_name_hints(library, tenant: str, names: list[str]) -> list[str]:
    """For a file's name typed for its id ("Rapport durabilité 2023.pdf"), the id it has, and
    the tenant to name where another tenant holds it."""
    from evidentia.store import document_id_for

    owners: dict[str, list[str]] = {}
    for d in library.documents():
        owners.setdefault(d.document_id, []).append(d.tenant)
    hints = []
    for name in names:
        as_id = document_id_for(name)
        held = owners.get(as_id, [])
        if as_id == name or not held:
            continue
        where = "" if tenant in held else f", in tenant {held[0]}: add --tenant {held[0]}"
        hints.append(f"{name!r} is a file's name: its document id is {as_id}{where}")
    return hints


def _typo_hints(library, tenant: str, names: list[str], option: str | None = None) -> list[str]:
    """For ids that are near ids of ``tenant``'s documents: ids joined by commas ("A,B")
    where ``option`` takes one id a time, and typos, in case too ("3M_2018_10k" for
    "3M_2018_10K"), with the closest id, the one `eval` would suggest."""
    from evidentia.store import closest_document_id, document_id_for

    everyone = library.documents()
    mine = [d.document_id for d in everyone if d.tenant == tenant]
    held = {d.document_id for d in everyone}
    hints = []
    for name in names:
        ids = [i.strip() for i in name.split(",") if i.strip()]
        if len(ids) > 1:
            # most of them known (or half): a list the option does not split, not one id with a comma
            if option and 2 * len(set(ids) & set(mine)) >= len(ids):
                repeated = " ".join(f"{option} {i}" for i in ids)
                hints.append(f"{name!r} is {len(ids)} ids: repeat {option} for each ({repeated})")
            continue
        as_id = document_id_for(name)
        if as_id != name and as_id in held:
            continue  # a file's name, whose id _file_name_hints gives
        close = closest_document_id(name, mine)
        if close is not None:
            hints.append(f"the indexed id closest to {name} is {close}")
    return hints


def _external(doc_ids) -> list[str]:
    from evidentia.tenants import split_internal_id

    return [split_internal_id(d)[1] for d in doc_ids]


@app.command()
def docs(tenant: Optional[str] = typer.Option(None, "--tenant", help="Only this tenant's documents "
                                              "(default: every tenant's)."),
         as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")):
    """List documents with their tenant and page counts, and the status of uploads not searchable yet."""
    ctx = Context()
    library = _library(ctx)
    if tenant is not None:
        _tenant(library, tenant)
    found = library.documents(tenant)
    if as_json:
        typer.echo(json.dumps({"documents": [
            {"tenant": d.tenant, "document_id": d.document_id, "status": d.status, "reason": d.reason, "pages": d.pages,
             "empty_pages": d.empty_pages, "languages": d.languages, "ocr_pages": d.ocr_pages,
             "unread_pages": d.unread_pages, "ocr_confidence": d.ocr_confidence}
            for d in found
        ]}))
        return
    if not found:
        typer.echo("no document indexed" + (f" for tenant {tenant}" if tenant else ""))
        # a second terminal without the first one's `export EVIDENTIA_DATA_DIR=...` read another,
        # empty, data directory and said only this
        typer.echo(f"(data directory {ctx.settings.data_dir}; EVIDENTIA_DATA_DIR names another)", err=True)
        return
    scans = any(d.ocr_pages or d.unread_pages for d in found)  # OCR columns only where there are scans
    # a status column only where an upload is not searchable (queued, indexing, failed)
    statuses = any(d.status != "ready" for d in found)
    typer.echo("tenant\tdocument\tpages\tempty\tlanguages (pages with text)"
               + ("\tOCR pages (confidence)\tunread scans" if scans else "") + ("\tstatus" if statuses else ""))
    for d in found:
        langs = ", ".join(f"{k}:{v}" for k, v in d.languages.items()) or "-"
        line = f"{d.tenant}\t{d.document_id}\t{d.pages}\t{d.empty_pages}\t{langs}"
        if scans:
            conf = f" ({d.ocr_confidence:.0f})" if d.ocr_confidence is not None else ""
            line += f"\t{d.ocr_pages}{conf}\t{d.unread_pages}"
        if statuses:
            line += f"\t{d.status}" + (f": {d.reason or 'no reason recorded'}" if d.status == "failed" else "")
        typer.echo(line)
    if statuses:
        typer.echo("documents not ready cannot be searched: the API is still indexing the queued and indexing "
                   "ones; index a failed one again (an upload, or `evidentia index --tenant TENANT FILE`) once its "
                   "problem is fixed", err=True)
    if any(d.empty_pages for d in found):
        typer.echo("empty pages have no extractable text (blank pages, and scans not read): they have no "
                   "language and are not searched", err=True)
    if any(d.unread_pages for d in found):
        typer.echo("unread scans: pages that show a scan but were not read (EVIDENTIA_OCR=off, Tesseract missing "
                   "or over EVIDENTIA_OCR_TIMEOUT_S); index them again with OCR on", err=True)


@app.command()
def delete(doc_id: str = typer.Argument(..., help="Document id (as `evidentia docs` lists it)."),
           tenant: Optional[str] = typer.Option(None, "--tenant", help=TENANT_HELP)):
    """Remove a document, its pages, its file and the feedback on it."""
    ctx = Context()
    library = _library(ctx)
    tenant = _tenant(library, tenant)
    if not library.delete(tenant, doc_id):
        elsewhere, _ = library.elsewhere(tenant, [doc_id])
        raise fail(elsewhere or "; ".join([f"unknown document id: {doc_id} (tenant {tenant}); `evidentia docs` lists "
                                           "every tenant's documents", *_file_name_hints(library, tenant, [doc_id])]),
                   EXIT_BAD_INPUT)
    typer.echo(f"deleted {doc_id}")


@app.command()
def page(doc_id: str = typer.Argument(..., help="Document id (as `evidentia docs` lists it)."),
         number: int = typer.Argument(..., min=1, help="Page number, 1-based as a PDF viewer numbers it and as "
                                      "`search` prints it."),
         tenant: Optional[str] = typer.Option(None, "--tenant", help=TENANT_HELP),
         as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")):
    """Print a page's text as indexed: what search and the rerankers read (a scan's OCR text)."""
    from evidentia.retriever.base import BackendError

    ctx = Context()
    library = _library(ctx)
    tenant = _tenant(library, tenant)
    (indexed_id,) = library.resolve(tenant, [doc_id])
    try:
        info = ctx.engine.backend.get_document(indexed_id)
        found = ctx.engine.backend.get_page(indexed_id, number) if info is not None else None
    except BackendError as exc:
        raise fail(str(exc), EXIT_BACKEND)
    if info is None:
        raise fail(_unknown_documents_message(library, tenant, [doc_id]), EXIT_BAD_INPUT)
    if found is None:
        raise fail(f"{doc_id} has {info.pages} page{'s' if info.pages != 1 else ''}: there is no page {number}",
                   EXIT_BAD_INPUT)
    if as_json:
        typer.echo(json.dumps({"tenant": tenant, "document_id": doc_id, "page": number, "pages": info.pages,
                               "language": found.language, "text_source": found.text_source,
                               "ocr_confidence": found.ocr_confidence, "text": found.text}, ensure_ascii=False))
        return
    read = {"text": "its text layer", "ocr": "OCR", "unread": "nothing: it shows something that was not read",
            "none": "nothing: blank"}.get(found.text_source, found.text_source)
    confidence = f", confidence {found.ocr_confidence:.0f}" if found.ocr_confidence is not None else ""
    typer.echo(f"{doc_id} p.{number} of {info.pages} ({found.language or 'language unknown'}; read from "
               f"{read}{confidence})\n")
    typer.echo(found.text)


@app.command()
def demo(keep: bool = typer.Option(False, "--keep", help="Index the sample into EVIDENTIA_DATA_DIR and keep it "
                                   "there (default: a temporary folder, removed afterwards).")):
    """Generate a small multilingual sample report, index it and answer one question."""
    from evidentia.samples import SAMPLE_ANSWER, SAMPLE_QUESTION, write_sample_report

    with tempfile.TemporaryDirectory(prefix="evidentia-demo-") as tmp:
        # the demo leaves nothing behind unless told: its index lives in the temporary folder
        ctx = Context(batch=True) if keep else Context(batch=True, data_dir=Path(tmp) / "data")
        pdf = write_sample_report(Path(tmp) / f"{DEMO_DOCUMENT}.pdf")
        _index(ctx, [pdf], kept=keep)
        library = _library(ctx)
        # the stage `evidentia search` uses by default, so that the two agree
        result = ctx.engine.search(SAMPLE_QUESTION, SAMPLE_ANSWER, library.resolve(None, [DEMO_DOCUMENT]),
                                   ctx.config(reranker="none", pool_size=3))
        typer.echo(f"\nQ: {SAMPLE_QUESTION}\nA: {SAMPLE_ANSWER}\n")
        ranked_by = ("BM25 (the sample's pages have no embeddings: EVIDENTIA_DENSE=off)" if result.without_vectors
                     else STAGE_WORDS.get(result.stage, result.stage))
        typer.echo(f"The best pages, ranked by {ranked_by}:")
        for rank, c in enumerate(result.candidates, 1):
            typer.echo(f"{rank}. page {c.page} (score {c.score:.4g}, {c.language}): {c.snippet[:200]}")
        library.close()
        ctx.engine.close()
        where = (f"kept in {ctx.settings.data_dir}: search it with `evidentia search --doc {DEMO_DOCUMENT} -q "
                 f"\"...\"`, remove it with `evidentia delete {DEMO_DOCUMENT}`" if keep
                 else "indexed in a temporary folder, now removed; `evidentia demo --keep` keeps it")
        typer.echo(f"\nThe sample report was {where}. Your own files: `evidentia index FOLDER`.", err=True)


DEMO_DOCUMENT = "acme-sustainability-2023"
STAGE_WORDS = {"hybrid": "hybrid (BM25 and dense retrieval fused; score: 1/(60 + rank) summed)",
               "bm25": "BM25",
               "dense": "dense retrieval (the cosine of question and page)"}


def main() -> None:
    try:
        app()
    except OSError as exc:
        # a file or folder the command needs (EVIDENTIA_DATA_DIR, a report): one line, not a traceback
        where = f": {exc.filename}" if exc.filename else ""
        typer.echo(f"error: {exc.strerror or exc}{where}", err=True)
        raise SystemExit(1) from None


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

from evidentia.retriever.embed_cli import embed_command  # noqa: E402

app.command("embed")(embed_command)
app.add_typer(keys_app, name="keys")


if __name__ == "__main__":
    main()
