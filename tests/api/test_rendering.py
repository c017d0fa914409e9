"""api/rendering.py: page images rendered in a bounded child, capped, cached."""

from __future__ import annotations

import contextlib
import struct
import time

import pytest

from tests.utils import hostile_pdfs as H
from evidentia.api import rendering
from evidentia.api.rendering import PageRenderer, RenderRefused
from evidentia.config import Settings


def png_size(data: bytes) -> tuple[int, int]:
    return struct.unpack(">II", data[16:24])


@pytest.fixture
def renderer(tmp_path):
    settings = Settings(data_dir=tmp_path / "data", render_memory_mb=150, render_timeout_s=10,
                        render_max_pixels=200_000, render_concurrency=2, render_concurrency_per_tenant=1)
    return PageRenderer(settings)


def test_render_is_bounded_in_pixels_and_cached(renderer, tmp_path):
    pdf = str(H.real_report(tmp_path / "r.pdf", pages=2))
    png = renderer.render("t1", "g1", pdf, 1, 2000, None)
    w, h = png_size(png)
    assert w * h <= 200_000 and w < 2000
    assert renderer.cached("t1", "g1", 1, 2000, None) == png
    assert renderer.cached("t1", "g1", 2, 2000, None) is None
    assert renderer.cached("t1", "g2", 1, 2000, None) is None  # another upload generation: another key
    renderer.forget("t1", "g1")
    assert renderer.cached("t1", "g1", 1, 2000, None) is None


def test_a_huge_image_page_renders_within_the_bounds(renderer, tmp_path):
    pdf = str(H.huge_image(tmp_path / "huge.pdf", side=12000))  # 144 MB of pixels once decoded
    t0 = time.perf_counter()
    w, h = png_size(renderer.render("t1", "g1", pdf, 1, 2000, None))
    assert w * h <= 200_000 and time.perf_counter() - t0 < 10


def test_a_slow_page_fails_with_a_reason_and_is_not_remembered_on_disk(tmp_path):
    """A timeout depends on EVIDENTIA_RENDER_TIMEOUT_S too, not on the PDF alone:
    remembered on disk, it answered 422 after a restart with a longer timeout."""
    tight = PageRenderer(Settings(data_dir=tmp_path / "data", render_timeout_s=1))
    pdf = str(H.spaces_bomb(tmp_path / "spaces.pdf", inflated_mb=512))
    t0 = time.perf_counter()
    with pytest.raises(RenderRefused) as info:
        tight.render("t1", "g1", pdf, 1, 800, None)
    assert time.perf_counter() - t0 < 5
    assert info.value.status == 422 and info.value.code == "page_not_renderable"
    assert str(info.value) == ("page 1 cannot be rendered: page rendering took longer than 1 s "
                               "(EVIDENTIA_RENDER_TIMEOUT_S)")
    assert PageRenderer(Settings(data_dir=tmp_path / "data", render_timeout_s=30)).cached(
        "t1", "g1", 1, 800, None) is None
    assert list(tight.cache_dir.rglob("*.failed")) == []


def _spins(*args) -> None:
    """A page whose render keeps the CPU busy past any limit (a 40 s page of nested fills)."""
    while True:
        pass


def _waits(*args) -> None:
    """A render cut while it waited (a loaded machine gave its child no CPU)."""
    time.sleep(60)


@pytest.fixture
def renders(monkeypatch) -> list[int]:
    """The widths of the renders started (one child each)."""
    from evidentia.indexer.worker import BoundedCall

    widths: list[int] = []
    real_run = BoundedCall.run

    def counted(call):
        widths.append(call.args[2])
        return real_run(call)

    monkeypatch.setattr(BoundedCall, "run", counted)
    return widths


