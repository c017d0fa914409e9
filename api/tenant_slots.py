"""How many of one tenant's requests of a kind run at once (EVIDENTIA_TENANT_CONCURRENCY).

A tenant that sent forty uploads at once held every thread of the shared pool for 20 s
while each one's page count ran (docs/BENCHMARKS.md 8an): another tenant's document
listing, its searches and ``/ready`` waited for a thread that long. Here the tenant's
requests beyond its slots wait their turn without a thread, and the work of those
running takes the slots' own thread tokens, not the shared pool's."""

from __future__ import annotations

from typing import Callable, TypeVar

import anyio

T = TypeVar("T")


class TenantSlots:
    """One capacity limiter a tenant, made on its first request. Used from the event
    loop only (no lock needed)."""

    def __init__(self, per_tenant: int) -> None:
        self.per_tenant = per_tenant
        self._limiters: dict[str, anyio.CapacityLimiter] = {}

    def limiter(self, tenant: str) -> anyio.CapacityLimiter:
        limiter = self._limiters.get(tenant)
        if limiter is None:
            limiter = self._limiters[tenant] = anyio.CapacityLimiter(self.per_tenant)
        return limiter

    async def run(self, tenant: str, fn: Callable[..., T], *args) -> T:
        """``fn(*args)`` in a worker thread once one of the tenant's slots is free."""
        return await anyio.to_thread.run_sync(fn, *args, limiter=self.limiter(tenant))
