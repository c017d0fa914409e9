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
up threads or processes.

Images are cached under ``<data dir>/page-cache/<tenant>/<generation>/``: the
upload generation is part of the key, so a re-indexed document never shows a
stale image, and a delete or a swap removes the folder (and the start-up sweeps
the folders of uploads no longer stored: api/services.py). A page that cannot be
rendered because of the PDF itself (malformed, or over the memory cap: the
marker's name holds the cap) is remembered too (a ``.failed`` file with the
reason), so asking again costs nothing; a timeout, a crashed child or a file
gone meanwhile says more about the server's load or state than about the PDF
and is never remembered (a stale one outlived a restart with another limit).
An image or a failure found after its file went (a delete or a swap during the
render) is not kept either: the generation's folder would outlive its upload.
The cache is bounded (EVIDENTIA_RENDER_CACHE_MB; oldest files go first).

Nothing here imports FastAPI: the child process imports this module to find
``render_png``.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import shutil
import threading
import uuid
from pathlib import Path

PNG_MAX_HEIGHT = 6000  # a strip-shaped page must not become a huge image
# WorkFailed kinds that are the PDF's own and so worth remembering (see the module's doc)
REMEMBERED_FAILURES = ("invalid", "memory")


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
    def __init__(self, settings) -> None:
        self.settings = settings
        self.cache_dir = Path(settings.data_dir) / "page-cache"
        self._lock = threading.Lock()
        self._running: dict[str, int] = {}
        self._cache_bytes: int | None = None  # counted on first write

    # -- concurrency ---------------------------------------------------------
    @contextlib.contextmanager
    def slot(self, tenant: str):
        """One render slot for ``tenant``, or RenderRefused (429: the tenant's
        cap, 503: the server's) at once."""
        settings = self.settings
        with self._lock:
            mine = self._running.get(tenant, 0)
            if mine >= settings.render_concurrency_per_tenant:
                raise RenderRefused(429, "too_many_renders", f"at most {settings.render_concurrency_per_tenant} "
                                    f"page image(s) render at once per tenant "
                                    f"(EVIDENTIA_RENDER_CONCURRENCY_PER_TENANT); retry in a second", 1)
            if sum(self._running.values()) >= settings.render_concurrency:
                raise RenderRefused(503, "render_busy", f"the server is rendering {settings.render_concurrency} "
                                    f"page images already (EVIDENTIA_RENDER_CONCURRENCY); retry in a second", 1)
            self._running[tenant] = mine + 1
        try:
            yield
        finally:
            with self._lock:
                self._running[tenant] -= 1
                if not self._running[tenant]:
                    del self._running[tenant]

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