def test_a_page_cut_at_the_time_limit_is_not_rendered_again_for_a_while(tmp_path, monkeypatch, renders):
    """Two tenants asked for such a page with a new highlight each time: each request
    cost the limit's CPU in a render slot, and another tenant's thumbnails got 503."""
    monkeypatch.setattr(rendering, "render_png", _spins)
    renderer = PageRenderer(Settings(data_dir=tmp_path / "data", render_timeout_s=1))
    pdf = str(H.real_report(tmp_path / "r.pdf", pages=2))
    with pytest.raises(RenderRefused) as first:
        renderer.render("t1", "g1", pdf, 1, 2000, ["scope"])
    said = (422, "page_not_renderable", "page 1 cannot be rendered: page rendering took longer than 1 s "
                                         "(EVIDENTIA_RENDER_TIMEOUT_S)")
    assert (first.value.status, first.value.code, str(first.value)) == said
    for width, terms in [(2000, None), (2000, ["other"]), (2000, ["w1x"])]:
        t0 = time.perf_counter()
        with pytest.raises(RenderRefused) as again:
            renderer.cached("t1", "g1", 1, width, terms)
        assert (again.value.status, again.value.code, str(again.value)) == said
        assert time.perf_counter() - t0 < 0.1
    # a narrower image of it may render in time: tried once; cut too, the page is refused at any width
    assert renderer.cached("t1", "g1", 1, 400, None) is None
    with pytest.raises(RenderRefused):
        renderer.render("t1", "g1", pdf, 1, 400, ["scope"])
    for width in (50, 399, 1200, 2000):
        with pytest.raises(RenderRefused) as again:
            renderer.cached("t1", "g1", 1, width, ["any"])
        assert (again.value.status, again.value.code, str(again.value)) == said
    assert renders == [2000, 400]
    # that page of that upload only, in memory only (a restart may have another limit), for a while
    assert renderer.cached("t1", "g1", 2, 2000, None) is None
    assert renderer.cached("t1", "g2", 1, 2000, None) is None
    assert renderer.cached("t2", "g1", 1, 2000, None) is None
    assert PageRenderer(Settings(data_dir=tmp_path / "data", render_timeout_s=1)).cached(
        "t1", "g1", 1, 2000, None) is None
    later = time.monotonic() + rendering.TIMEOUT_REMEMBERED_S + 1
    monkeypatch.setattr(rendering.time, "monotonic", lambda: later)
    assert renderer.cached("t1", "g1", 1, 2000, None) is None
    monkeypatch.undo()
    renderer.forget("t1", "g1")


def test_a_render_cut_while_it_waited_for_the_cpu_is_not_remembered(tmp_path, monkeypatch, renders):
    """The reason timeouts were never remembered: under load a page may be cut through no
    fault of its own. A child cut with little CPU used waited; one that used it did not."""
    renderer = PageRenderer(Settings(data_dir=tmp_path / "data", render_timeout_s=1, render_concurrency=2))
    pdf = str(H.real_report(tmp_path / "r.pdf", pages=1))
    monkeypatch.setattr(rendering, "render_png", _waits)
    for _ in range(2):
        with pytest.raises(RenderRefused, match="took longer than 1 s"):
            renderer.render("t1", "g1", pdf, 1, 800, None)
        assert renderer.cached("t1", "g1", 1, 800, None) is None
    monkeypatch.setattr(rendering, "render_png", _spins)
    with pytest.raises(RenderRefused, match="took longer than 1 s"):
        renderer.render("t1", "g1", pdf, 1, 800, None)
    with pytest.raises(RenderRefused, match="took longer than 1 s"):
        renderer.cached("t1", "g1", 1, 800, None)
    assert renders == [800, 800, 800]


def test_a_malformed_pdf_is_remembered_under_its_memory_cap(tmp_path):
    pdf = tmp_path / "bad.pdf"
    pdf.write_bytes(b"%PDF-1.7\nnot a PDF at all")
    renderer = PageRenderer(Settings(data_dir=tmp_path / "data"))
    with pytest.raises(RenderRefused, match="malformed") as info:
        renderer.render("t1", "g1", str(pdf), 1, 800, None)
    assert info.value.status == 422
    t0 = time.perf_counter()
    with pytest.raises(RenderRefused, match="malformed"):
        renderer.cached("t1", "g1", 1, 800, None)  # the PDF's own failure: no second child
    assert time.perf_counter() - t0 < 0.1
    # a verdict under one EVIDENTIA_RENDER_MEMORY_MB says nothing under another
    assert PageRenderer(Settings(data_dir=tmp_path / "data", render_memory_mb=999)).cached(
        "t1", "g1", 1, 800, None) is None


@pytest.mark.parametrize("when", ["before the child opens it", "after the child rendered it"])
def test_a_file_deleted_during_the_render_is_409_and_leaves_nothing_cached(renderer, tmp_path, monkeypatch, when):
    """A delete (or a swap) between the route's lookup and the end of the render: the
    missing file read as a malformed PDF (422, remembered), and the delete's own
    ``forget`` ran before the render stored, leaving the gone upload's folder behind."""
    from evidentia.indexer.worker import BoundedCall

    pdf = H.real_report(tmp_path / "r.pdf", pages=1)
    real_run = BoundedCall.run

    def run_while_deleted(call):
        if when.startswith("before"):
            pdf.unlink()
        result = real_run(call)
        if when.startswith("after"):
            pdf.unlink()
            renderer.forget("t1", "g1")  # as DELETE /v1/documents/{id} does
        return result

    monkeypatch.setattr(BoundedCall, "run", run_while_deleted)
    with pytest.raises(RenderRefused) as info:
        renderer.render("t1", "g1", str(pdf), 1, 800, None)
    assert (info.value.status, info.value.code) == (409, "document_changed")
    assert not (renderer.cache_dir / "t1" / "g1").exists()


