"""POST /v1/validate: question + answer + documents -> supporting pages."""

from __future__ import annotations

import logging
import time
import uuid

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool

from evidentia.api.deps import Caller, deadline, get_services, require_backend, require_tenant, run_blocking
from evidentia.api.errors import ApiError, backend_unavailable, bounded_echo, errors, without_server_details
from evidentia.tenants import internal_id, split_internal_id
from evidentia.api.routers.documents import not_ready_message
from evidentia.api.schemas import (EarlierVerdict, ErrorResponse, RerankerOption, ValidatedPage, ValidateOptions,
                                   ValidateRequest, ValidateResponse)
from evidentia.api.services import Services
from evidentia.config import ConfigError
from evidentia.engine import RunConfig, RunConfigError, SearchResult
from evidentia.reranker.base import Reranker
from evidentia.reranker.llm_runtime import Deadline, deadline_margin
from evidentia.reranker.registry import reranker_names
from evidentia.store import ValidationRow, now
from evidentia.retriever.base import BackendError, MissingVectorsError, UnknownDocumentError, VectorModelError

router = APIRouter(tags=["validation"])
log = logging.getLogger("evidentia.api")


# How the API names each run option of Engine.config in its errors.
BODY_FIELDS = {"stage": "stage", "reranker": "reranker", "threshold": "threshold", "pool_size": "top_k"}


def _limits(services: Services, body: ValidateRequest) -> tuple[list[str], RunConfig]:
    """Checks the limits that depend on settings (the static ones are in the schema)
    and the run options (through the engine, the one place they are checked)."""
    s = services.settings
    problems: list[dict] = []

    def problem(field: str, message: str) -> None:
        # the engine's messages quote the value sent ("not 'rrr…'", "got 999…"): a prefix of it
        problems.append({"loc": ["body", field], "message": bounded_echo(message), "type": "value_error"})

    try:
        services.engine.check_text(body.question, body.answer)
    except RunConfigError as exc:
        for option, message in exc.problems:
            problem(option, message)
    document_ids = list(dict.fromkeys(body.document_ids))
    if len(document_ids) > s.max_documents_per_validation:
        problem("document_ids", f"at most {s.max_documents_per_validation} documents per validation "
                f"(got {len(document_ids)})")
    config = None
    try:
        config = services.engine.config(stage=body.stage, reranker=body.reranker, threshold=body.threshold,
                                        pool_size=body.top_k)
    except RunConfigError as exc:
        for option, message in exc.problems:
            problem(BODY_FIELDS.get(option, option), message)
    if problems:
        raise ApiError(422, "validation_error", "; ".join(f"{'.'.join(p['loc'])}: {p['message']}" for p in problems),
                       problems)
    return document_ids, config


def _external(doc_ids) -> list[str]:
    return [split_internal_id(d)[1] for d in doc_ids]


def _classifier_problem(settings) -> str | None:
    """Why the classifier's model cannot be loaded (an unreadable registry, a model without
    its files), in the caller's terms; None when its files are there."""
    from evidentia.reranker.classifier_model import METADATA_FILE, ModelLoadError
    from evidentia.reranker.model_registry import resolve_model_dir

    try:
        model = resolve_model_dir(settings)
    except ModelLoadError as exc:
        return without_server_details(str(exc))
    return None if (model / METADATA_FILE).is_file() else "the classifier's model has no files on this server"


@router.get("/v1/validate/options", response_model=ValidateOptions, summary="What POST /v1/validate offers here",
            description="The rerankers (and whether the server can run each), the defaults a request gets and the "
                        "largest `top_k`: what the web page's form offers.", responses=errors(401, 429))
async def validate_options(caller: Caller = Depends(require_tenant),
                           services: Services = Depends(get_services)) -> ValidateOptions:
    s = services.settings
    try:
        defaults = services.engine.config()
    except RunConfigError:  # the default stage needs dense retrieval, off here: requests get a 422 for it too
        defaults = services.engine.config(stage="bm25")
    rerankers = []
    for name in reranker_names():
        note = None
        if name == "llm" and not s.llm_api_key:
            # the LLM needs an endpoint key (openai's client refuses to start without one, a local server too)
            note = ("no LLM is configured on this server (EVIDENTIA_LLM_API_KEY, and EVIDENTIA_LLM_BASE_URL for a "
                    "local one)")
        elif name == "classifier":
            note = await run_in_threadpool(_classifier_problem, s)
        rerankers.append(RerankerOption(name=name, available=note is None, note=note))
    return ValidateOptions(rerankers=rerankers, default_reranker=defaults.reranker, stage=defaults.stage,
                           top_k=defaults.pool_size, max_top_k=s.max_top_k, threshold=s.classifier_threshold)


