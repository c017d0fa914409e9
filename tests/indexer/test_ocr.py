"""OCR of scanned pages (indexer/ocr.py): scans are generated here by writing real
text on a page, rendering it and building an image-only PDF. Tests that run
Tesseract skip where it (or a language pack) is not installed; the tests of a
missing Tesseract point the engine at a binary that does not exist and always run."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pymupdf
import pytest
from typer.testing import CliRunner

from evidentia.config import ConfigError, Settings
from evidentia.indexer import ocr as ocr_mod
from evidentia.language import LanguageDetector
from evidentia.indexer.ocr import OcrEngine, is_garbage, parse_tsv, read_page
from evidentia.indexer.pdf import PdfError, extract_pages
from evidentia.indexing import embed_document, index_paths, unread_reason
from evidentia.records import Document, Page
from evidentia.retriever import elasticsearch_backend as esb
from evidentia.retriever.tantivy_backend import TantivyBackend
from tests.utils.processes import running
from tests.utils.scans import CAPTION, TEXTS, figure_pdf, scanned_pdf, write_page

WORD = re.compile(r"[^\W\d_]{3,}")

TESSERACT = OcrEngine.probe(dpi=150)  # 12-point text reads as well at 150 dpi, twice as fast
needs_tesseract = pytest.mark.skipif(
    not {"eng", "fra", "deu"} <= set(TESSERACT.installed),
    reason=f"Tesseract with eng, fra and deu is not installed ({TESSERACT.problem or TESSERACT.installed}); "
           f"{ocr_mod.INSTALL_HINT}")
MISSING = OcrEngine.probe(command="/nonexistent/bin/tesseract")


def words(text: str) -> list[str]:
    return [w.lower() for w in WORD.findall(text)]


@pytest.fixture(scope="module")
def three_languages(tmp_path_factory) -> Path:
    return scanned_pdf(tmp_path_factory.mktemp("scans") / "certificates.pdf", [TEXTS["en"], TEXTS["fr"], TEXTS["de"]])


@pytest.fixture(scope="module")
def ocr_document(three_languages) -> Document:
    assert TESSERACT.available or pytest.skip("no Tesseract")
    return extract_pages(three_languages, "certificates", LanguageDetector(), ocr=TESSERACT)


# -- reading scans ----------------------------------------------------------------------
@needs_tesseract
@pytest.mark.parametrize("index, language", [(0, "en"), (1, "fr"), (2, "de")])
def test_scanned_words_come_back_in_their_language(ocr_document, index, language):
    page = ocr_document.pages[index]
    assert page.text_source == "ocr" and page.language == language
    assert page.ocr_confidence is not None and page.ocr_confidence > 75
    expected = words(TEXTS[language])
    got = set(words(page.text))
    recall = sum(w in got for w in expected) / len(expected)
    assert recall >= 0.9, (recall, page.text)
    # accented words need the page's own language model, not the first page's English one
    accented = {"en": "environmental", "fr": "société", "de": "wiederverwertung"}[language]
    assert accented in got


@needs_tesseract
def test_document_counts_and_timing(ocr_document):
    assert ocr_document.ocr_pages == 3 and ocr_document.unread_pages == 0 and ocr_document.empty_pages == 0
    assert 75 < ocr_document.ocr_confidence <= 100
    assert ocr_document.ocr_seconds > 0


@needs_tesseract
def test_scanned_page_is_found_by_bm25(ocr_document, backend):
    backend.index_document(ocr_document)
    for keywords, page in ((["dupont", "câbles", "certificat"], 2), (["müller", "kupferdraht"], 3),
                           (["northwind", "copper", "wire"], 1)):
        found = backend.search(keywords, ["certificates"], 3)
        assert found and found[0].page == page, (keywords, found)
    stored = backend.get_page("certificates", 2)
    assert stored.text_source == "ocr" and stored.ocr_confidence == ocr_document.pages[1].ocr_confidence
    info = backend.get_document("certificates")
    assert (info.ocr_pages, info.unread_pages, info.ocr_confidence) == (3, 0, ocr_document.ocr_confidence)


@needs_tesseract
def test_scanned_page_is_found_by_dense_search(ocr_document, tmp_path):
    from evidentia.retriever.dense import PageEmbedder

    try:
        embedder = PageEmbedder()
        embedder.dim
    except Exception as exc:  # the model package is optional
        pytest.skip(f"no embedding model: {exc}")
    with TantivyBackend(tmp_path / "dense-index") as b:
        b.index_document(embed_document(ocr_document, embedder))
        query = embedder.embed_query("Which supplier of copper wire holds an ISO 14001 environmental certificate?")
        found = b.search_dense(query, ["certificates"], 3)
    assert found[0].page == 1, found


@needs_tesseract
def test_a_digital_page_guides_the_ocr_language(tmp_path):
    # page 2 has a French text layer... no: the filler is English, so the prior is English;
    # the French scan is still read with the French model once its language shows
    path = scanned_pdf(tmp_path / "mixed.pdf", [None, TEXTS["fr"]])
    document = extract_pages(path, "mixed", LanguageDetector(), ocr=TESSERACT)
    assert [p.text_source for p in document.pages] == ["text", "ocr"]
    assert [p.language for p in document.pages] == ["en", "fr"]
    assert "société" in document.pages[1].text and "émissions" in document.pages[1].text


@needs_tesseract
def test_garbage_text_layer_is_read_as_a_scan(tmp_path):
    junk = " ".join(["Xqzt Brkfl Mnpw Trzx Hjkl Qwrt Pstv Znmb"] * 6)
    path = scanned_pdf(tmp_path / "junk.pdf", [TEXTS["en"]], junk_layer=junk)
    assert is_garbage(pymupdf.open(path)[0].get_text())
    page = extract_pages(path, "junk", LanguageDetector(), ocr=TESSERACT).pages[0]
    assert page.text_source == "ocr" and "xqzt" not in page.text.lower() and "northwind" in page.text.lower()
    # without OCR the junk is neither shown nor searched, and the page counts as unread
    off = extract_pages(path, "junk", LanguageDetector(), ocr=OcrEngine.probe(mode="off"))
    assert off.pages[0].text == "" and off.pages[0].text_source == "unread" and off.unread_pages == 1


@needs_tesseract
def test_force_reads_text_pages_too_and_blank_pages_are_not_ocrd(tmp_path):
    doc = pymupdf.open()
    write_page(doc, TEXTS["en"])
    doc.new_page()
    doc.save(tmp_path / "digital.pdf")
    on = extract_pages(tmp_path / "digital.pdf", "d", LanguageDetector(), ocr=TESSERACT)
    assert [p.text_source for p in on.pages] == ["text", "none"] and on.ocr_seconds == 0
    forced = extract_pages(tmp_path / "digital.pdf", "d", LanguageDetector(),
                           ocr=OcrEngine.probe(mode="force", dpi=150))
    assert [p.text_source for p in forced.pages] == ["ocr", "none"]
    assert "northwind" in forced.pages[0].text.lower()


@needs_tesseract
def test_a_stamp_on_a_scan_does_not_hide_it(tmp_path):
    # a scan carrying a short real text layer (a page number, a stamp) is still read
    path = scanned_pdf(tmp_path / "stamped.pdf", [TEXTS["en"]])
    doc = pymupdf.open(path)
    doc[0].insert_text((380, 290), "p. 1", fontsize=6)
    doc.save(tmp_path / "stamped2.pdf")
    page = extract_pages(tmp_path / "stamped2.pdf", "s", LanguageDetector(), ocr=TESSERACT).pages[0]
    assert page.text_source == "ocr" and "northwind" in page.text.lower()


def test_a_captioned_figure_is_sent_to_ocr_and_a_text_page_is_not(tmp_path):
    figure = pymupdf.open(figure_pdf(tmp_path / "figure.pdf", TEXTS["en"]))[0]
    layer = figure.get_text()
    assert 50 <= ocr_mod.letters(layer) < ocr_mod.FIGURE_CAPTION_LETTERS
    assert ocr_mod.needs_ocr(figure, layer)
    # the same caption on a page without a picture is the page's whole text
    plain = pymupdf.open().new_page(width=420, height=300)
    plain.insert_text((24, 20), CAPTION, fontsize=7, fontname="helv")
    assert not ocr_mod.needs_ocr(plain, plain.get_text())
    # the OCR replaces a caption only when it reads twice its letters
    assert not ocr_mod.ocr_replaces(CAPTION + " a few letters", CAPTION)
    assert ocr_mod.ocr_replaces(CAPTION + " " + TEXTS["en"], CAPTION)
    assert ocr_mod.ocr_replaces("p. 1 and a stamp", "p. 1")  # a scan's stamp: any improvement


@needs_tesseract
def test_a_figure_printed_as_an_image_is_read_with_its_caption(tmp_path):
    page = extract_pages(figure_pdf(tmp_path / "figure.pdf", TEXTS["en"]), "f", LanguageDetector(),
                         ocr=TESSERACT).pages[0]
    assert page.text_source == "ocr"
    found = set(words(page.text))
    assert {"northwind", "copper", "greenhouse"} <= found  # the figure's own words
    assert {"overview", "certified", "audit"} <= found  # and its caption's


@needs_tesseract
def test_a_photo_keeps_its_caption_exactly(tmp_path):
    page = extract_pages(figure_pdf(tmp_path / "photo.pdf", None), "p", LanguageDetector(), ocr=TESSERACT).pages[0]
    assert page.text_source == "text" and page.text.split() == CAPTION.split()


@needs_tesseract
def test_cli_index_reports_ocr_and_docs_counts(tmp_path, three_languages, monkeypatch):
    from evidentia.cli import app

    monkeypatch.setenv("EVIDENTIA_OCR", "on")
    monkeypatch.setenv("EVIDENTIA_OCR_DPI", "150")
    monkeypatch.setenv("EVIDENTIA_PROGRESS_INTERVAL_S", "0.001")  # a line for each step, as in a pipe
    runner = CliRunner()
    result = runner.invoke(app, ["index", str(three_languages)])
    assert result.exit_code == 0, result.output
    assert re.search(r"OCR: 3 page\(s\) read in [\d.]+ s", result.stderr)
    # while the scan is read: how much OCR has still to do
    assert "0 pages written, 3 to read by OCR" in result.stderr
    assert re.search(r"0 pages written, 1 OCR'd \([\d.]+ s each(, \d at a time)?\), 2 more to read by OCR",
                     result.stderr)
    docs = runner.invoke(app, ["docs"]).stdout.strip()
    assert docs.splitlines()[0].endswith("\tOCR pages (confidence)\tunread scans")
    assert re.fullmatch(r"default\tcertificates\t3\t0\ten:1, fr:1, de:1\t3 \(\d+\)\t0", docs.splitlines()[1])
    listed = json.loads(runner.invoke(app, ["docs", "--json"]).stdout)["documents"][0]
    assert listed["ocr_pages"] == 3 and listed["unread_pages"] == 0 and listed["ocr_confidence"] > 75


# -- without OCR ------------------------------------------------------------------------
def test_ocr_off_leaves_scans_empty_and_counted(tmp_path, backend):
    path = scanned_pdf(tmp_path / "scan.pdf", [TEXTS["en"], None])
    off = OcrEngine.probe(mode="off")
    summary = index_paths([path], backend, LanguageDetector(), ocr=off)
    assert (summary.pages, summary.empty_pages, summary.unread_pages, summary.ocr_pages) == (2, 1, 1, 0)
    assert summary.ocr_line() == "1 page(s) not read: OCR is off: EVIDENTIA_OCR=off"
    assert backend.get_page("scan", 1).text_source == "unread"
    assert backend.get_document("scan").unread_pages == 1


def test_missing_tesseract_indexes_and_says_how_to_install(tmp_path, backend):
    assert not MISSING.available and "not on PATH" in MISSING.problem
    path = scanned_pdf(tmp_path / "scan.pdf", [TEXTS["en"], None])
    summary = index_paths([path], backend, LanguageDetector(), ocr=MISSING)
    assert summary.documents == 1 and summary.unread_pages == 1 and not summary.failures
    line = summary.ocr_line()
    assert "\n" not in line and line.startswith("1 page(s) not read: they look scanned or printed as images and Tesseract was not found")
    assert "apt-get install tesseract-ocr" in line
    assert backend.search(["board", "shareholders"], ["scan"], 3)[0].page == 2  # the digital page is indexed


def test_a_figure_without_tesseract_keeps_its_caption_and_is_counted(tmp_path, backend):
    """Without Tesseract a figure printed as an image keeps its caption (it is text),
    and the summary says so with how to read it: it was counted nowhere, and a
    newcomer's BHP report said "0 empty page(s)" and nothing of its four figures."""
    path = figure_pdf(tmp_path / "figure.pdf", TEXTS["en"])
    summary = index_paths([path], backend, LanguageDetector(), ocr=MISSING)
    assert (summary.unread_pages, summary.caption_only_pages, summary.empty_pages) == (0, 1, 0)
    line = summary.ocr_line()
    assert line.startswith("1 page(s) showing a scan or a figure kept only their short text layer (a caption, a "
                           "stamp): they look scanned or printed as images and Tesseract was not found")
    assert "apt-get install" in line
    assert backend.get_page("figure", 1).text_source == "text"