def test_concurrency_caps_per_tenant_and_in_all(renderer):
    with renderer.slot("a"):
        with pytest.raises(RenderRefused) as info:
            with renderer.slot("a"):
                pass
        assert info.value.status == 429 and "EVIDENTIA_RENDER_CONCURRENCY_PER_TENANT" in str(info.value)
        with renderer.slot("b"):
            with pytest.raises(RenderRefused) as info:
                with renderer.slot("c"):
                    pass
            assert info.value.status == 503 and info.value.retry_after == 1
    with renderer.slot("a"), renderer.slot("c"):  # slots are given back
        pass


@pytest.mark.parametrize("slots", [2, 3])
def test_one_tenant_never_holds_every_render_slot(tmp_path, slots):
    """Whatever EVIDENTIA_RENDER_CONCURRENCY_PER_TENANT says, another tenant's image finds a slot."""
    renderer = PageRenderer(Settings(data_dir=tmp_path / "data", render_concurrency=slots,
                                     render_concurrency_per_tenant=slots))
    with contextlib.ExitStack() as held:
        for _ in range(slots - 1):
            held.enter_context(renderer.slot("a"))
        with pytest.raises(RenderRefused) as info:
            held.enter_context(renderer.slot("a"))
        assert info.value.status == 429 and f"at most {slots - 1} page image(s)" in str(info.value)
        held.enter_context(renderer.slot("b"))
    # a server rendering one page image at a time gives it to whoever asks
    single = PageRenderer(Settings(data_dir=tmp_path / "data", render_concurrency=1))
    with single.slot("a"):
        pass
    # a server of one tenant keeps every slot for it
    alone = PageRenderer(Settings(data_dir=tmp_path / "data", render_concurrency=slots,
                                  render_concurrency_per_tenant=slots), shared=lambda: False)
    with contextlib.ExitStack() as held:
        for _ in range(slots):
            held.enter_context(alone.slot("a"))


@pytest.mark.parametrize("render", [_spins, _waits], ids=["cut working", "cut waiting"])
def test_a_tenant_whose_pages_ran_past_the_limit_leaves_the_last_slot_to_others(tmp_path, monkeypatch, render):
    """Two tenants each asking for pages that run to the limit held both slots; with
    pages of their own to spare (a remembered timeout is per page), they still would.
    A render cut while it waited held its slot as long: it counts too."""
    monkeypatch.setattr(rendering, "render_png", render)
    renderer = PageRenderer(Settings(data_dir=tmp_path / "data", render_timeout_s=1, render_concurrency=2))
    pdf = str(H.real_report(tmp_path / "r.pdf", pages=1))
    with pytest.raises(RenderRefused):
        renderer.render("slow", "g1", pdf, 1, 800, None)
    with renderer.slot("victim"):
        with pytest.raises(RenderRefused) as info:
            with renderer.slot("slow"):
                pass
        assert info.value.status == 429 and info.value.retry_after == 1
        assert "EVIDENTIA_RENDER_TIMEOUT_S" in str(info.value)
    with renderer.slot("slow"):  # alone it still renders, and leaves the last slot to the others
        with renderer.slot("victim"):
            pass
    later = time.monotonic() + rendering.TIMEOUT_REMEMBERED_S + 1
    monkeypatch.setattr(rendering.time, "monotonic", lambda: later)
    with renderer.slot("victim"), renderer.slot("slow"):  # for a while
        pass


def test_a_missing_file_asks_for_a_retry(renderer, tmp_path):
    with pytest.raises(RenderRefused) as info:
        renderer.render("t1", "g1", str(tmp_path / "gone.pdf"), 1, 800, None)
    assert info.value.status == 409 and str(tmp_path) not in str(info.value)


def test_concurrent_requests_of_one_tenant_wait_for_a_slot_and_share_the_render(tmp_path):
    """The web page loads three thumbnails at once while a tenant may render one
    page at a time: the others wait (without a thread) and mostly find the
    image the first one rendered."""
    import threading

    from fastapi.testclient import TestClient

    from tests.utils.api import make_app, new_tenant, ready_document, services_of, wait_ready

    pdf = H.real_report(tmp_path / "r.pdf", pages=3)
    with TestClient(make_app(tmp_path)) as c:
        wait_ready(c)
        h = new_tenant(c)
        ready_document(c, h, pdf, "report")
        statuses: list[int] = []
        urls = [f"/v1/documents/report/pages/{1 + i % 3}.png?width=300" for i in range(9)]

        def get(url: str) -> None:
            statuses.append(c.get(url, headers=h).status_code)

        threads = [threading.Thread(target=get, args=(u,)) for u in urls]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert statuses == [200] * 9
        cache = services_of(c).renderer.cache_dir
        assert len(list(cache.rglob("*.png"))) == 3  # one render per page
