"""Analysts' judgements on the pages of validated documents (those a validation returned,
or any other page of a document it searched), and their export as training records."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from evidentia.api.deps import Caller, get_services, require_backend, require_tenant, run_blocking
from evidentia.api.errors import ApiError, backend_unavailable, errors
from evidentia.tenants import internal_id
from evidentia.api.schemas import ErrorResponse, FeedbackOut, FeedbackRequest
from evidentia.api.services import Services
from evidentia.retriever.base import BackendError
from evidentia.store import MAX_PAGES_BEYOND_RESULTS, MAX_VERDICTS_PER_PAGE, FeedbackRefused
from evidentia.training.dataset import TrainingRecord

router = APIRouter(prefix="/v1/feedback", tags=["feedback"])


def _check(services: Services, caller: Caller, body: FeedbackRequest):
    validation = services.store.get_validation(caller.tenant, body.validation_id)
    if validation is None:
        raise ApiError(404, "validation_not_found", f"no validation {body.validation_id!r} (it is the "
                       f"validation_id POST /v1/validate answered)", {"validation_id": body.validation_id})
    # any page of a document the validation searched, not only those it returned: the page an
    # analyst found the evidence on by reading further is the label the next model needs most
    if body.document_id not in validation.document_ids:
        raise ApiError(422, "document_not_in_validation", f"document {body.document_id} was not searched by "
                       f"validation {body.validation_id}; it searched {', '.join(validation.document_ids)}",
                       {"document_ids": list(validation.document_ids)})
    return validation


@router.post(
    "", status_code=201, response_model=FeedbackOut, summary="Record whether a page supports the answer",
    description="Answers 201 once the judgement is committed to disk. The page is one the validation returned, "
                "or any other page of a document it searched (evidence the analyst found by reading further). "
                "One judgement per (validation, page, "
                "analyst): sending it again replaces it (a new `feedback_id`, and it moves to the end of the "
                "export). The page's text is kept with it, so the export stays valid if the document is later "
                f"uploaded again. At most {MAX_VERDICTS_PER_PAGE} analysts' judgements per page of a validation.",
    responses={
        **errors(400, 401, 404, 409, 415, 422, 429, 503),
        409: {"model": ErrorResponse, "description": (
            "The document was deleted since the validation (`document_gone`), or uploaded again and re-indexed "
            "(`document_changed`: its pages are another file's; validate again), or the page already has "
            f"{MAX_VERDICTS_PER_PAGE} analysts' judgements in this validation (`too_many_verdicts`), or the "
            f"validation has verdicts on {MAX_PAGES_BEYOND_RESULTS} pages it did not return (`too_many_pages`).")},
        422: {"model": ErrorResponse, "description": (
            "A field is missing or wrong, the document was not searched by the validation "
            "(`document_not_in_validation`), or it has no such page (`page_out_of_range`).")},
    },
)
async def post_feedback(body: FeedbackRequest, caller: Caller = Depends(require_tenant),
                        services: Services = Depends(get_services)) -> FeedbackOut:
    validation = await run_in_threadpool(_check, services, caller, body)
    backend = require_backend(services)
    gone = ApiError(409, "document_gone", f"document {body.document_id} was deleted or replaced since the "
                    f"validation; its page {body.page} is no longer indexed",
                    {"document_id": body.document_id, "page": body.page})

    def read_page():
        # under doc_lock, the lock the indexing worker switches a document's pages (index) and
        # generation (store) under, and delete removes both under: the text and the generation
        # read here belong together, which add_feedback's check needs
        with services.doc_lock(caller.tenant, body.document_id):
            doc = services.store.get_document(caller.tenant, body.document_id)
            if doc is None:
                return None, None, None
            return backend.get_page(internal_id(caller.tenant, body.document_id), body.page), doc.generation, doc

    try:
        page, generation, doc = await run_blocking(services, read_page)
    except BackendError as exc:
        raise backend_unavailable(exc) from None
    searched = (validation.generations or {}).get(body.document_id)
    # the version searched, ready: a re-upload queued, indexing or failed has no page count yet
    if (page is None and doc is not None and searched in (None, doc.generation) and doc.status == "ready"
            and doc.pages is not None and body.page > doc.pages):
        raise ApiError(422, "page_out_of_range", f"document {body.document_id} has {doc.pages} page(s), not "
                       f"{body.page}", {"document_id": body.document_id, "pages": doc.pages})
    if page is None:
        raise gone
    try:
        # stored after run_blocking returns: a request that timed out (504) leaves nothing behind
        row = await run_in_threadpool(services.store.add_feedback, caller.tenant, body.validation_id,
                                      body.document_id, body.page, body.relevant, (body.analyst or "").strip(),
                                      page.text, generation)
    except FeedbackRefused as exc:
        if exc.code == "document_gone":
            raise gone from None
        if exc.code == "validation_not_found":  # checked above; kept for the store's own check
            raise ApiError(404, exc.code, str(exc), {"validation_id": body.validation_id}) from None
        details = {"document_id": body.document_id, "page": body.page, "validation_id": body.validation_id}
        if exc.code == "too_many_verdicts":
            details["limit"] = MAX_VERDICTS_PER_PAGE
        elif exc.code == "too_many_pages":
            details["limit"] = MAX_PAGES_BEYOND_RESULTS
        raise ApiError(409, exc.code, str(exc), details) from None
    return FeedbackOut(feedback_id=row.id, validation_id=row.validation_id, document_id=row.document_id,
                       page=row.page, relevant=row.relevant, analyst=row.analyst or None, created=row.created)


@router.get(
    "/export", summary="Export your feedback as JSONL training records",
    description="One JSON object per line, in the format of `evidentia train` (training/dataset.py): "
                "`question`, `answer`, `page_text`, `relevance` (0|1), `doc_id`, `page`, `source` = `feedback`; "
                "in the order of the judgements' last changes (`evidentia retrain` reads a tie between "
                "analysts by it).",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/x-ndjson": {}}, "description": "JSONL training records."},
               **errors(401, 429)},
)
def export_feedback(caller: Caller = Depends(require_tenant),
                    services: Services = Depends(get_services)) -> StreamingResponse:
    def lines():
        for f in services.store.iter_feedback(caller.tenant):
            record = TrainingRecord(question=f.question, answer=f.answer, page_text=f.page_text,
                                    relevance=int(f.relevant), doc_id=f.document_id, page=f.page, source="feedback")
            yield record.to_json() + "\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson",
                             headers={"Content-Disposition": f'attachment; filename="feedback-{caller.tenant}.jsonl"'})
