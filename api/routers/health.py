"""Liveness, readiness and Prometheus metrics (no API key needed)."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from evidentia.api.deps import get_services
from evidentia.api.errors import ApiError, errors, without_server_details
from evidentia.api.schemas import Health, Ready
from evidentia.api.services import Services

router = APIRouter(tags=["health"])

READY_PROBE_ID = "__evidentia_ready_probe__"


@router.get("/health", response_model=Health, summary="Liveness: the process answers")
async def health() -> Health:
    return Health()


def _live_checks(services: Services) -> dict[str, str]:
    checks = dict(services.checks)
    if services.store is not None:
        try:
            services.store.ping()
        except Exception as exc:
            checks["store"] = f"error: {without_server_details(str(exc))}"
    if services.backend is not None:
        try:
            services.backend.get_document(READY_PROBE_ID)
        except Exception as exc:
            checks["index"] = f"error: {without_server_details(str(exc))}"
    return checks


@router.get("/ready", response_model=Ready, summary="Readiness: index open, store open, default reranker loaded",
            description="503 until the search index and the store are open and the default reranker "
                        "(EVIDENTIA_DEFAULT_RERANKER) is loaded; `details.checks` says what is missing.",
            responses=errors(503))
async def ready(services: Services = Depends(get_services)) -> Ready:
    checks = await run_in_threadpool(_live_checks, services)
    failing = {k: v for k, v in checks.items() if v != "ok"}
    if failing:
        raise ApiError(503, "not_ready", "not ready: " + "; ".join(f"{k}: {v}" for k, v in failing.items()),
                       {"checks": checks}, headers={"Retry-After": "2"})
    return Ready(checks=checks)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format."}})
def metrics(services: Services = Depends(get_services)) -> Response:
    return Response(generate_latest(services.metrics.registry), media_type=CONTENT_TYPE_LATEST)
