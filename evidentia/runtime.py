"""Where models run: CPU threads and whether a CUDA GPU is there, decided without
importing torch when no NVIDIA device exists (a search on a laptop never pays
torch's start-up just to learn there is no GPU)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Iterator

MAX_DEFAULT_THREADS = 4


def usable_cpus() -> int:
    """CPUs this process may run on (a container's or taskset's limit, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def default_threads(cpus: int | None = None) -> int:
    """Intra-op threads of one model when EVIDENTIA_THREADS is unset: half the
    usable CPUs, at least 1, at most 4.

    Why half: a laptop's logical CPUs are mostly hyper-threads of half as many
    cores, and matrix kernels gain nothing from a core's second thread; a
    2-core VM keeps one core for PDF extraction, tokenizing, the web server and
    everything else the machine runs (measured in docs/BENCHMARKS.md: on the
    shared 2-core machine two threads were slower than one). Why at most 4: a
    MiniLM-sized batch stops scaling there, and the API serves more requests by
    leaving cores to them."""
    cpus = usable_cpus() if cpus is None else cpus
    return max(1, min(MAX_DEFAULT_THREADS, cpus // 2))


def batch_threads(cpus: int | None = None) -> int:
    """Intra-op threads of the model in a batch command a person waits for
    (`evidentia index`, `embed`, `eval`, `dataset`) when EVIDENTIA_THREADS is
    unset: every usable CPU, at most 4. The serving default (``default_threads``)
    keeps half the CPUs for requests; a batch command has nothing else to serve,
    and PDF extraction runs in its own process. Measured on the idle 2-core VM
    (docs/BENCHMARKS.md section 11b): embedding financebench pages at 10.9 pages/s
    with one thread, 19.6 with two."""
    cpus = usable_cpus() if cpus is None else cpus
    return max(1, min(MAX_DEFAULT_THREADS, cpus))


def nvidia_device_present() -> bool:
    """A cheap look for an NVIDIA driver (no torch import)."""
    return Path("/proc/driver/nvidia").exists() or Path("/dev/nvidia0").exists()


def cuda_available() -> bool:
    """True when torch can use a CUDA GPU. Imports torch only when an NVIDIA
    driver is present, so a CPU machine answers in microseconds."""
    if not nvidia_device_present():
        return False
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return bool(torch.cuda.is_available())


def set_torch_threads(threads: int) -> None:
    """torch's intra-op threads; only when torch is already imported (setting them
    must not be the reason torch loads)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and threads > 0 and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def release_freed_memory() -> bool:
    """Hand the memory freed since the last call back to the system (glibc's
    ``malloc_trim``); False where the C library has none (musl, macOS).

    Why: glibc keeps what a thread frees in that thread's arena for reuse, and an
    indexing worker frees a whole document's text, tokens and vectors at once. A
    server that indexed eight 400-page documents of 41,000 characters a page (dense
    off) stayed at 795 MB with them written; trimmed after each document, at 404 MB
    (bench/bench_server_memory.py, docs/BENCHMARKS.md section 8as)."""
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):  # pragma: no cover - not glibc
        return False
    trim(0)
    return True


def make_private_dir(path: Path) -> Path:
    """Create the data dir ``path`` (and its parents) where it is missing, entered by its
    user alone (0700): it holds suppliers' confidential PDFs, their text, the questions,
    answers and analysts' verdicts, and under the usual umask 022 every local user could
    read them. A data dir that exists keeps its mode (a group that must share one sets it)."""
    path = Path(path)
    if not path.is_dir():
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


class Overloaded(TimeoutError):
    """A compute slot would not free up, or its work would not end, before the
    request's deadline: refused at once rather than after waiting for it."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"no compute slot before the deadline; retry after {retry_after_s:.0f} s")
        self.retry_after_s = retry_after_s


class KeyedLocks:
    """One lock per key, made when first held and dropped when nobody holds or waits for
    it: ``with locks(key):``. What needs a lock per thing (a document) rather than one
    for all (a 2,000-page document's index write held a server-wide lock for 4.7 s, and
    every tenant's page reads and verdicts waited on it)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[object, list] = {}  # key -> [lock, holders and waiters]

    @contextlib.contextmanager
    def __call__(self, key) -> Iterator[None]:
        with self._guard:
            entry = self._locks.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._guard:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._locks[key]

    def __len__(self) -> int:
        with self._guard:
            return len(self._locks)


class ComputeGate:
    """At most ``slots`` calls at once of work that computes on this machine's cores;
    the others wait in line. ``enter(deadline)`` refuses a call that finds a line at
    once (Overloaded) when the calls ahead, at the time a call usually holds a slot (a
    moving average of the calls that ran), would not let it end by its deadline, and
    one that waited in line when it gets its slot too late to end by then. A call
    that finds a free slot always runs: so the average is measured again, and a slow
    call (the first, with cold caches) cannot have every later one refused.

    Why refuse at once: under overload, work shared the cores with everything
    admitted, every call took as long as all of them, and calls that waited until
    their deadline (or started just before it and ran past it) computed answers no
    client received: 1 validation answered in 30 s (3 s timeout, 6 tenants x 5
    clients, bench/bench_overload.py; 93 with this gate, docs/BENCHMARKS.md section 8as)."""

    SMOOTHING = 0.2  # weight of the latest call in the average: about the last ten count

    def __init__(self, slots: int) -> None:
        if slots <= 0:
            raise ValueError("slots must be positive")
        self.slots = slots
        self._semaphore = threading.BoundedSemaphore(slots)
        self._lock = threading.Lock()
        self._in_line = 0  # holding a slot or waiting for one
        self.hold_s: float | None = None

    @contextlib.contextmanager
    def enter(self, deadline: float | None = None) -> Iterator[float]:
        """Holds a slot; yields the seconds waited for it. ``deadline``: time.monotonic();
        one already passed is TimeoutError, a free slot or not (work queued past it)."""
        t0 = time.monotonic()
        if deadline is not None and t0 > deadline:
            raise TimeoutError
        with self._lock:
            ahead, hold_s = self._in_line, self.hold_s
            in_line = ahead >= self.slots  # no free slot: it waits behind the others
            if deadline is not None and hold_s is not None and in_line:
                done_at = t0 + (ahead // self.slots + 1) * hold_s
                if done_at > deadline:
                    raise Overloaded(max(1.0, done_at - t0))
            self._in_line += 1
        try:
            timeout = None if deadline is None else max(0.0, deadline - t0)
            if not self._semaphore.acquire(timeout=timeout):
                raise TimeoutError
            t1 = time.monotonic()
            ran = False
            try:
                if deadline is not None and hold_s is not None and in_line and t1 + hold_s > deadline:
                    raise Overloaded(max(1.0, hold_s))  # it would end past the deadline: no one would get it
                yield t1 - t0
                ran = True
            finally:
                self._semaphore.release()
                if ran:  # a call refused, or failing at once, says nothing of how long work takes
                    held = time.monotonic() - t1
                    with self._lock:
                        self.hold_s = held if self.hold_s is None else (
                            self.SMOOTHING * held + (1 - self.SMOOTHING) * self.hold_s)
        finally:
            with self._lock:
                self._in_line -= 1
