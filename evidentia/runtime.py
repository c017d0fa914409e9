"""Where models run: CPU threads and whether a CUDA GPU is there, decided without
importing torch when no NVIDIA device exists (a search on a laptop never pays
torch's start-up just to learn there is no GPU)."""

from __future__ import annotations

import os
from pathlib import Path

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
    off) stayed at 799 MB with them written; trimmed after each document, at 372 MB
    (docs/BENCHMARKS.md, section 8as)."""
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):  # pragma: no cover - not glibc
        return False
    trim(0)
    return True


def keep_files_private() -> None:
    """Files and folders this process creates are its user's alone (umask 077 added to
    the one it has): the data dir holds suppliers' confidential PDFs, their text, the
    questions, answers and analysts' verdicts, and under the usual umask 022 every local
    user could read them. A group that must share them sets the data dir's mode itself."""
    os.umask(os.umask(0) | 0o077)
