"""Progress of long work, where a person looks: a live bar on a terminal, and a
plain line every few seconds (and at the end) when the output is a pipe or a
file (CI logs, `tee`), where a bar would be either invisible or a mess of
carriage returns."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """``with Progress(total, "indexing", "doc") as bar: bar.update(); bar.note("120 pages")``."""

    def __init__(self, total: int | None, desc: str, unit: str = "it", *, show: bool = True,
                 every_s: float = 10.0, stream: TextIO | None = None) -> None:
        self.total = total
        self.desc = desc
        self.unit = unit
        self.every_s = every_s
        self.stream = stream or sys.stderr
        self.done = 0
        self.extra = ""
        self._start = self._last = time.monotonic()
        self._bar = None
        self._plain = False
        if not show:
            return
        if _is_terminal(self.stream):
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream)
        else:
            self._plain = True

    def update(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
        self._maybe_print()

    def note(self, text: str) -> None:
        """What else to show beside the count (pages done, pages embedded, OCR...)."""
        self.extra = text
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=True)
        self._maybe_print()

    def line(self) -> str:
        count = f"{self.done}/{self.total}" if self.total is not None else str(self.done)
        elapsed = time.monotonic() - self._start
        extra = f", {self.extra}" if self.extra else ""
        return f"{self.desc}: {count} {self.unit}{extra} ({elapsed:.0f} s)"

    def _maybe_print(self, force: bool = False) -> None:
        if not self._plain:
            return
        now = time.monotonic()
        if force or now - self._last >= self.every_s:
            self._last = now
            print(self.line(), file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self._plain:
            self._maybe_print(force=True)
            self._plain = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