@needs_tesseract
def test_ocr_over_its_time_limit_or_failing_leaves_the_page_unread(tmp_path):
    from dataclasses import replace

    path = scanned_pdf(tmp_path / "scan.pdf", [TEXTS["en"]])
    with pymupdf.open(path) as doc:
        page = doc[0]
        slow = read_page(page, replace(TESSERACT, timeout_s=0.01))
        assert (slow.source, slow.text) == ("unread", "") and "EVIDENTIA_OCR_TIMEOUT_S" in slow.problem
        broken = read_page(page, replace(TESSERACT, installed=("xyz",)))  # no such traineddata
        assert broken.source == "unread" and broken.problem.startswith("Tesseract failed")
    document = extract_pages(path, "scan", LanguageDetector(), ocr=replace(TESSERACT, timeout_s=0.01))
    assert document.unread_pages == 1 and "EVIDENTIA_OCR_TIMEOUT_S" in document.ocr_problem


@needs_tesseract
def test_a_page_of_too_many_paths_is_left_unread_not_rendered(tmp_path):
    """Rendering is not bounded by the OCR timeout: a page of 350,000 thick strokes held an
    indexing worker for 300 s. Past MAX_OCR_PATHS a page is left unread, and says why."""
    doc = pymupdf.open()
    page = doc.new_page()
    strokes = "".join(f"{1 + i % 5} w 0 {i % 792} m 612 {(i * 7) % 792} l S\n" for i in range(ocr_mod.MAX_OCR_PATHS + 500))
    xref = doc.get_new_xref()
    doc.update_object(xref, "<<>>")
    doc.update_stream(xref, strokes.encode())
    doc.xref_set_key(page.xref, "Contents", f"{xref} 0 R")
    path = tmp_path / "strokes.pdf"
    doc.save(path)
    doc.close()
    with pymupdf.open(path) as reopened:
        started = time.perf_counter()
        read = read_page(reopened[0], TESSERACT)
        assert read.source == "unread" and "too many to render for OCR" in read.problem
        assert time.perf_counter() - started < 10
    document = extract_pages(path, "strokes", LanguageDetector(), ocr=TESSERACT)
    assert document.unread_pages == 1 and "paths" in document.ocr_problem


