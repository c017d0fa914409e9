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
stale image, and a delete or a swap removes the folder. A page that cannot be
rendered within the limits is remembered too (a ``.failed`` file with the
reason), so asking again costs nothing. The cache is bounded
(EVIDENTIA_RENDER_CACHE_MB; oldest files go first).

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
            reason = entry.with_suffix(".failed").read_text()
        except OSError:
            return None
        raise RenderRefused(422, "page_not_renderable", reason)

    def _store(self, entry: Path, suffix: str, data: bytes) -> None:
        if self.settings.render_cache_mb <= 0:
            return
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = entry.parent / f".tmp-{uuid.uuid4().hex}"
        tmp.write_bytes(data)
        os.replace(tmp, entry.with_suffix(suffix))
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

        if not Path(path).is_file():  # re-indexed (the old file is gone) or deleted meanwhile
            raise RenderRefused(409, "document_changed", "the document changed while the page was asked for; "
                                "retry", 1)
        settings = self.settings
        entry = self._entry(tenant, generation, page, width, terms)
        call = BoundedCall(render_png, (path, page, width, terms, settings.render_max_pixels),
                           timeout_s=settings.render_timeout_s, memory_mb=settings.render_memory_mb,
                           what="page rendering", setting="EVIDENTIA_RENDER")
        try:
            png = call.run()
        except WorkFailed as exc:
            reason = f"page {page} cannot be rendered: {exc}"
            if exc.kind in ("timeout", "memory", "invalid", "crashed"):
                self._store(entry, ".failed", reason.encode())
            raise RenderRefused(422, "page_not_renderable", reason) from None
        self._store(entry, ".png", png)
        return png
