"""ClimRetrieve passages -> labelled page-level pools (evaluation/climretrieve.py)
and the fixed held-out split (training/splits/heldout.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evidentia.evaluation.climretrieve import (GLOSSARY, GLOSSARY_TERMS_PER_REPORT, LAYOUTS, SPLIT_FILE, Report,
                                               doc_id_of, labelled_pairs, load_reports, load_split, queries_of,
                                               report_group, write_pools, write_report_pdf)
from evidentia.evaluation.queries import load_queries
from tests.utils.paths import SHARED_DATA

SHARED = SHARED_DATA / "climretrieve-train"
Q1, Q2 = "Does the company report climate scenarios?", "Does the company have a waste strategy?"


def _rows():
    return [
        {"report": "Acme 2023 Sustainability Report.pdf", "question": Q1, "answer": "[YES] 1.5C and 4C",
         "relevant_text": "We use the 1.5C and 4C scenarios.", "context": "Scenario analysis. We use the 1.5C and "
         "4C scenarios. They cover physical and transition risk.", "relevance": 3},
        {"report": "Acme 2023 Sustainability Report.pdf", "question": Q2, "answer": "[YES] zero waste",
         "relevant_text": "Zero waste to landfill by 2030.", "context": "nan", "relevance": 2},
        # another sentence of the same paragraph marked for a second question: the page
        # shows the paragraph, so it is one page, relevant to both (not two pages of the
        # same text, one relevant and one not)
        {"report": "Acme 2023 Sustainability Report.pdf", "question": Q2, "answer": "[YES] zero waste",
         "relevant_text": "They cover physical and transition risk.", "context": "Scenario analysis.  We use the "
         "1.5C and 4C scenarios. They cover physical and transition risk.", "relevance": 1},
        {"report": "Acme 2023 Sustainability Report.pdf", "question": Q1, "answer": "[YES] 1.5C and 4C",
         "relevant_text": "Unrated mark.", "context": "", "relevance": None},
        {"report": "Other Co ESG Report 2022.pdf", "question": Q1, "answer": "[NO]",
         "relevant_text": "Nothing on scenarios.", "context": "Nothing on scenarios here.", "relevance": 1},
    ]


@pytest.fixture
def passages(tmp_path) -> Path:
    path = tmp_path / "passages.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    return path


def test_reports_of_one_company_share_a_group():
    assert report_group("2022 Microsoft Environmental Sustainability Report.pdf") == \
        report_group("Microsoft 2022 Environmental Sustainability Report.pdf") == "microsoft"
    assert report_group("2022_BXP_ESG_Report.pdf") == "bxp"
    assert doc_id_of("AT&T 2022 Sustainability Summary.pdf") == "CR_AT_T_2022_Sustainability_Summary"


def test_passages_become_pages_with_their_marks(passages):
    acme, other = load_reports(passages)
    assert [len(acme.units), len(other.units)] == [3, 1]
    scenario = acme.units[0]
    assert scenario.marked == {Q1: 3, Q2: 1} and scenario.text.startswith("Scenario analysis.")
    assert acme.units[1].text == "Zero waste to landfill by 2030."  # context "nan": the marked text itself
    assert acme.units[2].marked == {Q1: 0}  # an unrated mark is not a relevance judgement
    queries = {q["question"]: q for q in queries_of(acme)}
    assert queries[Q1]["relevant_pages"] == [1] and queries[Q2]["relevant_pages"] == [1, 2]
    pairs = labelled_pairs([acme])
    assert len(pairs) == 6 and sum(p[3] for p in pairs) == 3


def test_write_pools_splits_by_report_and_the_pdfs_hold_the_passages(passages, tmp_path):
    import pymupdf

    split = {"climretrieve-train": {"held_out_reports": ["Other Co ESG Report 2022.pdf"]}}
    counts = write_pools(passages, tmp_path / "out", split=split)
    assert counts == {"reports": 2, "train_queries": 2, "heldout_queries": 1, "pages": 4}
    held = load_queries(tmp_path / "out" / "heldout_queries.jsonl")
    assert [q.doc_ids for q in held] == [("CR_Other_Co_ESG_Report_2022",)]
    train = load_queries(tmp_path / "out" / "train_queries.jsonl")
    assert {q.doc_ids[0] for q in train} == {"CR_Acme_2023_Sustainability_Report"}
    with pymupdf.open(tmp_path / "out" / "pdfs" / "CR_Acme_2023_Sustainability_Report.pdf") as doc:
        assert doc.page_count == 3
        assert "They cover physical and transition risk." in doc[0].get_text().replace("\n", " ")


def test_long_passages_fit_on_their_page(tmp_path):
    import pymupdf

    rows = [{"report": "Long.pdf", "question": Q1, "answer": "", "relevant_text": "x",
             "context": " ".join(f"word{i}" for i in range(900)) + " THE-END", "relevance": 2}]
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(rows[0]) + "\n")
    write_pools(path, tmp_path / "o", split={"climretrieve-train": {"held_out_reports": []}})
    with pymupdf.open(tmp_path / "o" / "pdfs" / "CR_Long.pdf") as doc:
        assert doc.page_count == 1 and "THE-END" in doc[0].get_text()


def _printed_rows():
    acme = "Acme 2023 Sustainability Report.pdf"
    return [
        {"report": acme, "question": Q1, "answer": "[YES]", "relevant_text": "We use the 1.5C scenario.",
         "context": "Scenario analysis. We use the 1.5C scenario. It covers physical risk.", "printed_page": 12,
         "relevance": 3},
        # the same printed page, an overlapping context: one page, the shared sentence once
        {"report": acme, "question": Q2, "answer": "[YES]", "relevant_text": "Waste is sorted on site.",
         "context": "It covers physical risk. Waste is sorted on site.", "printed_page": 12, "relevance": 2},
        {"report": acme, "question": Q2, "answer": "[YES]", "relevant_text": "Zero waste by 2030.",
         "context": "nan", "printed_page": 4, "relevance": 1},
        {"report": acme, "question": Q1, "answer": "[YES]", "relevant_text": "Scenarios are reviewed yearly.",
         "context": "", "printed_page": None, "relevance": 1},
        # a mark without any text: no page can show it
        {"report": acme, "question": Q1, "answer": "[YES]", "relevant_text": "nan", "context": "nan",
         "printed_page": None, "relevance": 3},
    ]


def test_the_printed_layout_has_a_cover_and_the_report_s_pages_in_order(tmp_path):
    import pymupdf

    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _printed_rows()))
    (acme,) = load_reports(path)
    assert [p.text for p in acme.pages("passage")][-1] == "Scenarios are reviewed yearly."  # "nan": no page
    assert len(acme.pages("passage")) == 4
    pages = acme.pages("printed")
    assert [p.text for p in pages[:-1]] == [
        "Acme 2023 Sustainability Report",  # the cover: the report's title, relevant to nothing
        "Zero waste by 2030.",  # printed page 4 before printed page 12
        "Scenario analysis. We use the 1.5C scenario. It covers physical risk.\n\nWaste is sorted on site.",
        "Scenarios are reviewed yearly.",  # no printed page: at the end
    ]
    # then the glossary, relevant to nothing: the same terms every run, a report's own sample
    glossary = pages[-1]
    assert glossary.text.startswith("Glossary\n\n") and glossary.marked == {}
    terms = [t for t, _d in GLOSSARY if f"\n\n{t}\n" in glossary.text]
    assert len(terms) == GLOSSARY_TERMS_PER_REPORT and terms == sorted(terms)
    assert acme.pages("printed")[-1] == glossary and Report("Other 2022 Report.pdf", [], {}).glossary() != glossary
    assert not any("adaptation" in f"{t} {d}".lower() for t, d in GLOSSARY)  # no question's evidence
    assert pages[0].marked == {} and pages[2].marked == {Q1: 3, Q2: 2}
    queries = {q["question"]: q["relevant_pages"] for q in queries_of(acme, layout="printed")}
    assert queries == {Q1: [3, 4], Q2: [2, 3]}
    write_report_pdf(acme, tmp_path / "acme.pdf", layout="printed")
    with pymupdf.open(tmp_path / "acme.pdf") as doc:
        assert doc.page_count == 5 and doc[0].get_text().strip() == "Acme 2023 Sustainability Report"
        assert "Waste is sorted on site." in doc[2].get_text() and "Glossary" in doc[4].get_text()
    with pytest.raises(ValueError, match="unknown layout"):
        acme.pages("scanned")


def test_each_layout_is_a_document_of_its_own(tmp_path):
    import pymupdf

    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _printed_rows()))
    counts = write_pools(path, tmp_path / "o", split={"climretrieve-train": {"held_out_reports": []}},
                         layouts=("passage", "printed"))
    assert counts == {"reports": 1, "train_queries": 4, "heldout_queries": 0, "pages": 4 + 5}
    queries = load_queries(tmp_path / "o" / "train_queries.jsonl")
    printed = "CR_Acme_2023_Sustainability_Report_printed"
    by_layout = {(q.doc_ids[0], q.question): q for q in queries}
    assert by_layout[(printed, Q2)].relevant == {(printed, 2), (printed, 3)}
    assert by_layout[(printed, Q2)].fields["layout"] == "printed"
    assert len({q.id for q in queries}) == 4
    with pymupdf.open(tmp_path / "o" / "pdfs" / "CR_Acme_2023_Sustainability_Report_printed.pdf") as doc:
        assert doc.page_count == 5
    with pytest.raises(ValueError, match="unknown layout"):
        write_pools(path, tmp_path / "o2", split={"climretrieve-train": {"held_out_reports": []}}, layouts=("scan",))


def test_a_page_too_long_for_the_smallest_font_grows_instead_of_losing_text(tmp_path):
    import pymupdf

    rows = [{"report": "Huge.pdf", "question": Q1, "answer": "", "relevant_text": "x", "printed_page": 3,
             "context": " ".join(f"word{i}" for i in range(9000)) + " THE-END", "relevance": 2}]
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(rows[0]) + "\n")
    write_pools(path, tmp_path / "o", split={"climretrieve-train": {"held_out_reports": []}}, layouts=("printed",))
    with pymupdf.open(tmp_path / "o" / "pdfs" / "CR_Huge_printed.pdf") as doc:
        assert doc.page_count == 3 and doc[1].rect.height > 842
        text = doc[1].get_text()
        assert "word0 " in text and "THE-END" in text


def test_the_held_out_split_names_real_reports_on_both_sides():
    split = load_split(SPLIT_FILE)
    assert set(split["financebench-dev"]["held_out"]) >= {"3M", "Coca-Cola", "Netflix"}
    held = set(split["climretrieve-train"]["held_out_reports"])
    if not (SHARED / "passages.jsonl").exists():
        pytest.skip("shared ClimRetrieve data not present")
    reports = {r.name: r for r in load_reports(SHARED / "passages.jsonl")}
    assert held < set(reports) and len(held) >= 8
    # no company has reports on both sides
    held_groups = {report_group(n) for n in held}
    assert not {report_group(n) for n in reports if n not in held} & held_groups


def test_no_two_pages_of_a_real_report_show_the_same_text():
    # before the units were keyed by the text shown, 38 of 545 pages repeated another's
    # text, labelled relevant on one of them only (docs/BENCHMARKS.md 8ah)
    if not (SHARED / "passages.jsonl").exists():
        pytest.skip("shared ClimRetrieve data not present")
    for report in load_reports(SHARED / "passages.jsonl"):
        for layout in LAYOUTS:
            texts = [" ".join(page.text.split()) for page in report.pages(layout)]
            assert len(texts) == len(set(texts)), (report.name, layout)
