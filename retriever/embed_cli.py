"""`evidentia embed`: add page embeddings to documents that are already indexed.

Documents indexed with EVIDENTIA_DENSE=off (or before dense retrieval existed, or
with another EVIDENTIA_DENSE_MODEL) have no usable vectors, so the default
hybrid stage searches them with bm25. This command embeds their pages from the
text stored in the index - no PDF is opened again - and writes each document
back with its vectors (the same all-or-nothing write as indexing).

Only typer is imported at module level: evidentia/cli.py registers this command
at import time, and `evidentia --help` must stay cheap.
"""

from __future__ import annotations

from dataclasses import replace
from typing import List, Optional, Sequence

import typer

from evidentia.text import listed

# Documents are embedded together until this many pages: windows of small
# documents share batches, and a crash loses at most one group's work.
GROUP_PAGES = 256


def missing_vectors_note(document_ids: Sequence[str], tenant: str | None = None) -> str:
    """What the CLI says when the default stage searched documents without vectors with bm25."""
    from evidentia.retriever.base import embed_command_line

    shown = listed(document_ids, 5)
    return (f"searched with bm25: no page embeddings for {shown} (indexed with EVIDENTIA_DENSE=off or before "
            f"dense retrieval); `{embed_command_line(document_ids[:5], tenant)}` adds them from the indexed text, then "
            f"searches use the hybrid stage")


def embed_command(
    doc: Optional[List[str]] = typer.Option(None, "--doc", metavar="ID", help="Document id to embed (repeatable; "
                                            "default: every indexed document without vectors of "
                                            "EVIDENTIA_DENSE_MODEL)."),
    tenant: Optional[str] = typer.Option(None, "--tenant", help="Tenant of the --doc ids, or whose documents to "
                                         "embed (default for --doc: the tenant `default`; without --doc: all)."),
    again: bool = typer.Option(False, "--all", help="Embed again documents that already have vectors of this model."),
):
    """Add page embeddings to indexed documents from their stored page text (no re-extraction)."""
    import time

    from evidentia.console import EXIT_BACKEND, EXIT_BAD_INPUT, Context, fail
    from evidentia.library import Library, LibraryError
    from evidentia.progress import Progress
    from evidentia.retriever.base import BackendError
    from evidentia.retriever.dense import EmbeddingError
    from evidentia.tenants import split_internal_id

    def shown(doc_id: str) -> str:
        return (split_internal_id(doc_id) or ("", doc_id))[1]

    ctx = Context(batch=True)
    backend = ctx.backend
    library = Library(ctx.engine)
    try:
        if doc:
            wanted = library.resolve(tenant, list(dict.fromkeys(doc)))
        else:
            owner = library.tenant(tenant) if tenant else None
            wanted = [d.doc_id for d in backend.list_documents()
                      if owner is None or (split_internal_id(d.doc_id) or (None,))[0] == owner]
        models = backend.vector_models(wanted)
    except LibraryError as exc:
        raise fail(f"--tenant: {exc}")
    except BackendError as exc:
        raise fail(str(exc), EXIT_BACKEND)
    unknown = [shown(d) for d in wanted if d not in models]
    if unknown:
        # one of another tenant is not unknown: say which tenant to name
        elsewhere, covered = library.elsewhere(library.tenant(tenant), unknown) if doc else (None, [])
        rest = [d for d in unknown if d not in covered]
        parts = [elsewhere] if elsewhere else []
        if rest:
            parts.append(f"unknown document id(s): {', '.join(rest)}; `evidentia docs` lists the indexed ones")
        raise fail("; ".join(parts), EXIT_BAD_INPUT)
    embedder = ctx.embedder
    todo = [d for d in wanted if again or models[d] != embedder.name]
    # one line for them all, not one each: twelve documents said it twelve times
    done = [shown(d) for d in wanted if d not in todo]
    if done:
        typer.echo(f"{len(done)} document(s) already embedded with {embedder.name} ({listed(done, 5)}; --all embeds "
                   "them again)", err=True)
    if not todo:
        typer.echo("nothing to embed")
        return
    try:
        ctx.engine.load_embedder()  # a bad EVIDENTIA_DENSE_MODEL fails before any work
    except EmbeddingError as exc:
        raise fail(str(exc))

    t0 = time.perf_counter()
    done_docs = done_pages = 0
    failed = False
    infos = {i.doc_id: i for i in backend.list_documents() if i.doc_id in set(todo)}
    progress = Progress(total=sum(i.pages for i in infos.values()), unit="page", desc="embedding",
                        every_s=ctx.settings.progress_interval_s)
    group: list = []

    def flush() -> None:
        nonlocal done_docs, done_pages
        if not group:
            return
        vectors = embedder.embed_documents([d.pages for d in group], on_progress=progress.update)
        backend.index_documents(replace(d, vectors=v) for d, v in zip(group, vectors))
        done_docs += len(group)
        done_pages += sum(d.page_count for d in group)
        group.clear()

    try:
        with progress:
            for doc_id in todo:
                document = backend.stored_document(doc_id)
                if document is None:  # deleted since the listing
                    typer.echo(f"error: {shown(doc_id)}: no longer indexed", err=True)
                    failed = True
                    continue
                group.append(document)
                if sum(d.page_count for d in group) >= GROUP_PAGES:
                    flush()
            flush()
    except BackendError as exc:
        raise fail(str(exc), EXIT_BACKEND)
    seconds = time.perf_counter() - t0
    rate = done_pages / seconds if seconds > 0 else 0.0
    typer.echo(f"embedded {done_docs} document(s), {done_pages} page(s) in {seconds:.1f} s ({rate:.1f} pages/s) "
               f"with {embedder.name} ({embedder.runtime})")
    if failed:
        raise typer.Exit(EXIT_BAD_INPUT)
