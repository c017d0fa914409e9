"""Upload, list, inspect, delete documents; page text and page images."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import time
import uuid
from pathlib import Path, PurePosixPath
from typing import Annotated

from fastapi import APIRouter, Depends, File, Form, Path as PathParam, Query, Request, Response, UploadFile
from fastapi.concurrency import run_in_threadpool
from pydantic import BeforeValidator

from evidentia.api.deps import Caller, get_services, require_backend, require_tenant, run_blocking
from evidentia.api.errors import (NO_FILE_MESSAGE, ApiError, backend_unavailable, errors, file_too_large,
                                  insufficient_storage, out_of_space)
from evidentia.api.highlight import MAX_HIGHLIGHT_CHARS, MAX_TERMS, highlight_terms
from evidentia.api.rendering import PageRenderer, RenderRefused
from evidentia.tenants import internal_id
from evidentia.api.schemas import (
    DOCUMENT_ID_PATTERN, UNSAFE_TEXT_CHARS, DocumentAccepted, DocumentList, DocumentOut, IndexingProgress, PageOut,
)
from evidentia.api.services import Services
from evidentia.store import DOCUMENT_ID_RE, DocumentRow, document_id_for
from evidentia.retriever.base import BackendError

log = logging.getLogger("evidentia.api")

router = APIRouter(prefix="/v1/documents", tags=["documents"])

CHUNK = 1 << 20
RENDER_SLOT_WAIT_S = 5.0  # a page image over the render caps waits this long for a slot, then 429/503
PNG_MIN_WIDTH, PNG_MAX_WIDTH = 50, 2000

DocumentId = PathParam(..., description="Your document id.", examples=["acme-2023"], pattern=DOCUMENT_ID_PATTERN)


def _plain_digits(value):
    # int() reads "1_0" as 10 and " 1" or "+1" as 1: one page, many URLs (and caches)
    if isinstance(value, str) and not (value.isascii() and value.isdigit()):
        raise ValueError("a page number is plain decimal digits, e.g. 3")
    return value


# a path parameter may have no default, so the routes taking it make it keyword-only (after `*`)
PageNumber = Annotated[int, PathParam(ge=1, description="1-based page number."), BeforeValidator(_plain_digits)]


def to_out(row: DocumentRow, services: Services | None = None) -> DocumentOut:
    indexing = row.status == "indexing" or row.next_status == "indexing"  # a re-upload reports its progress too
    progress = services.worker.progress(row.tenant, row.document_id) if services and indexing else None
    ocr_done, backlog = services.worker.ocr_progress(row.tenant, row.document_id) if services and indexing \
        else (0, None)
    if progress is None and (ocr_done or backlog):  # still extracting: OCR of a scan
        progress = (0, backlog.pages if backlog else 0)
    return DocumentOut(document_id=row.document_id, status=row.status, reason=row.reason, filename=row.filename,
                       progress=IndexingProgress(pages_done=progress[0], pages_total=progress[1], ocr_pages=ocr_done,
                                                 ocr_pages_left=backlog.left if backlog else None)
                       if progress else None,
                       size_bytes=row.size_bytes, pages=row.pages, empty_pages=row.empty_pages,
                       languages=row.languages, ocr_pages=row.ocr.get("ocr_pages"),
                       ocr_confidence=row.ocr.get("ocr_confidence"), unread_pages=row.ocr.get("unread_pages"),
                       caption_only_pages=row.ocr.get("caption_only_pages"),
                       unread_reason=row.ocr.get("unread_reason"), created=row.created, updated=row.updated,
                       reindex_status=row.next_status, reindex_reason=row.next_reason)


def find_document(services: Services, caller: Caller, document_id: str) -> DocumentRow:
    """The caller's document, or 404: another tenant's document is 'not found' too,
    so existence never leaks across tenants."""
    row = services.store.get_document(caller.tenant, document_id)
    if row is None:
        raise ApiError(404, "document_not_found", f"no document {document_id!r}; GET /v1/documents lists yours",
                       {"document_id": document_id})
    return row


def require_ready(row: DocumentRow) -> None:
    if row.status != "ready":
        raise ApiError(409, "document_not_ready", not_ready_message(row),
                       {"document_id": row.document_id, "status": row.status, "reason": row.reason})


def not_ready_message(row: DocumentRow) -> str:
    if row.status == "failed":
        return f"document {row.document_id} failed: {row.reason}"
    waiting = "is still indexing" if row.status == "indexing" else "is still queued for indexing"
    return f"document {row.document_id} {waiting}; poll GET /v1/documents/{row.document_id}"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _count_pages_in_child(path: str) -> int | None:
    import pymupdf

    try:
        with pymupdf.open(path, filetype="pdf") as doc:
            return None if doc.needs_pass else doc.page_count
    except Exception:
        return None


def _count_pages(services: Services, path: Path) -> int | None:
    """Page count if PyMuPDF opens the file; None when it cannot (the indexing
    worker then reports the precise reason as the document's failure). Opened in
    a bounded child: a hostile file's repair must not stall this process."""
    from evidentia.indexer.worker import BoundedCall, WorkFailed

    settings = services.settings
    try:
        return BoundedCall(_count_pages_in_child, (str(path),), timeout_s=settings.render_timeout_s,
                           memory_mb=settings.render_memory_mb, what="page count",
                           setting="EVIDENTIA_RENDER").run()
    except WorkFailed:
        return None


# a file system's longest name: a 2,000-character name was stored and listed as it came
MAX_SHOWN_NAME_CHARS = 255


def _file_name(filename: str | None) -> str:
    """The file's name without the client's folders ("../../r.pdf", "C:\\Users\\r.pdf"),
    control or bidi characters (the rule of schemas.UNSAFE_TEXT_CHARS): what its document id
    is made from, as `evidentia index` makes it from the file's name."""
    return UNSAFE_TEXT_CHARS.sub("", PurePosixPath((filename or "").replace("\\", "/")).name)


def _shown_name(name: str) -> str:
    """A file's name as stored and listed: cut to MAX_SHOWN_NAME_CHARS, its extension kept.
    Only the shown name is cut: the id comes from the whole name, whose hash tells two
    long names apart (cut first, two 300-character names shared an id, and the second
    upload replaced the first)."""
    if len(name) > MAX_SHOWN_NAME_CHARS:
        suffix = PurePosixPath(name).suffix[:16]
        name = name[:MAX_SHOWN_NAME_CHARS - len(suffix) - 1] + "…" + suffix
    return name


def _accept_upload(services: Services, caller: Caller, upload: UploadFile, document_id: str | None) -> DocumentRow:
    settings = services.settings
    name = _file_name(upload.filename)
    filename = _shown_name(name)
    if document_id is not None and document_id != "":
        if not DOCUMENT_ID_RE.match(document_id):
            raise ApiError(422, "validation_error", f"document_id {document_id!r}: use 1-128 ASCII letters, "
                           f"digits, '.', '_' or '-', starting with a letter or digit",
                           [{"loc": ["body", "document_id"], "message": "invalid document id", "type": "value_error"}])
    else:
        document_id = document_id_for(name)
    tenant_dir = services.uploads / caller.tenant
    tenant_dir.mkdir(parents=True, exist_ok=True)
    generation = uuid.uuid4().hex
    tmp = tenant_dir / f".tmp-{generation}.pdf"
    final_dir = tenant_dir / generation
    size = 0
    try:
        with open(tmp, "wb") as out:
            upload.file.seek(0)
            while chunk := upload.file.read(CHUNK):
                size += len(chunk)
                if size > settings.max_upload_bytes:
                    raise file_too_large(settings.max_upload_bytes)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        if size == 0:
            raise ApiError(400, "empty_file", "the uploaded file is empty")
        with open(tmp, "rb") as fh:
            head = fh.read(1024)
        if b"%PDF-" not in head:
            raise ApiError(415, "not_a_pdf", f"{filename or 'the upload'} is not a PDF (no %PDF- header); "
                           f"only PDF files can be indexed", {"content_type": upload.content_type})
        pages = _count_pages(services, tmp)
        if pages is not None and pages > settings.max_pages:
            raise ApiError(413, "too_many_pages", f"the PDF has {pages} pages, over the limit of {settings.max_pages} "
                           f"(EVIDENTIA_MAX_PAGES); split it into several documents",
                           {"pages": pages, "max_pages": settings.max_pages})
        final_dir.mkdir()
        final = final_dir / f"{document_id}.pdf"
        os.replace(tmp, final)
        _fsync_dir(final_dir)
        _fsync_dir(tenant_dir)
        row, superseded = services.store.put_document(caller.tenant, document_id, filename or final.name,
                                                      size, str(final), generation)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        shutil.rmtree(final_dir, ignore_errors=True)
        if out_of_space(exc):  # was a 500 and a traceback, twice in the log
            log.error("upload of %s:%s refused: %s", caller.tenant, document_id, exc)
            raise insufficient_storage() from None
        raise
    # earlier uploads that will never be served: stop their extraction, drop their files
    # (a ready version being replaced is not among them: it is served until the new one is ready)
    services.worker.cancel(caller.tenant, document_id, [g for g, _ in superseded])
    for old_generation, old_path in superseded:
        if Path(old_path).parent != final_dir:
            shutil.rmtree(Path(old_path).parent, ignore_errors=True)
        services.renderer.forget(caller.tenant, old_generation)
    services.worker.submit(caller.tenant, document_id, generation)
    return row


@router.post(
    "", status_code=202, response_model=DocumentAccepted, response_model_exclude_none=True,
    summary="Upload a PDF for indexing",
    description="Stores the PDF and answers at once; indexing runs in the background. Poll "
                "GET /v1/documents/{document_id} until `status` is `ready` (or `failed`, with a `reason`). "
                "Uploading an id again replaces the document; a `ready` document keeps being served until "
                "the new file is indexed (`reindex_status`), and stays as it was if the new file fails "
                "(`reindex_status` `failed`, `reindex_reason`).",
    responses=errors(400, 401, 413, 415, 422, 429, 507),
)
async def upload_document(
    request: Request,
    response: Response,
    file: UploadFile = File(..., description="The PDF."),
    document_id: str | None = Form(None, description="Id for the document (default: the file name's stem)."),
    caller: Caller = Depends(require_tenant),
    services: Services = Depends(get_services),
) -> DocumentAccepted:
    form = await request.form()  # parsed already: the form is cached
    if len(form.getlist("file")) > 1:
        raise ApiError(422, "validation_error", "one file per upload: send each PDF in a request of its own",
                       [{"loc": ["body", "file"], "message": "more than one file", "type": "value_error"}])
    if len(form.getlist("document_id")) > 1:  # the last one silently won
        raise ApiError(422, "validation_error", "one document_id per upload: the form has several",
                       [{"loc": ["body", "document_id"], "message": "more than one value", "type": "value_error"}])
    if not document_id and not _file_name(file.filename):
        # `filename=""` (or only folders): its id would be the hash of "", one for every such
        # upload, each replacing the last; the same answer as a part without a file name
        raise ApiError(422, "validation_error", f"body.file: {NO_FILE_MESSAGE}",
                       [{"loc": ["body", "file"], "message": NO_FILE_MESSAGE, "type": "missing"}])
    row = await services.upload_slots.run(caller.tenant, _accept_upload, services, caller, file, document_id)
    response.headers["Location"] = f"/v1/documents/{row.document_id}"
    return DocumentAccepted(document_id=row.document_id, status=row.status if row.next_generation else "queued",
                            reindex_status=row.next_status)


@router.get("", response_model=DocumentList, summary="List your documents", responses=errors(401, 429))
def list_documents(caller: Caller = Depends(require_tenant),
                   services: Services = Depends(get_services)) -> DocumentList:
    return DocumentList(documents=[to_out(r, services) for r in services.store.list_documents(caller.tenant)])


@router.get("/{document_id}", response_model=DocumentOut, summary="A document's status and page statistics",
            responses=errors(401, 404, 429))
def get_document(document_id: str = DocumentId, caller: Caller = Depends(require_tenant),
                 services: Services = Depends(get_services)) -> DocumentOut:
    return to_out(find_document(services, caller, document_id), services)


@router.delete("/{document_id}", status_code=204, response_class=Response,
               summary="Delete a document from the index, the store and the disk",
               responses=errors(401, 404, 429, 503))
def delete_document(document_id: str = DocumentId, caller: Caller = Depends(require_tenant),
                    services: Services = Depends(get_services)) -> Response:
    backend = require_backend(services)
    with services.doc_lock(caller.tenant, document_id):  # never interleaves with the indexing worker's write
        row = services.store.delete_document(caller.tenant, document_id)
        if row is None:
            raise ApiError(404, "document_not_found", f"no document {document_id!r}; GET /v1/documents lists yours",
                           {"document_id": document_id})
        try:
            backend.delete_document(internal_id(caller.tenant, document_id))
        except BackendError as exc:
            # the document is gone for the tenant; the orphan pages are swept at the next start
            log.warning("deleted %s:%s from the store but not from the index: %s", caller.tenant, document_id, exc)
    services.worker.cancel(caller.tenant, document_id)  # kills its extraction, if one runs
    shutil.rmtree(Path(row.file_path).parent, ignore_errors=True)
    if row.next_file_path:
        shutil.rmtree(Path(row.next_file_path).parent, ignore_errors=True)
    for generation in (row.generation, row.next_generation):
        if generation:
            services.renderer.forget(caller.tenant, generation)
    return Response(status_code=204)


def _page_number(row: DocumentRow, page: int) -> None:
    require_ready(row)
    if not 1 <= page <= (row.pages or 0):
        raise ApiError(404, "page_not_found", f"document {row.document_id} has pages 1 to {row.pages}, not {page}",
                       {"document_id": row.document_id, "page": page, "pages": row.pages})


async def _rendered(renderer: PageRenderer, tenant: str, row: DocumentRow, page: int, width: int,
                    terms: list[str] | None) -> bytes:
    """The cached PNG, or one rendered in a slot. Slots are taken here, in the
    event loop: a request over the caps waits without holding a thread (the web
    page loads three thumbnails at once), looking again for the image another
    request may have rendered meanwhile, and gets the 429/503 once it has waited
    RENDER_SLOT_WAIT_S."""
    waited_until = time.monotonic() + RENDER_SLOT_WAIT_S
    while True:
        png = await run_in_threadpool(renderer.cached, tenant, row.generation, page, width, terms)
        if png is not None:
            return png
        try:
            with renderer.slot(tenant):
                return await run_in_threadpool(renderer.render, tenant, row.generation, row.file_path, page, width,
                                               terms)
        except RenderRefused as exc:
            if exc.status not in (429, 503) or time.monotonic() >= waited_until:
                raise
        await asyncio.sleep(0.1)


# A page image is a tenant's own, of one version of a document: a browser may keep it but
# must ask again each time (the key is checked, a re-upload or a revoked key is noticed),
# and never answer one key's request with what another key got (the web page fetches
# with the X-API-Key header, the same URL for every tenant). An unchanged image costs a 304.
PRIVATE_REVALIDATED = {"Cache-Control": "private, no-cache", "Vary": "X-API-Key, Authorization"}


def _page_etag(tenant: str, row: DocumentRow, page: int, width: int, terms: list[str] | None) -> str:
    """A strong ETag of the image: whose, which upload (its generation), what was asked."""
    key = "\x1f".join([tenant, row.document_id, row.generation, str(page), str(width), *(terms or [])])
    return '"' + hashlib.sha256(key.encode()).hexdigest()[:32] + '"'


def _etag_matches(if_none_match: str | None, etag: str) -> bool:
    """If-None-Match against ``etag`` (the weak comparison RFC 9110 asks for here)."""
    if not if_none_match:
        return False
    if if_none_match.strip() == "*":
        return True
    return any(tag.strip().removeprefix("W/") == etag for tag in if_none_match.split(","))


# Declared before the text route: "/pages/3.png" must not reach "/pages/{page}".
@router.get(
    "/{document_id}/pages/{page}.png", summary="A page rendered as PNG",
    response_class=Response,
    responses={200: {"content": {"image/png": {}}, "description": "The page as a PNG image."},
               **errors(401, 404, 409, 422, 429, 503)},
)
async def page_png(
    request: Request,
    *,
    document_id: str = DocumentId,
    page: PageNumber,
    width: int = Query(800, ge=PNG_MIN_WIDTH, le=PNG_MAX_WIDTH, description="Image width in pixels."),
    highlight: str | None = Query(None, max_length=MAX_HIGHLIGHT_CHARS,
                                  description="Words to mark on the page, e.g. the query's keywords (numbers "
                                  "match as normalised, `12450` marks `12,450`; words by their first six "
                                  f"letters; at most {MAX_TERMS} terms)."),
    caller: Caller = Depends(require_tenant),
    services: Services = Depends(get_services),
) -> Response:
    row = await run_in_threadpool(find_document, services, caller, document_id)
    _page_number(row, page)
    renderer, terms = services.renderer, highlight_terms(highlight)
    headers = {**PRIVATE_REVALIDATED, "ETag": _page_etag(caller.tenant, row, page, width, terms)}
    if _etag_matches(request.headers.get("if-none-match"), headers["ETag"]):
        return Response(status_code=304, headers=headers)
    try:
        png = await _rendered(renderer, caller.tenant, row, page, width, terms)
    except RenderRefused as exc:
        if exc.code == "document_changed":  # deleted meanwhile: gone, not worth a retry (404)
            await run_in_threadpool(find_document, services, caller, document_id)
        retry = {"Retry-After": str(exc.retry_after)} if exc.retry_after else None
        raise ApiError(exc.status, exc.code, str(exc), {"document_id": document_id, "page": page},
                       headers=retry) from None
    return Response(content=png, media_type="image/png", headers=headers)


@router.get("/{document_id}/pages/{page}", response_model=PageOut, summary="A page's text and language",
            responses=errors(401, 404, 409, 422, 429, 503, 504))
async def page_text(
    *,
    document_id: str = DocumentId,
    page: PageNumber,
    caller: Caller = Depends(require_tenant),
    services: Services = Depends(get_services),
) -> PageOut:
    def read_page():
        # A re-upload's swap changes the index and then the row, under doc_lock: read apart, a row
        # of 14 pages met an index of 9 (409 for a healthy document) or the new version's text
        # was shown under the old row. The page is read outside the lock (page reads run side by
        # side, and not behind every index write), then the row is read again under it: a swap
        # in between, the page is read again under the lock.
        backend = require_backend(services)
        row = find_document(services, caller, document_id)
        _page_number(row, page)
        found = backend.get_page(internal_id(caller.tenant, document_id), page)
        with services.doc_lock(caller.tenant, document_id):
            current = find_document(services, caller, document_id)
            if current.generation == row.generation:
                return found
            _page_number(current, page)
            return backend.get_page(internal_id(caller.tenant, document_id), page)

    try:
        found = await run_blocking(services, read_page)
    except BackendError as exc:
        raise backend_unavailable(exc) from None
    if found is None:
        raise ApiError(409, "document_gone", f"page {page} of {document_id} is not in the index; upload the "
                       f"document again", {"document_id": document_id, "page": page})
    return PageOut(document_id=document_id, page=page, text=found.text, language=found.language,
                   char_count=found.char_count, text_source=found.text_source, ocr_confidence=found.ocr_confidence)
