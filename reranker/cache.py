"""Loaded rerankers, shared by every search of a process.

One reranker per (name, threshold), created on first use. Rerankers of the same
name but another threshold share the loaded model (``Reranker.with_threshold``),
so a new threshold never loads a model again; a promotion or rollback in the
model registry is picked up on the next call (hot reload). Rerankers that
compute on this machine's cores run at most ``concurrency`` calls at once."""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Callable

from evidentia.config import Settings
from evidentia.runtime import ComputeGate
from evidentia.reranker.base import Reranker
from evidentia.reranker.registry import create_reranker, current_model_dir


class RerankerCache:
    def __init__(self, settings: Settings, shared_embedder: Callable[[], object] | None = None,
                 max_entries: int = 32) -> None:
        """``shared_embedder()``: the process's page embedder, handed to rerankers that encode text."""
        self.settings = settings
        self.shared_embedder = shared_embedder
        self.max_entries = max_entries
        self._items: "OrderedDict[tuple[str, float | None], Reranker]" = OrderedDict()
        self._lock = threading.Lock()
        self._create_locks: dict[str, threading.Lock] = {}
        self._gates: dict[str, ComputeGate] = {}

    def _lookup(self, key):
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    @staticmethod
    def _is_current(reranker: Reranker, wanted: Path | None) -> bool:
        return wanted is None or reranker.model_dir == wanted

    def get(self, name: str, threshold: float | None) -> Reranker:
        """Raises ConfigError when the reranker cannot be created (unknown, model missing)."""
        key = (name, threshold)
        wanted = current_model_dir(name, self.settings)
        found = self._lookup(key)
        if found is not None and self._is_current(found, wanted):
            return found
        with self._lock:
            create_lock = self._create_locks.setdefault(name, threading.Lock())
        with create_lock:  # a model is loaded once even when many requests ask at once
            found = self._lookup(key)
            if found is not None and self._is_current(found, wanted):
                return found
            with self._lock:
                # entries of a model no longer wanted go; requests already holding one finish with it
                for stale in [k for k, r in self._items.items() if k[0] == name and not self._is_current(r, wanted)]:
                    del self._items[stale]
                sibling = next((r for (n, _), r in self._items.items() if n == name), None)
            if sibling is not None:
                reranker = sibling.with_threshold(threshold)
            else:
                embedder = self.shared_embedder() if self.shared_embedder is not None else None
                reranker = create_reranker(name, self.settings, threshold, embedder=embedder)
            self.put(name, threshold, reranker)
            return reranker

    def put(self, name: str, threshold: float | None, reranker: Reranker) -> None:
        with self._lock:
            self._items[(name, threshold)] = reranker
            self._items.move_to_end((name, threshold))
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)

    @contextlib.contextmanager
    def gate(self, reranker: Reranker, deadline: float | None = None):
        """Bounds concurrent calls of rerankers that compute locally; yields the
        seconds waited. With a ``deadline`` (time.monotonic()): Overloaded at once when
        the line would not reach this call in time, TimeoutError when no slot frees up
        in time (runtime.ComputeGate)."""
        if not reranker.computes_locally:
            yield 0.0
            return
        with self._lock:
            gate = self._gates.setdefault(reranker.name, ComputeGate(self.settings.rerank_concurrency))
        with gate.enter(deadline) as waited:
            yield waited