def test_a_page_of_the_largest_size_is_rendered_within_the_pixel_cap():
    """A scan on a 200-inch page (PDF's largest) was 207 megapixels at the old 72 dpi
    floor: past the extraction's memory limit, its whole document failed."""
    page = pymupdf.open().new_page(width=14400, height=14400)
    image = pymupdf.Pixmap(ocr_mod.render(page, 300))
    width, height = image.width, image.height
    assert width * height <= ocr_mod.MAX_PIXELS and width >= 5000


@needs_tesseract
def test_a_page_sent_to_ocr_has_its_drawing_log_read_once(tmp_path, monkeypatch):
    """The log of a page of many strokes takes seconds to read: the decision to OCR it and
    the cap on its paths share one reading."""
    page = pymupdf.open(figure_pdf(tmp_path / "figure.pdf", TEXTS["en"]))[0]
    layer = page.get_text()
    reads = []
    real = pymupdf.Page.get_bboxlog
    monkeypatch.setattr(pymupdf.Page, "get_bboxlog", lambda self, *a, **k: reads.append(1) or real(self, *a, **k))
    assert isinstance(ocr_mod.prepare_page(page, TESSERACT, layer), ocr_mod.Rendered)
    assert len(reads) == 1


# -- several pages at once ----------------------------------------------------------------
# A fully scanned document whose first page shows no language, so the next ones are read
# ahead without a prior and again once page 2 sets it (French: page 4 is then read in
# French only, the others again in their own language).
PARALLEL_PAGES = ["2023", TEXTS["fr"], TEXTS["en"], TEXTS["fr"], TEXTS["de"]]


