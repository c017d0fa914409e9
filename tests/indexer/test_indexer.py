"""PDF -> page records -> tantivy backend: records, empty pages, bad files, atomic replacement."""

from __future__ import annotations

import pymupdf
import pytest

from evidentia.indexer.pdf import PdfError, extract_pages, open_pdf
from evidentia.indexing import find_pdfs, index_paths, index_pdf
from evidentia.retriever.base import UnknownDocumentError
from evidentia.retriever.query import build_query
from evidentia.text import clean_text

# kind of bad file -> words its one-line message must contain
BAD_MESSAGES = {
    "encrypted": "encrypted",
    "corrupted": "corrupted",
    "no_pages": "no pages",
    "not_pdf": "not a PDF",
}


def squash(text: str) -> str:
    return " ".join(text.split())


def search(backend, detector, doc_ids, question, answer="", k=10):
    return backend.search(build_query(question, answer, detector).keywords, doc_ids, k)


# --- page records ------------------------------------------------------------------


def test_page_records(multilingual_pdf, detector):
    doc = extract_pages(multilingual_pdf.path, "report", detector)
    assert doc.doc_id == "report"
    assert doc.source == "multilingual-report.pdf"
    assert doc.page_count == 9
    assert [p.page for p in doc.pages] == list(range(1, 10))
    assert all(p.doc_id == "report" for p in doc.pages)
    assert [p.language for p in doc.pages] == multilingual_pdf.languages
    for page, written in zip(doc.pages, multilingual_pdf.pages):
        # raw text is what PyMuPDF extracted (line breaks of the layout included)
        assert squash(page.raw_text) == squash(written)
        assert page.text == clean_text(page.raw_text)
        assert page.char_count == len(page.text)
    assert "\n" in doc.pages[0].raw_text
    assert doc.pages[0].text.startswith("Greenhouse gas emissions and energy use\nIn 2023 our total Scope 1")
    assert doc.pages[1].char_count > 400


def test_empty_and_image_pages_are_indexed_as_empty(multilingual_pdf, detector, backend):
    doc = extract_pages(multilingual_pdf.path, "report", detector)
    blank, image = doc.pages[7], doc.pages[8]
    for page in (blank, image):
        assert page.is_empty
        assert (page.raw_text.strip(), page.text, page.language, page.char_count) == ("", "", None, 0)
    assert doc.empty_pages == 2

    summary = index_paths([multilingual_pdf.path], backend, detector)
    assert (summary.documents, summary.pages, summary.empty_pages, summary.failures) == (1, 9, 2, [])
    assert summary.doc_ids == ["multilingual-report"]
    assert summary.line() == ("1 document(s), 9 page(s) indexed, 2 empty page(s) (no extractable text), "
                              "0 failure(s)")
    # the empty pages exist in the index, as pages with no text
    stored = backend.get_page("multilingual-report", 9)
    assert stored is not None and stored.char_count == 0 and stored.text == "" and stored.language is None
    info = backend.get_document("multilingual-report")
    assert (info.pages, info.empty_pages) == (9, 2)
    assert info.languages == {lang: 1 for lang in ["en", "fr", "de", "es", "it", "pt", "nl"]}


def test_stored_page_round_trip(multilingual_pdf, detector, backend):
    document = index_pdf(multilingual_pdf.path, backend, detector)
    for page in document.pages:
        assert backend.get_page(document.doc_id, page.page) == page
    assert backend.get_page(document.doc_id, 10) is None
    assert backend.get_page(document.doc_id, 0) is None


def test_hyphenated_line_break_rejoined_in_pdf(make_pdf, detector):
    path = make_pdf("hyphen.pdf", ["Our total emis-\nsions of green-\nhouse gases fell in 2023."])
    page = extract_pages(path, "hyphen", detector).pages[0]
    assert "emis-\nsions" in page.raw_text
    assert page.text == "Our total emissions of greenhouse gases fell in 2023."


