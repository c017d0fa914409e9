"""A tenant's documents, the same for the CLI and the API.

The search index holds a document's pages under ``"{tenant}:{document_id}"``
(``evidentia.tenants``); the store holds its status, page counts and the PDF the
page images are rendered from. ``evidentia index --tenant T`` writes both, as an
upload through the API does, so a key of tenant T sees the document over HTTP,
and `evidentia docs/search/delete --tenant T` see what was uploaded. Without
``--tenant`` the CLI works on the default tenant (``tenants.DEFAULT_TENANT``):
give an API key to that tenant (`evidentia keys create --tenant default`) to
share CLI-indexed documents with the API.
"""

from __future__ import annotations

import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from evidentia.engine import Engine
from evidentia.store import TENANT_RE, Store, document_id_for, store_path, uploads_dir
from evidentia.tenants import DEFAULT_TENANT, internal_id, split_internal_id
from evidentia.text import listed

if TYPE_CHECKING:  # pragma: no cover - evidentia.indexing imports PyMuPDF (and, through it, onnxruntime):
    from evidentia.indexing import IndexSummary  # a search must not pay for that


class LibraryError(ValueError):
    """A tenant or document id that cannot be used; the message says why."""


@dataclass(frozen=True)
class LibraryDocument:
    tenant: str
    document_id: str
    pages: int
    empty_pages: int
    languages: dict[str, int] = field(default_factory=dict)
    status: str = "ready"  # the store's: ready, or (an API upload) queued, indexing, failed
    reason: str | None = None  # why it failed (status failed)
    ocr_pages: int = 0  # pages read by OCR
    unread_pages: int = 0  # scans that were not read (OCR off, no Tesseract, OCR failed)
    ocr_confidence: float | None = None  # mean over the OCR'd pages, 0-100


