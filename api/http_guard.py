"""Protection of the HTTP server against slow or unauthenticated clients.

``guarded_h11_protocol``: uvicorn's h11 protocol with two deadlines it lacks.
Uvicorn only times out idle keep-alive connections, so a client that sends
its headers (or its body) a byte at a time holds a connection, a file
descriptor and a slot for ever (issue #15: past the open-files limit new
clients time out). Here a connection must deliver a request's headers within
EVIDENTIA_HTTP_HEADER_TIMEOUT_S of its first byte (or of the connection) and
its whole body within EVIDENTIA_HTTP_BODY_TIMEOUT_S of the headers, or it is
closed (408 when no response has started). The number of connections is
bounded by uvicorn's ``limit_concurrency`` (EVIDENTIA_HTTP_MAX_CONNECTIONS,
503 beyond).

``UploadKeyMiddleware``: FastAPI parses a multipart body before it runs the
route's dependencies, so a 50 MB upload without a key was read in full before
the 401. This middleware checks the key of ``POST /v1/documents`` from the
headers alone and answers 401 before a byte of the body is read.

``RelativeRedirectMiddleware``: Starlette's trailing-slash redirect (``/v1/documents/``
to ``/v1/documents``) writes an absolute ``Location`` from the request's ``Host``
header, so whoever sends the request chooses the host a client is sent to (and a
shared cache may keep it). A redirect to this server's own path goes out as that
path alone, which every client resolves against the host it asked.
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit

import anyio
import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from evidentia.api.errors import error_content

REQUEST_TIMEOUT_RESPONSE = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                            b"connection: close\r\ncontent-length: %d\r\n\r\n%s")


def guarded_h11_protocol(header_timeout_s: float, body_timeout_s: float) -> type[H11Protocol]:
    class GuardedH11Protocol(H11Protocol):
        """H11Protocol + a header deadline and a body deadline per request."""

        _deadline: asyncio.TimerHandle | None = None
        _phase: str | None = None  # "headers" or "body" while a deadline runs

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm("headers", header_timeout_s)

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.transport.is_closing():
                return
            state = self.conn.their_state
            if state is h11.IDLE:
                # bytes of a request whose headers are not complete yet
                if self._phase != "headers" and self.conn.trailing_data[0]:
                    self._arm("headers", header_timeout_s)
            elif state is h11.SEND_BODY:
                if self._phase != "body":
                    self._arm("body", body_timeout_s)
            else:
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.conn.their_state is not h11.SEND_BODY:
                self._disarm()  # the keep-alive timeout takes over

        def _arm(self, phase: str, seconds: float) -> None:
            self._disarm()
            self._phase = phase
            self._deadline = self.loop.call_later(seconds, self._expired, phase, seconds)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = None
            self._phase = None

        def _expired(self, phase: str, seconds: float) -> None:
            self._deadline = None
            self._phase = None
            if self.transport.is_closing():
                return
            self.logger.info("closing a connection that did not send its request %s within %g s", phase, seconds)
            if self.cycle is None or not self.cycle.response_started:
                setting = "EVIDENTIA_HTTP_HEADER_TIMEOUT_S" if phase == "headers" else "EVIDENTIA_HTTP_BODY_TIMEOUT_S"
                body = json.dumps(error_content("request_timeout", f"the request {phase} did not arrive within "
                                                f"{seconds:g} s ({setting})")).encode()
                self.transport.write(REQUEST_TIMEOUT_RESPONSE % (len(body), body))
            if self.cycle is not None:
                self.cycle.keep_alive = False
            self.transport.close()

    return GuardedH11Protocol


class UploadKeyMiddleware:
    """401 for ``POST /v1/documents`` without a valid key, before the body is read."""

    def __init__(self, app, services) -> None:
        self.app = app
        self.services = services

    async def __call__(self, scope, receive, send) -> None:
        if (scope["type"] == "http" and scope.get("method") == "POST"
                and scope.get("path", "").rstrip("/") == "/v1/documents"):
            # in a thread: the store's lock may be held by a write waiting on fsync
            message = await anyio.to_thread.run_sync(self._refusal, dict(scope.get("headers") or []))
            if message is not None:
                body = json.dumps(error_content("unauthorized", message)).encode()
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode()),
                                        (b"www-authenticate", b"Bearer"), (b"connection", b"close")]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)

    def _refusal(self, headers: dict[bytes, bytes]) -> str | None:
        key = headers.get(b"x-api-key", b"").decode("latin-1").strip()
        if not key:
            auth = headers.get(b"authorization", b"").decode("latin-1").strip()
            if auth.lower().startswith("bearer "):
                key = auth[7:].strip()
        if not key:
            return "missing API key: send it in the X-API-Key header (or as Authorization: Bearer <key>)"
        store = self.services.store
        if store is not None and store.authenticate(key) is None:
            return "invalid API key (revoked, mistyped or from another server)"
        return None


REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


class RelativeRedirectMiddleware:
    """A redirect to the requested host goes out with a relative ``Location``."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1").lower()

        async def send_relative(message) -> None:
            if message["type"] == "http.response.start" and message.get("status") in REDIRECT_STATUSES:
                message = {**message, "headers": [(name, _relative(value, host) if name.lower() == b"location"
                                                   else value) for name, value in message.get("headers", [])]}
            await send(message)

        await self.app(scope, receive, send_relative)


def _relative(location: bytes, host: str) -> bytes:
    """``http://HOST/path?q`` -> ``/path?q`` when HOST is the request's own (or it has none)."""
    parts = urlsplit(location.decode("latin-1"))
    if not parts.netloc or parts.netloc.lower() != host:
        return location  # already relative, or somewhere else on purpose
    path = parts.path or "/"
    if path.startswith("//"):  # would read as a host
        path = "/" + path.lstrip("/")
    return (path + (f"?{parts.query}" if parts.query else "")).encode("latin-1")