def test_search_finds_the_right_page_in_each_language(multilingual_pdf, detector, backend):
    doc_id = index_pdf(multilingual_pdf.path, backend, detector).doc_id
    cases = [
        ("What were the Scope 1 and 2 greenhouse gas emissions?", "12450 tCO2e, down 12.5%", 1),
        ("Quelle proportion des fournisseurs a été auditée sur les droits humains ?", "87 %", 2),
        ("Welcher Anteil des Stroms stammte aus erneuerbaren Energien?", "64 %", 3),
        ("¿Cuánto se redujo el consumo de agua?", "18 %", 4),
        ("Qual è l'indice di frequenza degli infortuni?", "1.2 per milione di ore", 5),
        ("Que percentagem dos cargos de gestão são ocupados por mulheres?", "38%", 6),
        ("Hoeveel uur vrijwilligerswerk deden de medewerkers?", "4,200 uur", 7),
    ]
    for question, answer, expected in cases:
        hits = search(backend, detector, [doc_id], question, answer)
        assert hits, question
        assert hits[0].page == expected, (question, [(h.page, round(h.score, 2)) for h in hits])
        assert all(a.score >= b.score for a, b in zip(hits, hits[1:]))
        assert all(h.page not in (8, 9) for h in hits)  # empty pages never match


def test_numbers_match_between_answer_and_page(make_pdf, detector, backend):
    path = make_pdf("figures.pdf", [
        "Revenue for the year was 1,577 million euros, as in the previous year report.",
        "Le taux de rotation du personnel était de 12,5 % en 2023 selon le bilan social.",
        "Der Umsatz betrug 1.577.000,50 Euro im Geschäftsjahr nach dem Konzernabschluss.",
    ])
    index_pdf(path, backend, detector)
    assert [h.page for h in backend.search(["1577"], ["figures"], 5)] == [1]
    assert [h.page for h in backend.search(["12.5"], ["figures"], 5)] == [2]
    assert [h.page for h in backend.search(["1577000.5"], ["figures"], 5)] == [3]
    # through the query side: "$1577.00" and "12.5%" are normalised the same way
    assert search(backend, detector, ["figures"], "What was the revenue?", "$1577.00")[0].page == 1
    assert search(backend, detector, ["figures"], "staff turnover", "12.5%")[0].page == 2


# --- bad files ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(BAD_MESSAGES))
def test_bad_file_gives_one_line_pdf_error(bad_pdfs, detector, kind):
    path = bad_pdfs[kind]
    with pytest.raises(PdfError) as info:
        extract_pages(path, path.stem, detector)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(path.name + ": ")
    assert BAD_MESSAGES[kind] in message


def test_corrupted_files_really_fail(tmp_path, multilingual_pdf, detector):
    """A broken file must fail, not come back as a document of empty pages."""
    data = multilingual_pdf.path.read_bytes()
    header = data.split(b"\n", 1)[0] + b"\n"
    variants = {
        "header-only.pdf": header,
        "header-garbage.pdf": header + b"\x00\xff garbage \x13\x37" * 200,
        "truncated.pdf": data[:600],
    }
    for name, content in variants.items():
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(PdfError, match="corrupted"):
            extract_pages(path, "x", detector)


def test_a_complete_file_padded_after_its_end_is_read_and_a_cut_one_still_fails(tmp_path, multilingual_pdf,
                                                                                   detector):
    """Writers and transfers pad some files after %%EOF: kilobytes of NULs, newlines or
    spaces are not a truncation; a cut file padded the same way still is."""
    data = multilingual_pdf.path.read_bytes()
    pages = len(extract_pages(multilingual_pdf.path, "x", detector).pages)
    for name, padding in {"nul": b"\x00" * 2048, "newlines": b"\n" * 4096, "spaces": b" " * 100_000}.items():
        padded = tmp_path / f"padded-{name}.pdf"
        padded.write_bytes(data + padding)
        assert len(extract_pages(padded, "x", detector).pages) == pages, name
        cut = tmp_path / f"cut-{name}.pdf"
        cut.write_bytes(data[:600] + padding)
        with pytest.raises(PdfError, match="truncated"):
            extract_pages(cut, "x", detector)


