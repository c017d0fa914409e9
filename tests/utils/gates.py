"""A compute slot held by another thread (evidentia.runtime.ComputeGate), for the tests of
what waits for one and what is refused."""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator


@contextlib.contextmanager
def slot_held(gate, release_after: float | None = None) -> Iterator[threading.Event]:
    """One of ``gate``'s slots held by another thread until the yielded event is set (or
    ``release_after`` seconds have passed, or the block ends); the thread is joined after."""
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with gate.enter():
            holding.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(5), "the slot was not taken"
    timer = threading.Timer(release_after, release.set) if release_after is not None else None
    if timer:
        timer.start()
    try:
        yield release
    finally:
        release.set()
        holder.join()
        if timer:
            timer.cancel()
