"""FastAPI dependencies: the app's services, the caller's tenant (API key + rate
limit), the admin key, and running blocking work under the request timeout."""

from __future__ import annotations

import asyncio
import hmac
import inspect
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

import anyio
from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from evidentia.api.errors import ApiError
from evidentia.api.services import Services
from evidentia.runtime import Overloaded
from evidentia.store import ApiKey

T = TypeVar("T")

# Declared as security schemes so that OpenAPI (and /docs) show how to authenticate;
# auto_error=False: a missing key gets our own 401, in our error shape.
api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="Your API key.")
bearer = HTTPBearer(auto_error=False, description="The same API key, as `Authorization: Bearer <key>`.")


def get_services(request: Request) -> Services:
    return request.app.state.services


def _presented_key(header_key: str | None, credentials: HTTPAuthorizationCredentials | None) -> str | None:
    if header_key:
        return header_key.strip()
    if credentials is not None and credentials.credentials:
        return credentials.credentials.strip()
    return None


@dataclass(frozen=True)
class Caller:
    tenant: str
    key_id: str


def require_tenant(
    request: Request,
    services: Services = Depends(get_services),
    header_key: str | None = Depends(api_key_header),
    credentials: HTTPAuthorizationCredentials | None = Depends(bearer),
) -> Caller:
    key = _presented_key(header_key, credentials)
    if not key:
        raise ApiError(401, "unauthorized", "missing API key: send it in the X-API-Key header "
                       "(or as Authorization: Bearer <key>)", headers={"WWW-Authenticate": "Bearer"})
    info: ApiKey | None = services.store.authenticate(key)
    if info is None:
        raise ApiError(401, "unauthorized", "invalid API key (revoked, mistyped or from another server)",
                       headers={"WWW-Authenticate": "Bearer"})
    # for the access log (metrics.AccessLogMiddleware): whose request it was, refused or not
    request.state.tenant, request.state.key_id = info.tenant, info.key_id
    wait = services.rate_limiter.acquire(info.key_id)
    if wait > 0:
        services.metrics.rate_limited.inc()
        retry = max(1, math.ceil(wait))
        raise ApiError(429, "rate_limited", f"rate limit of {services.settings.rate_limit_per_minute} requests "
                       f"per minute for this key exceeded; retry in {retry} s",
                       {"retry_after_s": retry, "limit_per_minute": services.settings.rate_limit_per_minute},
                       headers={"Retry-After": str(retry)})
    return Caller(tenant=info.tenant, key_id=info.key_id)


def require_admin(
    services: Services = Depends(get_services),
    header_key: str | None = Depends(api_key_header),
    credentials: HTTPAuthorizationCredentials | None = Depends(bearer),
) -> None:
    admin_key = services.settings.admin_key
    if not admin_key:
        raise ApiError(403, "admin_disabled", "the admin API is disabled: set EVIDENTIA_ADMIN_KEY on the server "
                       "(or create keys with `evidentia keys create --tenant T`)")
    key = _presented_key(header_key, credentials)
    if not key or not hmac.compare_digest(key.encode(), admin_key.encode()):
        raise ApiError(401, "unauthorized", "missing or invalid admin key (EVIDENTIA_ADMIN_KEY)",
                       headers={"WWW-Authenticate": "Bearer"})


def require_backend(services: Services):
    if services.backend is None:
        raise ApiError(503, "not_ready", "the search index is not open yet; see GET /ready",
                       {"checks": dict(services.checks)}, headers={"Retry-After": "2"})
    return services.backend


async def run_blocking(services: Services, fn: Callable[..., T], *args, timeout: float | None = None,
                       limiter: anyio.CapacityLimiter | None = None) -> T:
    """Run ``fn`` in a worker thread, answering 504 when it takes longer than the
    request timeout (its wait for a ``limiter`` token included). The thread is
    abandoned, not killed: ``fn`` must write nothing that a timed-out request must
    not leave behind (callers store results after this returns)."""
    limit = services.settings.request_timeout_s if timeout is None else timeout
    work = _to_thread(lambda: fn(*args)) if limiter is None else _holding(limiter, lambda: fn(*args))
    try:
        return await asyncio.wait_for(work, limit)
    except Overloaded as exc:  # refused at once: the line of searches would not reach it in time
        retry = math.ceil(exc.retry_after_s)
        raise ApiError(503, "overloaded", f"the server is busy: this request would not be answered within "
                       f"{limit:g} s (EVIDENTIA_REQUEST_TIMEOUT_S); retry after {retry} s",
                       {"retry_after_s": retry}, headers={"Retry-After": str(retry)}) from None
    except (asyncio.TimeoutError, TimeoutError):
        raise ApiError(504, "timeout", f"the request took longer than {limit:g} s (EVIDENTIA_REQUEST_TIMEOUT_S); "
                       f"retry later, or with fewer documents or a smaller top_k", {"timeout_s": limit}) from None


# anyio < 4.1 calls it `cancellable`: either way, a cancelled wait returns at once
_ABANDON = ("abandon_on_cancel" if "abandon_on_cancel" in inspect.signature(anyio.to_thread.run_sync).parameters
            else "cancellable")


async def _to_thread(fn: Callable[[], T], limiter: anyio.CapacityLimiter | None = None) -> T:
    return await anyio.to_thread.run_sync(fn, limiter=limiter, **{_ABANDON: True})


async def _holding(limiter: anyio.CapacityLimiter, fn: Callable[[], T]) -> T:
    """``fn`` in a worker thread, holding a token of ``limiter`` until ``fn`` returns,
    even when the request gave up on it first. anyio's own ``limiter=`` gives the token
    back when the awaiting request is cancelled (a 504) while the abandoned thread goes
    on: under overload each tenant then ran ever more searches at once, all slower
    (bench/bench_overload.py). A thread that had not started when its request gave up
    does not run at all."""
    token = object()
    await limiter.acquire_on_behalf_of(token)
    loop = asyncio.get_running_loop()
    state = threading.Lock()
    started = given_up = False

    def release() -> None:
        try:
            loop.call_soon_threadsafe(limiter.release_on_behalf_of, token)
        except RuntimeError:  # the loop is closed: the server stopped
            pass

    def run() -> T:
        nonlocal started
        with state:
            if given_up:
                raise TimeoutError
            started = True
        try:
            return fn()
        finally:
            release()

    try:
        # a limiter of its own: the thread must not take a token of anyio's shared pool, which
        # every request's sync dependencies need (api/tenant_slots.py); the tenant's token bounds it
        return await _to_thread(run, anyio.CapacityLimiter(1))
    except BaseException:
        with state:
            if not started:  # never will: the token is given back here
                given_up = True
                limiter.release_on_behalf_of(token)
        raise


def deadline(services: Services) -> float:
    return time.monotonic() + services.settings.request_timeout_s
