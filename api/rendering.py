"""Page images (GET /v1/documents/{id}/pages/{n}.png), rendered in a bounded child
process, bounded in size, in concurrency and in time, and cached on disk.

Rendering a hostile page is as dangerous as extracting it (issue #15: twelve
concurrent renders of one page stalled /health for 69 s), so it runs like the
extraction (indexer/worker.py): one child per render, under
EVIDENTIA_RENDER_MEMORY_MB and EVIDENTIA_RENDER_TIMEOUT_S, with the image
scaled down to at most EVIDENTIA_RENDER_MAX_PIXELS. At most
EVIDENTIA_RENDER_CONCURRENCY_PER_TENANT renders of one tenant run at once
(429 beyond) and EVIDENTIA_RENDER_CONCURRENCY in all (503 beyond): a request
over the cap is answered at once rather than queued, so a flood never piles
up threads or processes. Where the server renders more than one at once, one
tenant holds at most all slots but one, and the tenants whose renders ran past
the time limit lately do not take the last free slot: two tenants asking for
the images of a page that takes 40 s of CPU held both slots for their 20 s
each, over and over, and another tenant's thumbnails got 503 for 10 of 13
requests in a minute.

Images are cached under ``<data dir>/page-cache/<tenant>/<generation>/``: the
upload generation is part of the key, so a re-indexed document never shows a
stale image, and a delete or a swap removes the folder (and the start-up sweeps
the folders of uploads no longer stored: api/services.py). A page that cannot be
rendered because of the PDF itself (malformed, or over the memory cap: the
marker's name holds the cap) is remembered too (a ``.failed`` file with the
reason), so asking again costs nothing; a crashed child or a file gone
meanwhile says more about the server's state than about the PDF and is never
remembered. A timeout is remembered only for a while and only in memory (a
stale one on disk outlived a restart with another limit), and only when the
child had a fair share of the limit in CPU time: cut while it waited for a
loaded machine, it says nothing about the PDF. Forgotten, each request for
such a page cost the limit's CPU again, whatever its width or highlight: the
remembered timeout answers the same 422 for that page at that width and wider
(rendering costs its pixels: a page cut at 2000 pixels may well show at 400)
and, once a second width was cut too, at any width.
An image or a failure found after its file went (a delete or a swap during the
render) is not kept either: the generation's folder would outlive its upload.
The cache is bounded (EVIDENTIA_RENDER_CACHE_MB; oldest files go first).

Nothing here imports FastAPI: the child process imports this module to find
``render_png``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import math
import os
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

log = logging.getLogger("evidentia.api")

PNG_MAX_HEIGHT = 6000  # a strip-shaped page must not become a huge image
# WorkFailed kinds that are the PDF's own and so worth remembering (see the module's doc)
REMEMBERED_FAILURES = ("invalid", "memory")
# A page whose render ran past EVIDENTIA_RENDER_TIMEOUT_S is answered 422 without a
# render for this long (a few minutes: an unlucky verdict on a heavy page heals by
# itself, an attacker's page costs a render slot once in this time, not each request),
TIMEOUT_REMEMBERED_S = 600.0
# when its child had at least this share of the limit in CPU time (or the time is
# unknown). Far below 1: the server, the other renders and the extractions share the
# machine: a 40 s page cut at 20 s had 13 to 19 s of CPU with two such renders, the
# server and other work on two cores, and below 10 s on a busier machine.
TIMEOUT_CPU_SHARE = 0.25
TIMEOUTS_KEPT = 10_000  # pages remembered at most (the oldest go first)


@dataclasses.dataclass
class TimedOut:
    """A page's render ran past the limit: at ``width`` (the narrowest cut so far),
    ``cuts`` times, said by ``reason``, remembered until ``until`` (monotonic)."""

    width: int
    cuts: int
    reason: str
    until: float

    def refuses(self, width: int) -> bool:
        # twice cut (a narrower width was asked for and cut too): the page as a whole,
        # else a narrower image than the one cut, which may render in time, still may
        return self.cuts >= 2 or width >= self.width


class RenderRefused(Exception):
    """A render that is not done: ``status`` (HTTP), ``code`` and a one-line message."""

    def __init__(self, status: int, code: str, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.retry_after = retry_after


def render_png(path: str, page: int, width: int, terms: list[str] | None, max_pixels: int) -> bytes:
    """Runs in the child: the page as PNG, ``width`` pixels wide unless that
    makes it taller than PNG_MAX_HEIGHT or larger than ``max_pixels``."""
    import pymupdf

    from evidentia.api.highlight import mark_page

    with pymupdf.open(path, filetype="pdf") as doc:
        p = doc.load_page(page - 1)
        if terms:
            mark_page(p, terms)  # in memory only: the stored PDF is never written
        rect = p.rect
        zoom = width / rect.width if rect.width else 1.0
        if rect.height * zoom > PNG_MAX_HEIGHT:
            zoom = PNG_MAX_HEIGHT / rect.height
        pixels = rect.width * zoom * rect.height * zoom
        if pixels > max_pixels:
            zoom *= math.sqrt(max_pixels / pixels) * 0.995  # rounding up must not pass the cap
        return p.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom), alpha=False).tobytes("png")


class PageRenderer:
    def __init__(self, settings, shared: "Callable[[], bool]" = lambda: True) -> None:
        """``shared()``: whether the server has other tenants (the slot rules that keep a
        slot for them apply then; a server of one tenant keeps every slot)."""
        self.settings = settings
        self._shared = shared
        self.cache_dir = Path(settings.data_dir) / "page-cache"
        self._lock = threading.Lock()
        self._running: dict[str, int] = {}
        self._cache_bytes: int | None = None  # counted on first write
        self._timed_out: dict[tuple[str, str, int], TimedOut] = {}  # (tenant, generation, page), oldest first
        # tenant: until when its last timeout counts. Any timeout, with or without CPU: the
        # render held its slot for the whole limit whatever the reason, and may again
        self._tenant_timed_out: dict[str, float] = {}

    # -- concurrency ---------------------------------------------------------
    @contextlib.contextmanager
    def slot(self, tenant: str):
        """One render slot for ``tenant``, or RenderRefused (429: the tenant's
        cap, 503: the server's) at once."""
        settings = self.settings
        slots = settings.render_concurrency
        try:
            shared = self._shared()
        except Exception:  # the store unreadable (shutting down): the safe side
            shared = True
        # one tenant never holds every slot of a server that has several (whatever
        # EVIDENTIA_RENDER_CONCURRENCY_PER_TENANT says): another tenant's image finds one
        per_tenant = settings.render_concurrency_per_tenant
        if shared and per_tenant > max(1, slots - 1):
            per_tenant = max(1, slots - 1)
            which = (f"EVIDENTIA_RENDER_CONCURRENCY_PER_TENANT, within EVIDENTIA_RENDER_CONCURRENCY's {slots} "
                     "less one kept for the other tenants")
        else:
            which = "EVIDENTIA_RENDER_CONCURRENCY_PER_TENANT"
        with self._lock:
            mine = self._running.get(tenant, 0)
            running = sum(self._running.values())
            if mine >= per_tenant:
                raise RenderRefused(429, "too_many_renders", f"at most {per_tenant} "
                                    f"page image(s) render at once per tenant ({which}); retry in a second", 1)
            if running >= slots:
                raise RenderRefused(503, "render_busy", f"the server is rendering {slots} "
                                    f"page images already (EVIDENTIA_RENDER_CONCURRENCY); retry in a second", 1)
            if shared and slots > 1 and running == slots - 1 and self._timed_out_lately(tenant):
                # a tenant whose pages run past the limit may well hold its slot for the whole
                # limit again: the last free slot is kept for the others' images
                raise RenderRefused(429, "too_many_renders", "page images of this tenant ran past "
                                    "EVIDENTIA_RENDER_TIMEOUT_S lately, and the server's last free render slot "
                                    "is kept for other tenants; retry in a second", 1)
            self._running[tenant] = mine + 1
        try:
            yield
        finally:
            with self._lock:
                self._running[tenant] -= 1
                if not self._running[tenant]:
                    del self._running[tenant]

    def _timed_out_lately(self, tenant: str) -> bool:
        """Called under the lock."""
        until = self._tenant_timed_out.get(tenant)
        if until is not None and until <= time.monotonic():
            del self._tenant_timed_out[tenant]
            return False
        return until is not None

    # -- remembered timeouts (see the module's doc) ----------------------------
    def _timed_out_now(self, tenant: str) -> None:
        with self._lock:
            self._tenant_timed_out[tenant] = time.monotonic() + TIMEOUT_REMEMBERED_S

    def _remember_timeout(self, tenant: str, generation: str, page: int, width: int, reason: str) -> None:
        until = time.monotonic() + TIMEOUT_REMEMBERED_S
        key = (tenant, generation, page)
        with self._lock:
            known = self._timed_out.pop(key, None)
            if known is not None and known.until > time.monotonic():
                known.width, known.cuts, known.until = min(known.width, width), known.cuts + 1, until
            else:
                known = TimedOut(width, 1, reason, until)
            self._timed_out[key] = known  # to the end: the oldest stay first
            while len(self._timed_out) > TIMEOUTS_KEPT:
                del self._timed_out[next(iter(self._timed_out))]

    def _known_timeout(self, tenant: str, generation: str, page: int, width: int) -> str | None:
        """The reason of a remembered timeout that answers this request, None if none does."""
        key = (tenant, generation, page)
        with self._lock:
            known = self._timed_out.get(key)
            if known is None:
                return None
            if known.until <= time.monotonic():
                del self._timed_out[key]
                return None
            return known.reason if known.refuses(width) else None

    # -- cache ---------------------------------------------------------------
    def _entry(self, tenant: str, generation: str, page: int, width: int, terms: list[str] | None) -> Path:
        terms_key = hashlib.sha256("\x1f".join(terms or []).encode()).hexdigest()[:16] if terms else "plain"
        return self.cache_dir / tenant / generation / f"{page}-{width}-{terms_key}"

    def cached(self, tenant: str, generation: str, page: int, width: int, terms: list[str] | None) -> bytes | None:
        """The cached PNG, None when there is none; RenderRefused when the page
        is known not to render within the limits."""
        entry = self._entry(tenant, generation, page, width, terms)
        try:
            return entry.with_suffix(".png").read_bytes()
        except OSError:
            pass
        try:
            reason = self._failure_marker(entry).read_text()
        except OSError:
            reason = self._known_timeout(tenant, generation, page, width)
            if reason is None:
                return None
        raise RenderRefused(422, "page_not_renderable", reason)

    def _failure_marker(self, entry: Path) -> Path:
        # a page over the memory cap may render under a higher one: a restart with another
        # EVIDENTIA_RENDER_MEMORY_MB must not find the old verdict
        return entry.with_name(f"{entry.name}-{self.settings.render_memory_mb}mb.failed")

    def _store(self, target: Path, data: bytes) -> None:
        if self.settings.render_cache_mb <= 0:
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".tmp-{uuid.uuid4().hex}"
        tmp.write_bytes(data)
        os.replace(tmp, target)
        with self._lock:
            if self._cache_bytes is None:
                self._cache_bytes = sum(f.stat().st_size for f in self.cache_dir.rglob("*") if f.is_file())
            else:
                self._cache_bytes += len(data)
            if self._cache_bytes > self.settings.render_cache_mb << 20:
                self._evict()

    def _evict(self) -> None:
        """Oldest files first, down to 80 % of the cap (called under the lock)."""
        files = []
        for f in self.cache_dir.rglob("*"):
            with contextlib.suppress(OSError):
                if f.is_file():
                    st = f.stat()
                    files.append((st.st_mtime, st.st_size, f))
        files.sort()
        total = sum(size for _, size, _ in files)
        target = 0.8 * (self.settings.render_cache_mb << 20)
        for _, size, f in files:
            if total <= target:
                break
            f.unlink(missing_ok=True)
            total -= size
        self._cache_bytes = total

    def forget(self, tenant: str, generation: str | None = None) -> None:
        """Drop the cached images of one upload (or of the whole tenant)."""
        target = self.cache_dir / tenant / generation if generation else self.cache_dir / tenant
        shutil.rmtree(target, ignore_errors=True)
        with self._lock:
            self._cache_bytes = None
            for key in [k for k in self._timed_out if k[0] == tenant and generation in (None, k[1])]:
                del self._timed_out[key]

    # -- rendering -----------------------------------------------------------
    def render(self, tenant: str, generation: str, path: str, page: int, width: int,
               terms: list[str] | None) -> bytes:
        """Blocking (run it in a thread, inside ``slot``): the PNG, rendered in a
        bounded child and cached; RenderRefused with the reason otherwise."""
        from evidentia.indexer.worker import BoundedCall, WorkFailed

        changed = RenderRefused(409, "document_changed", "the document changed while the page was asked for; "
                                "retry", 1)
        if not Path(path).is_file():  # re-indexed (the old file is gone) or deleted meanwhile
            raise changed
        settings = self.settings
        entry = self._entry(tenant, generation, page, width, terms)
        call = BoundedCall(render_png, (path, page, width, terms, settings.render_max_pixels),
                           timeout_s=settings.render_timeout_s, memory_mb=settings.render_memory_mb,
                           what="page rendering", setting="EVIDENTIA_RENDER")
        try:
            png = call.run()
        except WorkFailed as exc:
            reason = f"page {page} cannot be rendered: {exc}"
            if exc.kind in REMEMBERED_FAILURES:
                self._store(self._failure_marker(entry), reason.encode())
            elif exc.kind == "timeout":
                self._timed_out_now(tenant)
                worked = call.cpu_s is None or call.cpu_s >= TIMEOUT_CPU_SHARE * settings.render_timeout_s
                if worked:
                    self._remember_timeout(tenant, generation, page, width, reason)
                log.info("page %d (width %d) of %s's upload %s cut at EVIDENTIA_RENDER_TIMEOUT_S after %s s of "
                         "CPU: %s", page, width, tenant, generation,
                         "?" if call.cpu_s is None else f"{call.cpu_s:.1f}",
                         f"answered 422 for {TIMEOUT_REMEMBERED_S / 60:g} min" if worked else "not remembered")
            self._check_still_there(tenant, generation, path, changed)  # a missing file reads as malformed
            raise RenderRefused(422, "page_not_renderable", reason) from None
        self._store(entry.with_suffix(".png"), png)
        self._check_still_there(tenant, generation, path, changed)
        return png

    def _check_still_there(self, tenant: str, generation: str, path: str, changed: RenderRefused) -> None:
        """After storing: the file went during the render (a delete or a swap, whose own
        ``forget`` may have run before the store), so its generation is gone for good;
        drop what was stored and say so. Checked after the store, not before: a delete
        between a check and the store would leave the folder behind."""
        if not Path(path).is_file():
            self.forget(tenant, generation)
            raise changed
