"""bench/ocr_decisions.py: which pages go to Tesseract, and why, without running it."""

import pymupdf

from tests.utils.scans import FILLER, TEXTS, figure_pdf, scanned_pdf
from tests.utils.bench import bench_module


def test_each_kind_of_page_is_counted_once(tmp_path, capsys, monkeypatch):
    bench = bench_module("ocr_decisions")
    figure_pdf(tmp_path / "figure.pdf", TEXTS["en"])
    scanned_pdf(tmp_path / "mixed.pdf", [TEXTS["fr"], None])  # a scan, then a page of text
    short = pymupdf.open()  # a short text page without a picture: no OCR
    short.new_page().insert_text((72, 72), "A page of two sentences. " + FILLER[:60])
    short.save(tmp_path / "short.pdf")
    assert bench.reasons(tmp_path / "figure.pdf") == ["figure"]
    assert bench.reasons(tmp_path / "mixed.pdf") == ["scan", None]
    assert bench.reasons(tmp_path / "short.pdf") == [None]
    monkeypatch.setattr("sys.argv", ["ocr_decisions.py", str(tmp_path)])
    bench.main()
    out = capsys.readouterr().out
    assert "3 PDFs, 4 pages: text 2, scan 1, junk 0, figure 1" in out
    assert "figure: figure.pdf p1: caption of 16 words" in out