@router.post(
    "/v1/validate", response_model=ValidateResponse, summary="Find the pages that support an answer",
    description="Retrieves a candidate pool of `top_k` pages from the given documents with the first `stage` "
                "(`bm25`, `dense` or `hybrid`; default EVIDENTIA_STAGE), then reranks it. Every document must be "
                "yours and `ready`. The `validation_id` of the answer is what POST /v1/feedback refers to.\n\n"
                "`dense` and `hybrid` need EVIDENTIA_DENSE=on on the server (422 `validation_error` on `stage` "
                "otherwise), and documents whose pages were embedded when they were uploaded. The server's default "
                "stage (hybrid, no `stage` sent) searches a document uploaded while EVIDENTIA_DENSE was off with "
                "`bm25` and says so (`stage` `bm25`, `stage_note`); a `stage` sent explicitly answers 409 "
                "`missing_vectors` for it (upload it again, or use `bm25`), and one embedded with another "
                "EVIDENTIA_DENSE_MODEL 409 `vector_model_mismatch`.",
    responses={
        **errors(400, 401, 404, 409, 415, 422, 429, 503, 504),
        409: {"model": ErrorResponse, "description": (
            "A document is not ready (`document_not_ready`), is gone from the index (`document_gone`), or, for the "
            "`dense` and `hybrid` stages, has no page embeddings because it was uploaded while EVIDENTIA_DENSE was "
            "off (`missing_vectors`) or was embedded with another model (`vector_model_mismatch`).")},
        422: {"model": ErrorResponse, "description": (
            "A field is missing, has the wrong type or is outside its limits; an unknown `stage`, or `dense` / "
            "`hybrid` while the server runs with EVIDENTIA_DENSE=off.")},
        503: {"model": ErrorResponse, "description": (
            "Not ready yet, or the search engine, the reranker or the embedding model (`dense`, `hybrid`) is "
            "unavailable, or the server is too busy to answer within EVIDENTIA_REQUEST_TIMEOUT_S (`overloaded`, "
            "with Retry-After).")},
    },
)
async def validate(body: ValidateRequest, request: Request, caller: Caller = Depends(require_tenant),
                   services: Services = Depends(get_services)) -> ValidateResponse:
    document_ids, config = _limits(services, body)
    rows = await run_in_threadpool(services.store.get_documents, caller.tenant, document_ids)
    missing = [d for d in document_ids if d not in rows]
    if missing:
        raise ApiError(404, "document_not_found", f"no document {', '.join(missing)}; GET /v1/documents lists yours",
                       {"document_ids": missing})
    not_ready = [rows[d] for d in document_ids if rows[d].status != "ready"]
    if not_ready:
        raise ApiError(409, "document_not_ready", "; ".join(not_ready_message(r) for r in not_ready),
                       [{"document_id": r.document_id, "status": r.status, "reason": r.reason} for r in not_ready])
    require_backend(services)
    engine = services.engine
    until = deadline(services)
    stage = config.stage

    def work():
        try:
            reranker = engine.reranker(config)
        except ConfigError as exc:
            log.warning("reranker %r cannot be loaded: %s", config.reranker, exc)
            raise ApiError(503, "reranker_unavailable", f"reranker {config.reranker!r} cannot be loaded: "
                           f"{without_server_details(str(exc))}") from None
        if stage != "bm25":
            try:
                engine.load_embedder()
            except ConfigError as exc:
                raise ApiError(503, "embedder_unavailable", f"the embedding model for the {stage} stage cannot "
                               f"be loaded: {without_server_details(str(exc))}") from None
        query = engine.query(body.question, body.answer)
        # a reranker that waits on a remote model (the LLM) is handed back, to be awaited
        # outside the shared thread pool (see _rerank_awaited)
        return engine.run_awaiting(query, [internal_id(caller.tenant, d) for d in document_ids], config,
                                   reranker=reranker, deadline=until)

    try:
        result, remote = await run_blocking(services, work, limiter=services.search_slots.limiter(caller.tenant))
    except UnknownDocumentError as exc:
        gone = _external(exc.doc_ids)
        raise ApiError(409, "document_gone", f"document(s) {', '.join(gone)} are missing from the search index; "
                       f"upload them again", {"document_ids": gone}) from None
    except MissingVectorsError as exc:
        without = _external(exc.doc_ids)
        raise ApiError(409, "missing_vectors", f"{MissingVectorsError(without, caller.tenant)} (here: upload them "
                       f"again, or send \"stage\": \"bm25\")", {"document_ids": without, "stage": stage}) from None
    except VectorModelError as exc:
        # the operator's advice (EVIDENTIA_DENSE_MODEL) is not the client's, and a model
        # directory's name is a path on the server
        ids = _external(exc.doc_ids)
        raise ApiError(409, "vector_model_mismatch", f"document(s) {', '.join(ids[:10])} were embedded with model "
                       f"{without_server_details(exc.indexed_with)!r}, but this server now embeds queries with "
                       f"{without_server_details(exc.query_model)!r}: upload them again, or send \"stage\": "
                       f"\"bm25\"", {"document_ids": ids, "stage": stage}) from None
    except BackendError as exc:
        raise backend_unavailable(exc) from None
    if remote is not None:
        result = await _rerank_awaited(services, request, remote, result, until)

    shown = [(split_internal_id(p.doc_id)[1], p.page) for p in result.pages]
    # so that a question validated again shows what the analysts said last time
    earlier = await run_in_threadpool(services.store.earlier_verdicts, caller.tenant, result.query.question,
                                      result.query.answer, [(d, n, p.text) for (d, n), p in zip(shown, result.pages)])
    pages = [
        ValidatedPage(document_id=doc, page=p.page, score=round(p.score, 6),
                      probability=None if p.probability is None else round(p.probability, 6), snippet=p.snippet,
                      earlier_verdicts=[EarlierVerdict(relevant=f.relevant, analyst=f.analyst or None,
                                                       created=f.created) for f in earlier.get((doc, p.page), ())])
        for (doc, _), p in zip(shown, result.pages)
    ]
    version = result.model_version
    timings = result.timings_ms
    # every tenant reads it (and it is stored): a reranker's reason must not carry a server's path or URL
    fallback_reason = without_server_details(result.fallback_reason) if result.fallback_reason else None
    validation = ValidationRow(
        validation_id=f"val_{uuid.uuid4().hex}", tenant=caller.tenant, question=result.query.question,
        answer=result.query.answer, document_ids=document_ids, reranker=result.reranker, threshold=config.threshold,
        top_k=config.pool_size,
        pages=[{"document_id": p.document_id, "page": p.page, "score": p.score, "probability": p.probability}
               for p in pages],
        model_version=version, fallback_reason=fallback_reason, created=now(),
        # the versions read before the search: feedback on a version re-indexed since is refused
        generations={d: rows[d].generation for d in document_ids},
    )
    await run_in_threadpool(services.store.add_validation, validation)
    m = services.metrics
    m.validations.labels(result.reranker).inc()
    m.validation_seconds.labels(result.reranker).observe(timings["total"] / 1000)
    if fallback_reason:
        m.fallbacks.labels(result.reranker).inc()
    return ValidateResponse(validation_id=validation.validation_id, pages=pages, reranker=result.reranker,
                            stage=result.stage,
                            stage_note=_stage_note(result.without_vectors) or result.meaning_only_note,
                            fallback_reason=fallback_reason,
                            timings_ms={k: round(v, 2) for k, v in timings.items()}, model_version=version,
                            candidates=len(result.candidates), threshold=result.config.threshold,
                            note=result.note)


async def _rerank_awaited(services: Services, request: Request, reranker: Reranker, first: SearchResult,
                          until: float) -> SearchResult:
    """The LLM rerank of the first-stage pool in the LLM executor, awaited without a
    thread of the shared pool, by the request's deadline less a margin; the
    first-stage order with the reason when it passes or the client disconnects
    (the LLM work is cancelled then)."""
    deadline = Deadline(until - deadline_margin(services.settings.request_timeout_s))
    t0 = time.perf_counter()
    reranked = await services.llm.rerank(
        lambda d: reranker.rerank(first.query, first.candidates, deadline=d), first.candidates, deadline,
        disconnected=request.is_disconnected)
    return first.with_rerank(reranker, reranked, (time.perf_counter() - t0) * 1000)


def _stage_note(without_vectors) -> str | None:
    """Why the default stage searched with bm25, in the caller's terms (their ids; they upload, not run the CLI)."""
    if not without_vectors:
        return None
    return (f"searched with bm25: document(s) {', '.join(_external(without_vectors))} have no page embeddings "
            f"(uploaded while EVIDENTIA_DENSE was off); upload them again to search them with the hybrid stage")