def tesseract_children() -> list:
    import psutil

    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "tesseract" in child.name():
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.fixture(scope="module")
def parallel_reads(tmp_path_factory) -> dict:
    """The same scan read with 1 and with 2 workers; with 2, the progress calls and
    the most Tesseract processes seen running at once (sampled every 5 ms)."""
    assert TESSERACT.available or pytest.skip("no Tesseract")
    import threading
    from dataclasses import replace

    path = scanned_pdf(tmp_path_factory.mktemp("parallel") / "scan.pdf", PARALLEL_PAGES)
    calls: dict[int, list] = {1: [], 2: []}  # per worker count: each progress call's PageText
    backlog: list = []  # with 2: each OcrBacklog, in order with the pages OCR'd
    one = extract_pages(path, "scan", LanguageDetector(), ocr=replace(TESSERACT, workers=1),
                        on_ocr_page=calls[1].append)
    seen, done = [0], threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            seen.append(len(tesseract_children()))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        two = extract_pages(path, "scan", LanguageDetector(), ocr=replace(TESSERACT, workers=2),
                            on_ocr_page=lambda read: (calls[2].append(read), backlog.append("page")),
                            on_ocr_backlog=backlog.append)
    finally:
        done.set()
        sampler.join()
    return {"one": one, "two": two, "calls": calls, "most_at_once": max(seen), "backlog": backlog}


@needs_tesseract
def test_two_workers_read_exactly_what_one_reads(parallel_reads):
    one, two = parallel_reads["one"], parallel_reads["two"]
    assert [p.text_source for p in one.pages] == ["none", "ocr", "ocr", "ocr", "ocr"]
    assert [p.language for p in one.pages] == [None, "fr", "en", "fr", "de"]
    assert [(p.raw_text, p.text_source, p.language, p.ocr_confidence) for p in two.pages] == \
        [(p.raw_text, p.text_source, p.language, p.ocr_confidence) for p in one.pages]
    # with the same Tesseract languages: page 4 in French only, as the prior says
    assert [r.languages for r in parallel_reads["calls"][2]] == [r.languages for r in parallel_reads["calls"][1]]
    assert [r.languages for r in parallel_reads["calls"][1]][1:] == ["eng", "fra", "deu"]
    assert "société" in two.pages[3].text and "wiederverwertung" in two.pages[4].text.lower()
    assert two.ocr_seconds > 0 and not tesseract_children()


@needs_tesseract
def test_progress_comes_once_per_ocr_page_in_page_order(parallel_reads):
    two = parallel_reads["two"]
    assert [r.text for r in parallel_reads["calls"][2]] == [p.raw_text for p in two.pages if p.text_source == "ocr"]
    assert parallel_reads["most_at_once"] == 2  # pages were read two at once, never more


@needs_tesseract
def test_the_backlog_counts_down_every_page_ocr_looks_at(parallel_reads):
    from evidentia.indexer.ocr import OcrBacklog

    # all 5 pages lack a text layer; page 1 ("2023") is looked at and not kept as OCR text
    assert parallel_reads["backlog"] == [OcrBacklog(5, 5), OcrBacklog(5, 4), "page", OcrBacklog(5, 3), "page",
                                         OcrBacklog(5, 2), "page", OcrBacklog(5, 1), "page", OcrBacklog(5, 0)]


def test_a_document_that_needs_no_ocr_reports_no_backlog(tmp_path):
    from evidentia.samples import write_pdf

    backlog = []
    # pages of more than FIGURE_CAPTION_LETTERS letters: settled by their text layer alone
    path = write_pdf(tmp_path / "digital.pdf", [TEXTS["en"] * 4, TEXTS["fr"] * 4])
    extract_pages(path, "digital", LanguageDetector(), ocr=TESSERACT, on_ocr_backlog=backlog.append)
    assert backlog == []
    extract_pages(scanned_pdf(tmp_path / "scan.pdf", [TEXTS["en"]]), "scan", LanguageDetector(),
                  ocr=OcrEngine(mode="off"), on_ocr_backlog=backlog.append)
    assert backlog == []  # OCR off: nothing will look at the scan


