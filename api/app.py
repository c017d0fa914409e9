"""``create_app(settings) -> FastAPI``: the validation API.

Everything the app holds hangs off ``app.state.services`` (see services.py),
built here and started/stopped by the lifespan; nothing lives at module level,
so tests can run several apps side by side.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from evidentia.api.errors import DESCRIPTIONS, ApiError, body_too_large, file_too_large, install_handlers
from evidentia.api.http_guard import RelativeRedirectMiddleware, UploadKeyMiddleware
from evidentia.api.metrics import AccessLogMiddleware, BodyLimitMiddleware, MetricsMiddleware
from evidentia.api.routers import admin, documents, feedback, health, validate
from evidentia.api.routers.ui import install_docs, install_ui
from evidentia.api.services import Services
from evidentia.config import Settings

# JSON bodies are small (a question, an answer, ids); an upload may carry the
# file limit plus the multipart framing.
JSON_BODY_LIMIT = 1 << 20
MULTIPART_OVERHEAD = 1 << 20

DESCRIPTION = """Finds the PDF pages that support a supplier's answer to a CSR/ESG questionnaire question.

1. `POST /v1/documents` a PDF (202: indexing runs in the background), poll `GET /v1/documents/{id}` until `ready`;
2. `POST /v1/validate` a question, the answer and document ids: the supporting pages, best first;
3. `POST /v1/feedback` whether a returned page supports the answer; `GET /v1/feedback/export` as training data.

Authenticate with your API key in `X-API-Key` (or `Authorization: Bearer`). Every error is
`{"error": {"code", "message", "details"}}`.
"""


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings.from_env()
    services = Services(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        services.start()
        try:
            yield
        finally:
            services.stop()

    app = FastAPI(
        title="Evidentia validation API",
        version="1.0.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # served from this server's files (install_docs): FastAPI's load a CDN's
        redoc_url=None,
    )
    app.state.services = services
    install_handlers(app)

    def body_limit(scope) -> tuple[int, ApiError]:
        if scope.get("method") == "POST" and scope.get("path", "").rstrip("/") == "/v1/documents":
            return settings.max_upload_bytes + MULTIPART_OVERHEAD, file_too_large(settings.max_upload_bytes)
        return JSON_BODY_LIMIT, body_too_large(JSON_BODY_LIMIT)

    # added last = outermost: metrics and the access log see every answer, the body limit's 413s included
    app.add_middleware(BodyLimitMiddleware, limit_for=body_limit)
    app.add_middleware(UploadKeyMiddleware, services=services)  # 401 before an upload body is read
    app.add_middleware(MetricsMiddleware, metrics=services.metrics)
    app.add_middleware(RelativeRedirectMiddleware)  # a Location never names a host the client sent
    app.add_middleware(AccessLogMiddleware)  # outermost: every answer's line, with its time

    for module in (documents, validate, feedback, admin, health):
        app.include_router(module.router)
    install_ui(app)  # the analysts' page at /ui (/ redirects there)
    install_docs(app)  # /docs, with no file from elsewhere
    _use_error_shape_in_openapi(app)
    return app


def _use_error_shape_in_openapi(app: FastAPI) -> None:
    """FastAPI documents its validation errors (422) with its own schema; ours
    answer in the one error shape, so the document says so."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        spec = generate()
        for ops in spec.get("paths", {}).values():
            for op in ops.values():
                resp = op.get("responses", {}).get("422")
                if resp and "HTTPValidationError" in str(resp):
                    op["responses"]["422"] = {
                        "description": DESCRIPTIONS[422],
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
                    }
        schemas = spec.get("components", {}).get("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        app.openapi_schema = spec
        return spec

    app.openapi = openapi
