"""Prometheus metrics (one registry per app, so several apps in one process, as in
the tests, never share counters) and the ASGI middlewares: request metrics, the
access log and the request-body limit."""

from __future__ import annotations

import json
import logging
import time
from typing import Callable

from fastapi import HTTPException
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from evidentia.api.errors import ApiError, error_content

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("evidentia_http_requests", "HTTP requests by route template and status.",
                                ["method", "route", "status"], registry=r)
        self.latency = Histogram("evidentia_http_request_duration_seconds", "HTTP request latency by route template.",
                                 ["method", "route"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_length = Gauge("evidentia_indexing_queue_length", "Documents waiting to be indexed.", registry=r)
        self.indexed = Counter("evidentia_documents_indexed", "Documents whose indexing ended, by outcome.",
                               ["outcome"], registry=r)
        self.indexed_pages = Counter("evidentia_indexed_pages", "Pages indexed.", registry=r)
        self.indexing_seconds = Histogram("evidentia_indexing_duration_seconds", "Time to index one document.",
                                          buckets=LATENCY_BUCKETS, registry=r)
        self.validations = Counter("evidentia_validations", "Validations answered, by reranker.", ["reranker"],
                                   registry=r)
        self.validation_seconds = Histogram("evidentia_validation_duration_seconds",
                                            "Retrieve + rerank time of a validation, by reranker.", ["reranker"],
                                            buckets=LATENCY_BUCKETS, registry=r)
        self.fallbacks = Counter("evidentia_reranker_fallbacks",
                                 "Validations where the reranker failed and the first-stage order was returned.",
                                 ["reranker"], registry=r)
        self.rate_limited = Counter("evidentia_rate_limited_requests", "Requests refused by the rate limit.",
                                    registry=r)

    def track_queue(self, size: Callable[[], int]) -> None:
        self.queue_length.set_function(size)


# HTTP's methods; any other name a client sends is counted as "other": a method is any token
# to the server (uvicorn passes "X00001YYYY..." on), and 200 requests of 2,000-character
# names took /metrics, which needs no key, from 9 KB to 8 MB of series kept for good
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"})


def _method_label(scope) -> str:
    method = scope.get("method", "")
    return method if method in HTTP_METHODS else "other"


def _route_label(scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "unmatched"


class _AnsweredMiddleware:
    """Calls ``answered(scope, status, seconds)`` once each HTTP request is answered
    (status 500 when the app raised before answering)."""

    def __init__(self, app) -> None:
        self.app = app

    def answered(self, scope, status: int, seconds: float) -> None:
        raise NotImplementedError

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        t0 = time.perf_counter()

        async def send_wrapper(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self.answered(scope, status, time.perf_counter() - t0)


class MetricsMiddleware(_AnsweredMiddleware):
    """Counts every request by route template (never the raw path: ids would
    explode the label set), method (HTTP's, else "other") and status, and times it."""

    def __init__(self, app, metrics: Metrics) -> None:
        super().__init__(app)
        self.metrics = metrics

    def answered(self, scope, status: int, seconds: float) -> None:
        route = _route_label(scope)
        method = _method_label(scope)
        self.metrics.requests.labels(method, route, str(status)).inc()
        self.metrics.latency.labels(method, route).observe(seconds)


class AccessLogMiddleware(_AnsweredMiddleware):
    """One line a request on the ``evidentia.access`` logger: client, method, path,
    status, milliseconds and the caller's tenant and key id (``request.state``, set by
    require_tenant), so that an operator can tell whose requests were slow or refused;
    uvicorn's own line had neither time nor tenant. Successful health checks (GET
    /health or /ready, 200) are left out: a probe every 10 s filled the log."""

    def __init__(self, app) -> None:
        super().__init__(app)
        self.log = logging.getLogger("evidentia.access")

    def answered(self, scope, status: int, seconds: float) -> None:
        path = scope.get("path", "")
        if (status == 200 and path in ("/health", "/ready")) or not self.log.isEnabledFor(logging.INFO):
            return
        client = scope.get("client") or ("-", 0)
        state = scope.get("state") or {}
        query = scope.get("query_string", b"")
        # %r of the path: a client's bytes never forge a line of their own
        self.log.info("%s:%s %s %r %d %.0f ms tenant=%s key=%s", client[0], client[1], _method_label(scope),
                      path + ("?" + query.decode("latin-1") if query else ""), status, seconds * 1000,
                      state.get("tenant", "-"), state.get("key_id", "-"))


class _BodyTooLarge(HTTPException):
    """Raised from ``receive``: an HTTPException so that FastAPI's body parsing lets
    it through (it turns other errors into a 400). The app's handler or the middleware
    answers it with the refusal's code, message and details."""

    def __init__(self, refusal: ApiError) -> None:
        super().__init__(refusal.status, refusal.message)
        self.code = refusal.code
        self.details = refusal.details


class BodyLimitMiddleware:
    """Refuses request bodies over a limit before they are read whole: at once
    from Content-Length, or as soon as a streamed body passes the limit.
    ``limit_for(scope)`` gives the limit of a request (uploads get more) and the
    error that refuses it."""

    def __init__(self, app, limit_for: Callable[[dict], tuple[int, ApiError]]) -> None:
        self.app = app
        self.limit_for = limit_for

    async def _refuse(self, send, refusal: ApiError) -> None:
        body = json.dumps(error_content(refusal.code, refusal.message, refusal.details)).encode()
        await send({"type": "http.response.start", "status": refusal.status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, refusal = self.limit_for(scope)
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > limit:
                    await self._refuse(send, refusal)
                    return
        received = 0
        started = False

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _BodyTooLarge(refusal)
            return message

        async def tracking_send(message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _BodyTooLarge:
            if not started:
                await self._refuse(send, refusal)
        except BaseException as exc:  # FastAPI wraps body errors (400) or groups them
            if _caused_by_limit(exc) and not started:
                await self._refuse(send, refusal)
            else:
                raise


def _caused_by_limit(exc: BaseException) -> bool:
    seen = set()
    stack = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, _BodyTooLarge):
            return True
        stack.extend([e.__cause__, e.__context__, *getattr(e, "exceptions", ())])
    return False