def test_a_digital_report_of_short_pages_reports_no_backlog(tmp_path):
    """Pages with a short text layer and no picture, and blank pages, need no OCR: the
    sample report's 6 such pages were counted "to read by OCR", and none was read."""
    from evidentia.samples import write_sample_report

    path = write_sample_report(tmp_path / "report.pdf")
    with pymupdf.open(path) as doc:  # every page under the letters that settle a page by its text layer alone
        assert all(ocr_mod.letters(page.get_text()) < ocr_mod.FIGURE_CAPTION_LETTERS for page in doc)
    backlog = []
    # no page goes to Tesseract: an engine that says it is installed is enough, wherever the test runs
    engine = OcrEngine(available=True, installed=("eng",))
    document = extract_pages(path, "report", LanguageDetector(), ocr=engine, on_ocr_backlog=backlog.append)
    assert backlog == []
    assert document.ocr_pages == 0 and document.unread_pages == 0 and document.page_count == 6


@needs_tesseract
def test_the_backlog_counts_only_the_pages_tesseract_reads(tmp_path):
    """A scan between a page of short text and a blank page: 1 page to read, not 3
    (a 2-page scan with such a page said 3 to go, and ended with 2 pages OCR'd)."""
    from evidentia.indexer.ocr import OcrBacklog

    scanned = scanned_pdf(tmp_path / "scan.pdf", [None, TEXTS["en"]])
    with pymupdf.open(scanned) as doc:
        doc.new_page()
        doc.save(tmp_path / "mixed.pdf")
    backlog = []
    document = extract_pages(tmp_path / "mixed.pdf", "mixed", LanguageDetector(), ocr=TESSERACT,
                             on_ocr_backlog=backlog.append)
    assert [p.text_source for p in document.pages] == ["text", "ocr", "none"]
    assert backlog == [OcrBacklog(3, 1), OcrBacklog(3, 0)]
    # forced, every page that shows something is read: never the blank one
    backlog.clear()
    forced = extract_pages(tmp_path / "mixed.pdf", "mixed", LanguageDetector(),
                           ocr=OcrEngine.probe(mode="force", dpi=150), on_ocr_backlog=backlog.append)
    assert [p.text_source for p in forced.pages] == ["ocr", "ocr", "none"]
    assert backlog == [OcrBacklog(3, 2), OcrBacklog(3, 1), OcrBacklog(3, 0)]

@needs_tesseract
def test_a_failed_check_stops_the_reading_and_leaves_no_tesseract_running(tmp_path):
    from dataclasses import replace

    # English only: no page is read twice, so page 4 starts as page 2 ends, just before its check
    path = scanned_pdf(tmp_path / "scan.pdf", [TEXTS["en"]] * 4)
    checked, running_then, progress = [], [], []

    def check_page(page: int, text: str) -> None:
        if text.strip():  # the OCR'd text (the scans' own text layers are empty)
            checked.append(page)
        if page == 2 and text.strip():
            running_then.extend(tesseract_children())
            raise PdfError("scan.pdf: page 2: more than N characters")

    with pytest.raises(PdfError, match="page 2"):
        extract_pages(path, "scan", LanguageDetector(), ocr=replace(TESSERACT, workers=2), check_page=check_page,
                      on_ocr_page=progress.append)
    assert checked == [1, 2] and len(progress) == 1
    assert running_then, "pages 3-4 were not being read while page 2 was checked"
    assert not tesseract_children() and not any(p.is_running() for p in running_then)


def test_ocr_workers_setting():
    from evidentia.runtime import usable_cpus

    default = Settings.from_env({})
    assert default.ocr_workers == 0 and OcrEngine.from_settings(default).parallel == usable_cpus()
    three = Settings.from_env({"EVIDENTIA_OCR_WORKERS": "3"})
    assert three.ocr_workers == 3 and OcrEngine.from_settings(three).parallel == 3
    with pytest.raises(ConfigError, match=r"EVIDENTIA_OCR_WORKERS must be a whole number >= 0, not '-1'"):
        Settings.from_env({"EVIDENTIA_OCR_WORKERS": "-1"})


def test_documents_indexed_at_once_share_the_cpus(monkeypatch):
    monkeypatch.setattr(ocr_mod, "usable_cpus", lambda: 8)
    default = OcrEngine(mode="on")
    assert default.parallel == 8 and default.shared_by(1) is default
    assert default.shared_by(2).parallel == 4 and default.shared_by(3).parallel == 2
    assert default.shared_by(16).parallel == 1  # never none
    assert OcrEngine(mode="on", workers=3).shared_by(2).parallel == 3  # an explicit setting stands


def test_missing_language_data_is_reported(tmp_path):
    if shutil.which("tesseract") is None:
        pytest.skip("no tesseract binary")
    engine = OcrEngine.probe(tessdata=str(tmp_path / "no-tessdata"))
    assert not engine.available and "no language data" in engine.problem


def test_cli_without_tesseract_prints_the_hint(tmp_path, monkeypatch):
    from evidentia.cli import app

    monkeypatch.setenv("EVIDENTIA_OCR", "on")
    monkeypatch.setenv("EVIDENTIA_TESSERACT", "/nonexistent/bin/tesseract")
    path = scanned_pdf(tmp_path / "scan.pdf", [TEXTS["en"]])
    result = CliRunner().invoke(app, ["index", str(path)])
    assert result.exit_code == 0, result.output
    assert "1 page(s) not read" in result.stderr and "apt-get install tesseract-ocr" in result.stderr
    listed = CliRunner().invoke(app, ["docs"])
    assert listed.stdout.strip().splitlines()[1] == "default\tscan\t1\t1\t-\t0\t1"
    assert "unread scans: pages that show a scan but were not read" in listed.stderr


