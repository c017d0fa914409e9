"""POST /v1/validate: question + answer + documents -> supporting pages."""

from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool

from evidentia.api.deps import Caller, deadline, get_services, require_backend, require_tenant, run_blocking
from evidentia.api.errors import ApiError, errors
from evidentia.api.indexing import internal_id, split_internal_id
from evidentia.api.routers.documents import not_ready_message
from evidentia.api.schemas import ErrorResponse, ValidatedPage, ValidateRequest, ValidateResponse
from evidentia.api.services import Services, default_threshold, model_version
from evidentia.api.store import ValidationRow, now
from evidentia.config import ConfigError
from evidentia.pipeline import Pipeline
from evidentia.reranker.registry import reranker_names
from evidentia.retriever.base import BackendError, MissingVectorsError, UnknownDocumentError, VectorModelError

router = APIRouter(tags=["validation"])


def _limits(services: Services, body: ValidateRequest) -> tuple[list[str], int, str, str]:
    """Checks the limits that depend on settings (the static ones are in the schema)."""
    s = services.settings
    problems: list[dict] = []

    def problem(field: str, message: str) -> None:
        problems.append({"loc": ["body", field], "message": message, "type": "value_error"})

    if not body.question.strip():
        problem("question", "must not be blank")
    if len(body.question) > s.max_question_chars:
        problem("question", f"at most {s.max_question_chars} characters (got {len(body.question)})")
    if len(body.answer) > s.max_answer_chars:
        problem("answer", f"at most {s.max_answer_chars} characters (got {len(body.answer)})")
    document_ids = list(dict.fromkeys(body.document_ids))
    if len(document_ids) > s.max_documents_per_validation:
        problem("document_ids", f"at most {s.max_documents_per_validation} documents per validation "
                f"(got {len(document_ids)})")
    top_k = body.top_k if body.top_k is not None else s.pool_size
    if top_k > s.max_top_k:
        problem("top_k", f"at most {s.max_top_k} (got {top_k})")
    name = (body.reranker or s.default_reranker).strip().lower()
    if name not in reranker_names():
        problem("reranker", f"unknown reranker {name!r}; choose one of {', '.join(reranker_names())}")
    elif body.threshold is not None and name == "none":
        problem("threshold", "a threshold needs a reranker that outputs probabilities (e.g. classifier)")
    stage = body.stage or s.stage
    if stage != "bm25" and not s.dense:
        source = "" if body.stage else " (the server's default, EVIDENTIA_STAGE)"
        problem("stage", f"the {stage} stage{source} needs dense retrieval, which is off on this server: "
                "enable it with EVIDENTIA_DENSE=on (and upload the documents again so that their pages get "
                "embeddings), or send \"stage\": \"bm25\"")
    if problems:
        raise ApiError(422, "validation_error", "; ".join(f"{'.'.join(p['loc'])}: {p['message']}" for p in problems),
                       problems)
    return document_ids, top_k, name, stage


def _external(doc_ids) -> list[str]:
    return [(split_internal_id(d) or ("", d))[1] for d in doc_ids]


