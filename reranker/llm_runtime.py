"""Time and concurrency bounds for LLM calls.

* ``Deadline``: an absolute ``time.monotonic()`` instant that can also be
  cancelled early (the client went away, the request ended). The reranker
  checks it before every request, batch and backoff sleep, and a ``watchdog``
  aborts the HTTP request in flight when it passes: a server that drips one
  byte a second is cut off at the deadline, not after one read timeout per byte.
* ``LLMRuntime``: what the API uses to run an LLM rerank *outside* the thread
  pool that authentication and storage use: a dedicated executor whose size
  (``EVIDENTIA_LLM_CONCURRENCY``) bounds how many reranks talk to the model at
  once; the request awaits the result asynchronously (no pool thread waits),
  and hands back the first-stage order with the reason when the deadline
  passes or the client disconnects, cancelling the work in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from concurrent.futures import CancelledError as FutureCancelled
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Awaitable, Callable, Iterator, Sequence

from evidentia.records import Candidate
from evidentia.reranker.base import RerankResult, passthrough

log = logging.getLogger("evidentia.reranker.llm")

FALLBACK_SUFFIX = "; first-stage order returned"


def deadline_margin(request_timeout_s: float) -> float:
    """Time kept back from the request timeout for everything after the LLM
    (storing the validation, answering; many validations whose deadline passes
    at once queue for the store): a tenth of it, between 0.5 and 2 seconds, and
    never more than half of it."""
    return min(0.5 * request_timeout_s, max(0.5, min(2.0, 0.1 * request_timeout_s)))


class Deadline:
    """An absolute ``time.monotonic()`` deadline (None: no limit) that can be
    cancelled before it passes; ``reason`` says why it ended."""

    def __init__(self, at: float | None = None) -> None:
        self.at = at
        self._cancelled = threading.Event()
        self._reason: str | None = None
        self._lock = threading.Lock()
        self._listeners: list[threading.Event] = []

    @classmethod
    def after(cls, seconds: float | None) -> "Deadline":
        return cls(None if seconds is None else time.monotonic() + seconds)

    def remaining(self) -> float | None:
        """Seconds left (0 once cancelled or passed); None without a limit."""
        if self._cancelled.is_set():
            return 0.0
        return None if self.at is None else max(0.0, self.at - time.monotonic())

    def expired(self) -> bool:
        return self._cancelled.is_set() or (self.at is not None and time.monotonic() >= self.at)

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def reason(self) -> str:
        if self._reason:
            return self._reason
        return "deadline passed"

    def cancel(self, reason: str) -> None:
        with self._lock:
            if self._reason is None:
                self._reason = reason
            self._cancelled.set()
            listeners = list(self._listeners)
        for event in listeners:
            event.set()

    def sleep(self, seconds: float) -> bool:
        """Sleep ``seconds`` or until cancelled; False when the deadline ends first
        (the caller should stop then)."""
        left = self.remaining()
        if left is not None and left < seconds:
            self._cancelled.wait(left)
            return False
        return not self._cancelled.wait(seconds)

    @contextlib.contextmanager
    def listen(self) -> Iterator[threading.Event]:
        """An event set when this deadline is cancelled (for watchdogs)."""
        event = threading.Event()
        with self._lock:
            if self._cancelled.is_set():
                event.set()
            self._listeners.append(event)
        try:
            yield event
        finally:
            with self._lock:
                self._listeners.remove(event)


@contextlib.contextmanager
def watchdog(deadline: Deadline, limit_s: float | None, abort: Callable[[], None]) -> Iterator[Callable[[], bool]]:
    """Calls ``abort`` (e.g. closes the HTTP client of the request in flight) when
    the body has not finished ``limit_s`` seconds from now, by the deadline, or
    when the deadline is cancelled, whichever comes first. Yields a function that
    says whether it fired. Measures total wall time, not time between reads."""
    left = deadline.remaining()
    limits = [x for x in (limit_s, left) if x is not None]
    wait_s = min(limits) if limits else None
    fired = threading.Event()
    with deadline.listen() as wake:
        def guard() -> None:
            wake.wait(wait_s)
            if not done.is_set():
                fired.set()
                try:
                    abort()
                except Exception:  # aborting is best effort; the request fails either way
                    pass

        done = threading.Event()
        thread = threading.Thread(target=guard, name="evidentia-llm-watchdog", daemon=True)
        thread.start()
        try:
            yield fired.is_set
        finally:
            done.set()
            wake.set()
            thread.join(1.0)


class LLMRuntime:
    """A dedicated, bounded executor for LLM reranks (``concurrency`` at once;
    the others queue, their deadline running)."""

    def __init__(self, concurrency: int) -> None:
        if concurrency < 1:
            raise ValueError("LLM concurrency must be at least 1")
        self.concurrency = concurrency
        self._executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="evidentia-llm")
        self._lock = threading.Lock()
        self._pending = 0

    @property
    def pending(self) -> int:
        """Reranks submitted and not finished (running or queued)."""
        with self._lock:
            return self._pending

    def _finished(self, _future: Future) -> None:
        with self._lock:
            self._pending -= 1

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def submit(self, fn: Callable[[Deadline], RerankResult], deadline: Deadline) -> Future:
        def run() -> RerankResult | None:
            if deadline.expired():  # waited in the queue until the end: do not call the model
                return None
            return fn(deadline)

        with self._lock:
            self._pending += 1
        future = self._executor.submit(run)
        future.add_done_callback(self._finished)
        return future

    async def rerank(self, rerank: Callable[[Deadline], RerankResult], candidates: Sequence[Candidate],
                     deadline: Deadline, disconnected: Callable[[], Awaitable[bool]] | None = None,
                     poll_s: float = 1.0) -> RerankResult:
        """Run ``rerank(deadline)`` in the executor and await it without holding a
        thread. When the deadline passes or ``disconnected()`` says the client is
        gone, the deadline is cancelled (the watchdog aborts the HTTP request, no
        retry follows) and the first-stage order comes back with the reason."""
        future = self.submit(rerank, deadline)
        waiting = asyncio.wrap_future(future)
        try:
            while True:
                left = deadline.remaining()
                step = poll_s if left is None else min(poll_s, left)
                done, _ = await asyncio.wait({waiting}, timeout=step)
                if done:
                    try:
                        result = waiting.result()
                    except (FutureCancelled, asyncio.CancelledError):
                        result = None
                    except Exception as exc:  # a bug must not turn into a 500: fall back, say why
                        log.error("the LLM reranker failed", exc_info=exc)  # the client sees the type alone
                        return _fallback(candidates, deadline, f"the LLM reranker failed ({type(exc).__name__})")
                    if result is None:
                        return _fallback(candidates, deadline, "no free LLM slot before the deadline "
                                         f"(EVIDENTIA_LLM_CONCURRENCY={self.concurrency})")
                    return result
                if disconnected is not None and await disconnected():
                    deadline.cancel("the client disconnected")
                    return _fallback(candidates, deadline, "the client disconnected")
                if deadline.expired():
                    queued = future.cancel()  # True: it never started
                    deadline.cancel("deadline passed")
                    what = (f"no free LLM slot before the deadline (EVIDENTIA_LLM_CONCURRENCY={self.concurrency})"
                            if queued else "the LLM did not answer before the request's deadline")
                    return _fallback(candidates, deadline, what)
        finally:
            # however we leave (answered, fallback, the request task cancelled): no LLM work continues
            if not future.done():
                future.cancel()
                deadline.cancel("the request ended")
            # an outcome nobody waits for any more is consumed, not logged as "never retrieved"
            waiting.add_done_callback(lambda f: f.cancelled() or f.exception())


def _fallback(candidates: Sequence[Candidate], deadline: Deadline, reason: str) -> RerankResult:
    return RerankResult(pages=passthrough(candidates), fallback_reason=reason + FALLBACK_SUFFIX,
                        info={"cancelled": deadline.reason})