# -- pieces -----------------------------------------------------------------------------
@pytest.mark.parametrize("text", [
    TEXTS["en"], TEXTS["fr"], TEXTS["de"],
    "Net sales 32,765 31,657 Cost of sales 16,682 16,055 Selling, general and administrative 7,602 " * 3,
    "Spółka prowadzi działalność w zakresie produkcji przewodów miedzianych zgodnie z normą " * 3,  # Polish
    "公司的环境管理体系符合标准的要求。温室气体排放每年测量一次。" * 5,  # Chinese
    "", "12 13 14",
    "The TCFD and GHG Protocol guide our CDP answer; LinkedIn, iPhone and McDonald's are brands we cite. " * 3,
])
def test_real_text_is_not_garbage(text):
    assert not is_garbage(text)


@pytest.mark.parametrize("text", [
    " ".join(["Xqzt Brkfl Mnpw Trzx Hjkl Qwrt Pstv Znmb"] * 4),  # letter soup
    "\ufffd\ufffd \ufffd\ufffd\ufffd a \ufffd\ufffd\ufffd\ufffd \ufffd" * 10,  # no Unicode map
    "".join(chr(0xE000 + i % 200) for i in range(300)),  # private-use glyph codes
    " ".join(["tHqZ aBcD eFgH iJkL"] * 8),  # case switching inside words
])
def test_glyph_junk_is_garbage(text):
    assert is_garbage(text)


def test_parse_tsv_builds_lines_paragraphs_and_mean_confidence():
    header = "level\tpage_num\tblock_num\tpar_num\tline_num\tword_num\tleft\ttop\twidth\theight\tconf\ttext"
    rows = [
        "1\t1\t0\t0\t0\t0\t0\t0\t100\t100\t-1\t",
        "5\t1\t1\t1\t1\t1\t0\t0\t10\t10\t90\tScope",
        "5\t1\t1\t1\t1\t2\t0\t0\t10\t10\t80\temissions",
        "5\t1\t1\t1\t2\t1\t0\t0\t10\t10\t70\tfell",
        "5\t1\t2\t1\t1\t1\t0\t0\t10\t10\t60\tAnnex",
        "5\t1\t2\t1\t1\t2\t0\t0\t10\t10\t95\t ",
    ]
    assert parse_tsv("\n".join([header, *rows])) == ("Scope emissions\nfell\n\nAnnex", 75.0)
    assert parse_tsv(header) == ("", None)


def test_languages_for_uses_the_page_language_where_installed():
    engine = OcrEngine(installed=("deu", "eng", "fra"), available=True)
    assert engine.languages_for("fr") == "fra"
    assert engine.languages_for(None) == "eng+fra+deu"  # the multi-language run, what is installed of it
    assert engine.languages_for("pt") == "eng+fra+deu"  # no Portuguese data: the multi-language run


def test_ocr_languages_tesseract_does_not_know_are_an_error():
    """EVIDENTIA_OCR_LANGUAGES=fr+de (ISO codes, not Tesseract's fra+deu) was dropped
    without a word, and every scan read in English."""
    from dataclasses import replace

    engine = OcrEngine(installed=("deu", "eng", "fra"), available=True)
    assert replace(engine, languages="fr+de").language_problems() == (
        "EVIDENTIA_OCR_LANGUAGES must be Tesseract language names joined by +, not 'fr+de': fr, de are not "
        "Tesseract languages (did you mean fra+deu?); installed here: deu, eng, fra", "")
    error, _ = replace(engine, languages="eng+xyz").language_problems()
    assert error.endswith(": xyz is not a Tesseract language; installed here: deu, eng, fra")
    # Tesseract's own models that are no language: orientation and script detection
    assert replace(engine, installed=("eng", "osd"), languages="eng+osd").language_problems() == ("", "")
    # a model trained in-house has a name of its own: installed, it is read
    assert replace(engine, installed=("eng", "acme_forms"), languages="eng+acme_forms").language_problems() == ("", "")
    # without Tesseract the name is wrong all the same (and the missing Tesseract said apart); OCR off: not used
    assert OcrEngine(languages="fr").language_problems()[0].endswith(": fr is not a Tesseract language (did you "
                                                                     "mean fra?)")
    assert OcrEngine(mode="off", languages="fr").language_problems() == ("", "")


def test_an_ocr_language_not_installed_is_a_warning_naming_its_package():
    engine = OcrEngine(installed=("deu", "eng", "fra"), available=True, languages="eng+chi_sim+hin")
    assert engine.language_problems() == ("", (
        "EVIDENTIA_OCR_LANGUAGES: chi_sim, hin are not installed, so pages of unknown language are read with eng: "
        "apt-get install tesseract-ocr-chi-sim tesseract-ocr-hin (EVIDENTIA_OCR_LANGUAGES=eng silences this)"))
    assert OcrEngine(installed=("deu", "eng", "fra"), available=True, languages="fra+deu").language_problems() == \
        ("", "")
    # the default's packs missing (a machine with English alone): not said on every run
    assert OcrEngine(installed=("eng",), available=True, languages=ocr_mod.DEFAULT_LANGUAGES).language_problems() \
        == ("", "")
    # Tesseract missing: that is said (with how to install it), not each language
    assert OcrEngine(languages="eng+hin", problem="Tesseract was not found").language_problems() == ("", "")


