"""`evidentia embed`: add page embeddings to documents that are already indexed.

Documents indexed with EVIDENTIA_DENSE=off (or before dense retrieval existed, or
with another EVIDENTIA_DENSE_MODEL) have no usable vectors, so the hybrid stage
searches them with bm25. This command embeds their pages from the text stored
in the index - no PDF is opened again - and writes each document back with its
vectors (the same all-or-nothing write as indexing).

Only typer is imported at module level: evidentia/cli.py registers this command
at import time, and `evidentia --help` must stay cheap.
"""

from __future__ import annotations

from dataclasses import replace
from typing import List, Optional

import typer

# Documents are embedded together until this many pages: windows of small
# documents share batches, and a crash loses at most one group's work.
GROUP_PAGES = 256


def embed_command(
    doc: Optional[List[str]] = typer.Option(None, "--doc", help="Document id to embed (repeatable; default: "
                                            "every indexed document without vectors of EVIDENTIA_DENSE_MODEL)."),
    again: bool = typer.Option(False, "--all", help="Embed again documents that already have vectors of this model."),
):
    """Add page embeddings to indexed documents from their stored page text (no re-extraction)."""
    import sys
    import time

    from tqdm import tqdm

    from evidentia.cli import EXIT_BACKEND, EXIT_BAD_INPUT, Context, fail
    from evidentia.retriever.base import BackendError
    from evidentia.retriever.dense import EmbeddingError

    ctx = Context()
    try:
        backend = ctx.backend
        wanted = list(dict.fromkeys(doc)) if doc else [d.doc_id for d in backend.list_documents()]
        models = backend.vector_models(wanted)
    except BackendError as exc:
        raise fail(str(exc), EXIT_BACKEND)
    unknown = [d for d in wanted if d not in models]
    if unknown:
        raise fail(f"unknown document id(s): {', '.join(unknown)}; `evidentia docs` lists the indexed ones",
                   EXIT_BAD_INPUT)
    embedder = ctx.embedder
    todo = [d for d in wanted if again or models[d] != embedder.name]
    for d in wanted:
        if d not in todo:
            typer.echo(f"{d}: already embedded with {embedder.name} (--all embeds it again)", err=True)
    if not todo:
        typer.echo("nothing to embed")
        return
    try:
        embedder.load()  # a bad EVIDENTIA_DENSE_MODEL fails before any work
    except EmbeddingError as exc:
        raise fail(str(exc))

    t0 = time.perf_counter()
    done_docs = done_pages = 0
    infos = {i.doc_id: i for i in backend.list_documents() if i.doc_id in set(todo)}
    total = sum(i.pages for i in infos.values())
    with tqdm(total=total, unit="page", desc="embedding", file=sys.stderr, disable=None) as bar:
        group: list = []

        def flush() -> None:
            nonlocal done_docs, done_pages
            if not group:
                return
            vectors = embedder.embed_documents([d.pages for d in group], on_progress=bar.update)
            backend.index_documents(replace(d, vectors=v) for d, v in zip(group, vectors))
            done_docs += len(group)
            done_pages += sum(d.page_count for d in group)
            group.clear()

        try:
            for doc_id in todo:
                document = backend.stored_document(doc_id)
                if document is None:  # deleted since the listing
                    typer.echo(f"error: {doc_id}: no longer indexed", err=True)
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