class Library:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.settings = engine.settings
        self._store: Store | None = None

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store(store_path(self.settings.data_dir))
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()

    @staticmethod
    def tenant(tenant: str | None) -> str:
        """The tenant named (None: the default one); an empty name is an error, not the
        default tenant (nor, for `docs`, every tenant)."""
        if tenant == "":
            raise LibraryError("the tenant name is empty (leave --tenant out for the tenant 'default')")
        tenant = tenant or DEFAULT_TENANT
        if not TENANT_RE.match(tenant):
            raise LibraryError(f"tenant {tenant!r}: use letters, digits, '_', '.', '-' (at most 64, no ':')")
        return tenant

    # -- indexing ---------------------------------------------------------------
    def index(self, tenant: str | None, paths: Sequence[Path], progress: bool = True) -> "IndexSummary":
        """Index PDFs for ``tenant`` and record them in the store as `ready`, with a
        copy of each file for the page images. A file that fails leaves its
        previous version (if any) as it was."""
        tenant = self.tenant(tenant)
        summary = self.engine.index_paths(paths, progress=progress,
                                          doc_id_of=lambda path: internal_id(tenant, document_id_for(path.name)))
        for doc_id in summary.doc_ids:
            _, document_id = split_internal_id(doc_id)
            self._record(tenant, document_id, summary.sources[doc_id], doc_id, summary.ocr.get(doc_id))
        return summary

    def index_missing(self, doc_ids: Sequence[str], pdf_dir: Path, progress: bool = True) -> "IndexSummary | None":
        """``Engine.index_missing`` (labelled queries name their documents by document id,
        the file name as `evidentia index` makes it), recorded in the store as the default
        tenant's, as `evidentia index` records them: what `eval` and `dataset` index is
        seen by that tenant's API key too."""
        summary = self.engine.index_missing(doc_ids, pdf_dir, progress=progress)
        for doc_id in summary.doc_ids if summary is not None else ():
            tenant, document_id = split_internal_id(doc_id)
            if tenant == DEFAULT_TENANT:
                self._record(tenant, document_id, summary.sources[doc_id], doc_id, summary.ocr.get(doc_id))
        return summary

    def _record(self, tenant: str, document_id: str, source: Path, doc_id: str, ocr: dict | None = None) -> None:
        generation = uuid.uuid4().hex
        folder = uploads_dir(self.settings.data_dir) / tenant / generation
        folder.mkdir(parents=True, exist_ok=True)
        copy = folder / f"{document_id}.pdf"
        shutil.copyfile(source, copy)
        self.store.add_tenant(tenant)
        row, superseded = self.store.put_document(tenant, document_id, source.name, copy.stat().st_size,
                                                  str(copy), generation, replace_ready=True)
        info = self.engine.backend.get_document(doc_id)
        if ocr is None and info is not None:
            ocr = {"ocr_pages": info.ocr_pages, "unread_pages": info.unread_pages,
                   "ocr_confidence": info.ocr_confidence}
        self.store.set_status(tenant, document_id, generation, "ready", pages=info.pages if info else None,
                              empty_pages=info.empty_pages if info else None,
                              languages=info.languages if info else None, ocr=ocr)
        for _, old_path in superseded:
            if Path(old_path).parent != folder:
                shutil.rmtree(Path(old_path).parent, ignore_errors=True)

    # -- reading ----------------------------------------------------------------
    def documents(self, tenant: str | None = None) -> list[LibraryDocument]:
        """The indexed documents of ``tenant`` (None: of every tenant, and those outside any)."""
        wanted = self.tenant(tenant) if tenant else None
        out = []
        for info in self.engine.backend.list_documents():
            owner, document_id = split_internal_id(info.doc_id)
            if wanted is not None and owner != wanted:
                continue
            out.append(LibraryDocument(owner, document_id, info.pages, info.empty_pages, dict(info.languages),
                                       ocr_pages=info.ocr_pages, unread_pages=info.unread_pages,
                                       ocr_confidence=info.ocr_confidence))
        # uploads the index does not hold (yet): queued, indexing, or failed; listed so
        # that `docs` shows every document a tenant has, and why one cannot be searched
        indexed = {(d.tenant, d.document_id) for d in out}
        for row in self._store_documents(wanted):
            if row.status != "ready" and (row.tenant, row.document_id) not in indexed:
                out.append(LibraryDocument(row.tenant, row.document_id, row.pages or 0, row.empty_pages or 0,
                                           dict(row.languages or {}), status=row.status, reason=row.reason))
        return sorted(out, key=lambda d: (d.tenant, d.document_id))

    def _store_documents(self, tenant: str | None):
        # reading must not create the store (and the data directory) where there is none
        if self._store is None and not store_path(self.settings.data_dir).exists():
            return []
        return self.store.list_documents(tenant) if tenant is not None else self.store.all_documents()

    def elsewhere(self, tenant: str | None, document_ids: Sequence[str]) -> tuple[str | None, list[str]]:
        """Of ``document_ids``, which ``tenant`` lacks, those another tenant has: a
        message naming the --tenant to give (None when no other tenant has any), and
        the ids it covers."""
        tenant = self.tenant(tenant)
        wanted = set(document_ids)
        owners: dict[str, list[str]] = {}
        for d in self.documents():
            if d.tenant != tenant and d.document_id in wanted:
                owners.setdefault(d.document_id, []).append(d.tenant)
        # one clause per tenant (or set of tenants): twelve documents of one tenant said
        # "X is in tenant default: add --tenant default" twelve times
        by_owners: dict[tuple[str, ...], list[str]] = {}
        for document_id in (d for d in dict.fromkeys(document_ids) if d in owners):
            by_owners.setdefault(tuple(owners[document_id]), []).append(document_id)
        parts = []
        for found, ids in by_owners.items():
            named = listed(ids)
            verb = "is" if len(ids) == 1 else "are"
            parts.append(f"{named} {verb} in tenant {found[0]}: add --tenant {found[0]}" if len(found) == 1 else
                         f"{named} {verb} in tenants {', '.join(found)}: add --tenant with one of them")
        return ("; ".join(parts) or None), [d for d in document_ids if d in owners]

    def why_unsearchable(self, tenant: str | None, document_id: str) -> str | None:
        """Why a document the index does not hold cannot be searched yet, from the store
        (an upload still queued or indexing, or failed); None when nothing is known of it."""
        row = self.store.get_document(self.tenant(tenant), document_id)
        if row is None or row.status == "ready":
            return None
        if row.status == "failed":
            return f"{document_id} failed to index: {row.reason or 'no reason recorded'}"
        return f"{document_id} is still {row.status}: `evidentia docs` shows when it is ready"

    def resolve(self, tenant: str | None, document_ids: Sequence[str]) -> list[str]:
        """The index ids of a tenant's documents."""
        tenant = self.tenant(tenant)
        return [internal_id(tenant, document_id) for document_id in document_ids]

    # -- removing ---------------------------------------------------------------
    def delete(self, tenant: str | None, document_id: str) -> bool:
        """Remove a document from the index and the store (its file and feedback too)."""
        tenant = self.tenant(tenant)
        removed_index = self.engine.backend.delete_document(internal_id(tenant, document_id))
        row = self.store.delete_document(tenant, document_id)
        if row is not None:
            shutil.rmtree(Path(row.file_path).parent, ignore_errors=True)
        return bool(removed_index or row)