def test_blank_page_needs_no_tesseract():
    doc = pymupdf.open()
    page = doc.new_page()
    assert read_page(page, MISSING) == ocr_mod.PageText("", "none")


def test_settings():
    s = Settings.from_env({})
    assert (s.ocr, s.ocr_languages, s.ocr_dpi, s.tesseract, s.tessdata) == (
        "on", "eng+fra+deu+spa+ita+por+nld", 300, "tesseract", None)
    env = {"EVIDENTIA_OCR": "FORCE", "EVIDENTIA_OCR_LANGUAGES": "eng+fra", "EVIDENTIA_OCR_DPI": "150",
           "EVIDENTIA_OCR_TIMEOUT_S": "5", "EVIDENTIA_TESSERACT": "/opt/tess", "EVIDENTIA_TESSDATA": "/opt/td"}
    s = Settings.from_env(env)
    assert (s.ocr, s.ocr_languages, s.ocr_dpi, s.ocr_timeout_s, s.tesseract, s.tessdata) == (
        "force", "eng+fra", 150, 5.0, "/opt/tess", "/opt/td")
    assert Settings.from_env({"EVIDENTIA_OCR": "0"}).ocr == "off"
    for name, bad in (("EVIDENTIA_OCR", "sometimes"), ("EVIDENTIA_OCR_LANGUAGES", "eng, fra"),
                      ("EVIDENTIA_OCR_DPI", "2000")):
        with pytest.raises(ConfigError, match=name):
            Settings.from_env({name: bad})
    engine = OcrEngine.from_settings(Settings.from_env({"EVIDENTIA_OCR": "off"}))
    assert engine.mode == "off" and not engine.enabled


def test_elasticsearch_page_source_keeps_how_the_text_was_read():
    page = Page(doc_id="x", page=1, raw_text="Zertifikat", text="Zertifikat", language="de", char_count=10,
                text_source="ocr", ocr_confidence=91.5)
    unread = Page(doc_id="x", page=2, raw_text="", text="", language=None, char_count=0, text_source="unread")
    doc = Document(doc_id="x", pages=(page, unread))
    sources = [a["_source"] for a in esb.page_actions("i", doc, "g")]
    assert sources[0]["text_source"] == "ocr" and sources[0]["ocr_confidence"] == 91.5
    assert [esb.page_from_source(s) for s in sources] == [page, unread]
    meta = esb.record_source(doc, "g")["meta"]
    assert (meta["ocr_pages"], meta["unread_pages"], meta["ocr_confidence"]) == (1, 1, 91.5)
    info = esb.info_from_record("x", esb.record_source(doc, "g"))
    assert (info.ocr_pages, info.unread_pages, info.ocr_confidence) == (1, 1, 91.5)
    mapping = esb.load_mapping()["mappings"]["properties"]
    assert mapping["text_source"] == {"type": "keyword"} and mapping["ocr_confidence"] == {"type": "float"}


def test_page_source_defaults_from_its_text():
    assert Page("d", 1, "a", "a", "en", 1).text_source == "text"
    assert Page("d", 1, "", "", None, 0).text_source == "none"


# -- the API ---------------------------------------------------------------------------
@needs_tesseract
def test_api_reports_ocr_pages_and_page_sources(tmp_path):
    from fastapi.testclient import TestClient

    from tests.utils.api import make_app, new_tenant, upload, wait_ready

    path = scanned_pdf(tmp_path / "certificate.pdf", [TEXTS["fr"], TEXTS["de"], None])
    with TestClient(make_app(tmp_path, ocr="on", ocr_dpi=150)) as client:
        wait_ready(client)
        headers = new_tenant(client)
        assert upload(client, headers, path).status_code == 202
        seen = []  # the status while indexing: OCR progress shows before the page counts
        deadline = time.monotonic() + 60
        while (doc := client.get("/v1/documents/certificate", headers=headers).json())["status"] != "ready":
            assert doc["status"] in ("queued", "indexing") and time.monotonic() < deadline, doc
            if doc["progress"]:
                seen.append(doc["progress"])
            time.sleep(0.02)
        # OCR's progress shows before the embedding's: the document's 3 pages, and the
        # pages OCR has read and has still to read (the 2 scans: page 3's short text
        # layer needs no OCR, and a count of 3 ended with 2 pages OCR'd)
        assert seen[0] == {"pages_done": 0, "pages_total": 3, "ocr_pages": 0, "ocr_pages_left": 2}, seen
        assert {"pages_done": 0, "pages_total": 3, "ocr_pages": 1, "ocr_pages_left": 1} in seen, seen
        lefts = [p["ocr_pages_left"] for p in seen]
        assert lefts == sorted(lefts, reverse=True) and lefts[-1] == 0, seen
        assert doc["progress"] is None
        assert (doc["ocr_pages"], doc["unread_pages"], doc["caption_only_pages"], doc["unread_reason"]) == (2, 0, 0, None)
        assert doc["ocr_confidence"] > 75
        first = client.get("/v1/documents/certificate/pages/1", headers=headers).json()
        assert first["text_source"] == "ocr" and first["ocr_confidence"] > 75 and "Dupont" in first["text"]
        third = client.get("/v1/documents/certificate/pages/3", headers=headers).json()
        assert third["text_source"] == "text" and third["ocr_confidence"] is None