@router.post(
    "/v1/validate", response_model=ValidateResponse, summary="Find the pages that support an answer",
    description="Retrieves a candidate pool of `top_k` pages from the given documents with the first `stage` "
                "(`bm25`, `dense` or `hybrid`; default EVIDENTIA_STAGE), then reranks it. Every document must be "
                "yours and `ready`. The `validation_id` of the answer is what POST /v1/feedback refers to.\n\n"
                "`dense` and `hybrid` need EVIDENTIA_DENSE=on on the server (422 `validation_error` on `stage` "
                "otherwise), and documents whose pages were embedded when they were uploaded: a document uploaded "
                "while EVIDENTIA_DENSE was off answers 409 `missing_vectors` (upload it again, or use `bm25`), "
                "one embedded with another EVIDENTIA_DENSE_MODEL 409 `vector_model_mismatch`.",
    responses={
        **errors(400, 401, 404, 409, 422, 429, 503, 504),
        409: {"model": ErrorResponse, "description": (
            "A document is not ready (`document_not_ready`), is gone from the index (`document_gone`), or, for the "
            "`dense` and `hybrid` stages, has no page embeddings because it was uploaded while EVIDENTIA_DENSE was "
            "off (`missing_vectors`) or was embedded with another model (`vector_model_mismatch`).")},
        422: {"model": ErrorResponse, "description": (
            "A field is missing, has the wrong type or is outside its limits; an unknown `stage`, or `dense` / "
            "`hybrid` while the server runs with EVIDENTIA_DENSE=off.")},
        503: {"model": ErrorResponse, "description": (
            "Not ready yet, or the search engine, the reranker or the embedding model (`dense`, `hybrid`) is "
            "unavailable.")},
    },
)
async def validate(body: ValidateRequest, caller: Caller = Depends(require_tenant),
                   services: Services = Depends(get_services)) -> ValidateResponse:
    document_ids, top_k, name, stage = _limits(services, body)
    rows = await run_in_threadpool(services.store.get_documents, caller.tenant, document_ids)
    missing = [d for d in document_ids if d not in rows]
    if missing:
        raise ApiError(404, "document_not_found", f"no document {', '.join(missing)}; GET /v1/documents lists yours",
                       {"document_ids": missing})
    not_ready = [rows[d] for d in document_ids if rows[d].status != "ready"]
    if not_ready:
        raise ApiError(409, "document_not_ready", "; ".join(not_ready_message(r) for r in not_ready),
                       [{"document_id": r.document_id, "status": r.status, "reason": r.reason} for r in not_ready])
    backend = require_backend(services)
    threshold = default_threshold(services.settings, name, body.threshold)
    until = deadline(services)
    question, answer = body.question.strip(), body.answer.strip()

    def work():
        t0 = time.perf_counter()
        try:
            reranker = services.rerankers.get(name, threshold)
        except ConfigError as exc:
            raise ApiError(503, "reranker_unavailable", f"reranker {name!r} cannot be loaded: {exc}") from None
        embedder = None
        if stage != "bm25":
            try:
                embedder = services.load_embedder()
            except ConfigError as exc:
                raise ApiError(503, "embedder_unavailable", f"the embedding model for the {stage} stage cannot "
                               f"be loaded: {exc}") from None
        t1 = time.perf_counter()
        # stage=None: the server's default, which falls back to bm25 (with a note) on documents without vectors
        pipeline = Pipeline.from_settings(services.settings, backend, services.detector, reranker, stage=body.stage,
                                          embedder=embedder, pool_size=top_k)
        with services.rerankers.gate(name, until) as waited:
            if time.monotonic() > until:
                raise TimeoutError
            result = pipeline.run(question, answer, [internal_id(caller.tenant, d) for d in document_ids])
        timings = {"load": (t1 - t0) * 1000, "queue": waited * 1000, **result.timings_ms,
                   "total": (time.perf_counter() - t0) * 1000}
        return reranker, result, timings

    try:
        reranker, result, timings = await run_blocking(services, work)
    except UnknownDocumentError as exc:
        gone = _external(exc.doc_ids)
        raise ApiError(409, "document_gone", f"document(s) {', '.join(gone)} are missing from the search index; "
                       f"upload them again", {"document_ids": gone}) from None
    except MissingVectorsError as exc:
        without = _external(exc.doc_ids)
        raise ApiError(409, "missing_vectors", f"{MissingVectorsError(without)} (here: upload them again, or send "
                       f"\"stage\": \"bm25\")", {"document_ids": without, "stage": stage}) from None
    except VectorModelError as exc:
        message = str(exc)
        for internal, external in zip(exc.doc_ids, _external(exc.doc_ids)):
            message = message.replace(internal, external)
        raise ApiError(409, "vector_model_mismatch", f"{message} (here: upload them again)",
                       {"document_ids": _external(exc.doc_ids), "stage": stage}) from None
    except BackendError as exc:
        raise ApiError(503, "backend_unavailable", f"search engine error: {exc}") from None

    pages = [
        ValidatedPage(document_id=(split_internal_id(p.doc_id) or ("", p.doc_id))[1], page=p.page,
                      score=round(p.score, 6),
                      probability=None if p.probability is None else round(p.probability, 6), snippet=p.snippet)
        for p in result.pages
    ]
    version = model_version(reranker)
    validation = ValidationRow(
        validation_id=f"val_{uuid.uuid4().hex}", tenant=caller.tenant, question=question, answer=answer,
        document_ids=document_ids, reranker=result.reranker, threshold=threshold, top_k=top_k,
        pages=[{"document_id": p.document_id, "page": p.page, "score": p.score, "probability": p.probability}
               for p in pages],
        model_version=version, fallback_reason=result.fallback_reason, created=now(),
    )
    await run_in_threadpool(services.store.add_validation, validation)
    m = services.metrics
    m.validations.labels(result.reranker).inc()
    m.validation_seconds.labels(result.reranker).observe(timings["total"] / 1000)
    if result.fallback_reason:
        m.fallbacks.labels(result.reranker).inc()
    return ValidateResponse(validation_id=validation.validation_id, pages=pages, reranker=result.reranker,
                            stage=result.stage or stage, stage_note=_stage_note(result.without_vectors),
                            fallback_reason=result.fallback_reason,
                            timings_ms={k: round(v, 2) for k, v in timings.items()}, model_version=version)


def _stage_note(without_vectors) -> str | None:
    """The pipeline's note in the caller's terms (their ids; they upload, not run the CLI)."""
    if not without_vectors:
        return None
    return (f"searched with bm25: document(s) {', '.join(_external(without_vectors))} have no page embeddings "
            f"(uploaded while EVIDENTIA_DENSE was off); upload them again to search them with the hybrid stage")