def test_truncated_file_does_not_stop_a_batch(tmp_path, multilingual_pdf, detector, backend):
    # cut inside the page tree: PyMuPDF opens the file, then fails when counting pages
    truncated = tmp_path / "truncated.pdf"
    truncated.write_bytes(multilingual_pdf.path.read_bytes()[:600])
    summary = index_paths([truncated, multilingual_pdf.path], backend, detector)
    assert summary.documents == 1 and summary.doc_ids == ["multilingual-report"]
    assert len(summary.failures) == 1
    assert summary.failures[0].reason == (f"{truncated}: corrupted PDF: the file is truncated (its end is missing); "
                                          "upload the complete file")
    assert "\n" not in summary.failures[0].reason


def test_empty_file_and_missing_file(tmp_path, detector):
    empty = tmp_path / "empty.pdf"
    empty.write_bytes(b"")
    with pytest.raises(PdfError, match="empty.pdf: empty file, not a PDF"):
        open_pdf(empty)
    with pytest.raises(PdfError, match="no such file"):
        open_pdf(tmp_path / "missing.pdf")


def test_batch_indexes_good_files_and_reports_bad_ones(bad_pdfs, multilingual_pdf, make_pdf, detector, backend):
    second = make_pdf("second.pdf", ["Water withdrawal in 2023 was 1.2 million cubic metres across all sites."])
    paths = [multilingual_pdf.path, *bad_pdfs.values(), second]
    seen = []
    summary = index_paths(paths, backend, detector, on_document=lambda p, n: seen.append((p.name, n)))

    assert summary.documents == 2
    assert summary.pages == 10
    assert summary.empty_pages == 2
    assert summary.doc_ids == ["multilingual-report", "second"]
    assert [f.path for f in summary.failures] == [str(p) for p in bad_pdfs.values()]
    for failure, kind in zip(summary.failures, bad_pdfs):
        assert BAD_MESSAGES[kind] in failure.reason and "\n" not in failure.reason
    assert summary.line().endswith(f"{len(bad_pdfs)} failure(s)")
    assert seen == [(p.name, n) for p, n in zip(paths, [9, 0, 0, 0, 0, 1])]

    assert [d.doc_id for d in backend.list_documents()] == ["multilingual-report", "second"]
    for path in bad_pdfs.values():
        assert backend.get_document(path.stem) is None
        assert backend.get_page(path.stem, 1) is None
        with pytest.raises(UnknownDocumentError):
            backend.search(["2023"], [path.stem], 5)
    assert search(backend, detector, ["second"], "water withdrawal")[0].page == 1


def test_find_pdfs_expands_folders(tmp_path, make_pdf):
    a = make_pdf("a.pdf", ["one"])
    nested = tmp_path / "pdfs" / "sub" / "deeper"
    nested.mkdir(parents=True)
    b = nested / "B.PDF"
    b.write_bytes(a.read_bytes())
    (tmp_path / "pdfs" / "notes.txt").write_text("not indexed")
    files, missing = find_pdfs([tmp_path / "pdfs", a, tmp_path / "nope"])
    assert files == [a, b]  # sorted, recursive, any case, no duplicates
    assert len(missing) == 1 and "no such file or folder" in missing[0].reason


def test_same_stem_twice_in_one_batch_is_a_failure(tmp_path, language_pages, detector, backend):
    from evidentia.samples import write_pdf

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = write_pdf(tmp_path / "a" / "report.pdf", [language_pages["en"]])
    second = write_pdf(tmp_path / "b" / "report.pdf", [language_pages["fr"], language_pages["de"]])
    summary = index_paths([tmp_path], backend, detector)
    assert summary.documents == 1 and summary.pages == 1
    assert [f.path for f in summary.failures] == [str(second)]
    assert "'report' already indexed from" in summary.failures[0].reason
    assert backend.get_document("report").pages == 1  # the first file was not silently replaced
    assert str(first) in summary.failures[0].reason


def test_batch_reports_missing_paths(tmp_path, multilingual_pdf, detector, backend):
    summary = index_paths([tmp_path / "nope.pdf", multilingual_pdf.path], backend, detector)
    assert summary.documents == 1
    assert len(summary.failures) == 1 and "nope.pdf: no such file or folder" in summary.failures[0].reason