def test_api_says_why_scans_were_not_read(tmp_path):
    from fastapi.testclient import TestClient

    from tests.utils.api import make_app, new_tenant, ready_document, wait_ready

    path = scanned_pdf(tmp_path / "certificate.pdf", [TEXTS["fr"]])
    with TestClient(make_app(tmp_path, ocr="on", tesseract="/nonexistent/bin/tesseract")) as client:
        wait_ready(client)
        headers = new_tenant(client)
        ready_document(client, headers, path)
        doc = client.get("/v1/documents/certificate", headers=headers).json()
        assert (doc["ocr_pages"], doc["unread_pages"], doc["empty_pages"]) == (0, 1, 1)
        assert "apt-get install tesseract-ocr" in doc["unread_reason"]
        page = client.get("/v1/documents/certificate/pages/1", headers=headers).json()
        assert page["text_source"] == "unread" and page["text"] == ""


def test_store_of_schema_1_gains_the_ocr_column(tmp_path):
    import sqlite3

    from evidentia.store import SCHEMA_VERSION, Store

    path = tmp_path / "store.sqlite"
    store = Store(path)
    store.create_key("acme")
    store.put_document("acme", "old", "old.pdf", 10, "/x/old.pdf", "g1")
    store.set_status("acme", "old", "g1", "ready", pages=2, empty_pages=1, languages={"en": 1})
    store.close()
    with sqlite3.connect(path) as conn:  # as a store written before OCR: no ocr column, version 1
        conn.execute("ALTER TABLE documents DROP COLUMN ocr")
        conn.execute("PRAGMA user_version=1")
    reopened = Store(path)
    row = reopened.get_document("acme", "old")
    assert (row.status, row.pages, row.ocr) == ("ready", 2, {})
    reopened.set_status("acme", "old", "g1", "ready", pages=2, empty_pages=1, ocr={"ocr_pages": 1})
    assert reopened.get_document("acme", "old").ocr == {"ocr_pages": 1}
    reopened.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION  # 3 since issue #15


def test_tesseract_out_of_memory_is_said_in_words(tmp_path):
    """A page past the extraction's memory limit made Tesseract abort with C++'s
    "what():  std::bad_alloc", which became the document's unread_reason as it was."""
    fake = tmp_path / "tesseract"
    fake.write_text("#!/bin/sh\n"
                    "if [ \"$1\" = \"--list-langs\" ]; then\n"
                    "  echo 'List of available languages (1):'; echo eng; exit 0\n"
                    "fi\n"
                    "cat > /dev/null\n"
                    "echo \"terminate called after throwing an instance of 'std::bad_alloc'\" >&2\n"
                    "echo '  what():  std::bad_alloc' >&2\n"
                    "exit 134\n")
    fake.chmod(0o755)
    engine = OcrEngine.probe(command=str(fake), languages="eng", dpi=72, workers=1)
    assert engine.available, engine.problem
    document = extract_pages(scanned_pdf(tmp_path / "scan.pdf", [TEXTS["en"]], dpi=72), "scan", LanguageDetector(),
                             ocr=engine)
    assert document.unread_pages == 1
    assert document.ocr_problem == ("Tesseract ran out of memory on the page (an extraction may add "
                                    "EVIDENTIA_EXTRACT_MEMORY_MB; a lower EVIDENTIA_OCR_DPI needs less)")
    assert "std::" not in unread_reason(document.ocr_problem)


def test_deleting_a_scan_being_read_ends_its_tesseract_processes(tmp_path):
    """The extraction child was killed on delete, and its Tesseract processes ran on for
    minutes, re-parented to init: the child's whole process group goes now. A Tesseract
    that takes a minute a page (a dense page, every language) is played by a script."""
    import psutil
    from fastapi.testclient import TestClient

    from tests.utils.api import make_app, new_tenant, upload, wait_ready

    slow = tmp_path / "tesseract"
    slow.write_text("#!/bin/sh\n"
                    "if [ \"$1\" = \"--list-langs\" ]; then\n"
                    "  echo 'List of available languages (1):'; echo eng; exit 0\n"
                    "fi\n"
                    "cat > /dev/null\n"
                    "sleep 60\n")
    slow.chmod(0o755)

    def reading() -> list:
        found = []
        for child in psutil.Process().children(recursive=True):
            try:
                if child.name() in ("tesseract", "sleep") and running(child.pid):
                    found.append(child)
            except psutil.NoSuchProcess:
                pass
        return found

    path = scanned_pdf(tmp_path / "long-scan.pdf", [TEXTS["en"]] * 4, dpi=72)
    with TestClient(make_app(tmp_path, ocr="on", ocr_dpi=72, tesseract=str(slow))) as client:
        wait_ready(client)
        headers = new_tenant(client)
        assert upload(client, headers, path).status_code == 202
        deadline = time.monotonic() + 60
        started = reading()
        while not any(p.name() == "sleep" for p in started):
            assert time.monotonic() < deadline, "OCR never started"
            time.sleep(0.02)
            started = reading()
        assert client.delete("/v1/documents/long-scan", headers=headers).status_code == 204
        # by pid: an orphan leaves this process's tree (re-parented to init)
        deadline = time.monotonic() + 5  # a zombie left for init to reap runs nothing
        while (left := [p.pid for p in started if running(p.pid)]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not left