# --- replacement and atomicity -----------------------------------------------------


def test_reindexing_replaces_the_document(make_pdf, language_pages, detector, backend, tmp_path):
    v1 = make_pdf("report.pdf", [language_pages["en"], language_pages["fr"], "", language_pages["de"]])
    index_pdf(v1, backend, detector)
    assert backend.get_document("report").pages == 4
    assert search(backend, detector, ["report"], "forklift diesel solar panels")

    v2_dir = tmp_path / "v2"
    v2_dir.mkdir()
    from evidentia.samples import write_pdf

    v2 = write_pdf(v2_dir / "report.pdf", [language_pages["es"], language_pages["it"]])
    summary = index_paths([v2], backend, detector)
    assert summary.documents == 1
    info = backend.get_document("report")
    assert (info.pages, info.empty_pages, info.languages) == (2, 0, {"es": 1, "it": 1})
    assert [d.doc_id for d in backend.list_documents()] == ["report"]
    assert search(backend, detector, ["report"], "forklift diesel solar panels") == []
    assert backend.get_page("report", 3) is None and backend.get_page("report", 4) is None
    assert "agua" in backend.get_page("report", 1).text
    assert search(backend, detector, ["report"], "consumo de agua")[0].page == 1


def test_explicit_doc_id(multilingual_pdf, detector, backend):
    index_pdf(multilingual_pdf.path, backend, detector, doc_id="custom id")
    assert [d.doc_id for d in backend.list_documents()] == ["custom id"]
    assert backend.get_page("custom id", 1).page == 1


def _break_page_2(monkeypatch):
    """Make PyMuPDF fail when the text of the second page (index 1) is read."""
    original = pymupdf.Page.get_text

    def get_text(self, *args, **kwargs):
        if self.number == 1:
            raise RuntimeError("simulated read failure\nsecond line of the error")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(pymupdf.Page, "get_text", get_text)


@pytest.fixture
def fail_on_page_2(monkeypatch):
    _break_page_2(monkeypatch)


def test_extraction_failure_leaves_nothing(multilingual_pdf, detector, backend, fail_on_page_2):
    with pytest.raises(PdfError) as info:
        index_pdf(multilingual_pdf.path, backend, detector)
    # PyMuPDF's own message never reaches the reason (it may hold server paths)
    assert str(info.value) == "multilingual-report.pdf: page 2 cannot be read (damaged or unsupported page content)"
    assert backend.list_documents() == []
    assert backend.get_page("multilingual-report", 1) is None

    summary = index_paths([multilingual_pdf.path], backend, detector)
    assert summary.documents == 0 and summary.pages == 0
    assert "page 2 cannot be read" in summary.failures[0].reason
    assert backend.list_documents() == []


def test_extraction_failure_keeps_previous_version(multilingual_pdf, make_pdf, language_pages, detector, backend,
                                                   monkeypatch):
    index_pdf(multilingual_pdf.path, backend, detector)
    before = [backend.get_page("multilingual-report", n) for n in range(1, 10)]

    # a new version of the same file, whose page 2 cannot be read
    new_version = make_pdf("multilingual-report.pdf", [language_pages["it"], language_pages["pt"],
                                                       language_pages["nl"]])
    assert new_version == multilingual_pdf.path
    _break_page_2(monkeypatch)
    summary = index_paths([new_version], backend, detector)
    assert summary.documents == 0 and len(summary.failures) == 1

    info = backend.get_document("multilingual-report")
    assert (info.pages, info.empty_pages) == (9, 2)
    assert [backend.get_page("multilingual-report", n) for n in range(1, 10)] == before
    assert search(backend, detector, ["multilingual-report"], "greenhouse gas emissions Scope")[0].page == 1


def test_bad_file_with_the_id_of_an_indexed_document_keeps_it(multilingual_pdf, bad_pdfs, detector, backend):
    index_pdf(multilingual_pdf.path, backend, detector, doc_id="corrupted")
    summary = index_paths([bad_pdfs["corrupted"]], backend, detector)  # same stem, "corrupted"
    assert summary.documents == 0 and len(summary.failures) == 1
    assert backend.get_document("corrupted").pages == 9
