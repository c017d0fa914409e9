"""Labelled sustainability-report pools from ClimRetrieve's expert passages.

ClimRetrieve (``passages.jsonl``) gives, per report, the passages experts marked
for each of the report's questions, but not the report PDFs. Each distinct
passage (a marked sentence's ``context``: the sentence with the sentences around it,
about a paragraph; one passage however many of its sentences were marked, and for
however many questions) goes into a generated PDF per report, laid out one of two ways
(``LAYOUTS``):

- ``passage``: one page per passage (82 words at the median);
- ``printed``: the report as printed, as far as the passages tell it: a cover
  page with the report's title, then one page per printed page the experts cited,
  in the report's order, holding every passage marked on that page (sentences the
  overlapping contexts share written once); passages without a printed page get a
  page each at the end; last, a glossary (``GLOSSARY``). Real reports have covers,
  glossaries and pages of several paragraphs; a model trained only on the
  ``passage`` layout learned that short pages are the reports' evidence and ranked
  real covers first, and one that never met a glossary ranked real ones first.

Marks without any text (``nan``) make no page in either layout. A query is a
(report, question) pair whose relevant pages are those holding a
passage marked for that question (relevance >= 1). Passages the experts marked
for the report's *other* questions, the cover and the glossary are its non-relevant pages:
hard negatives from the same document.
This is a page-level benchmark the evaluation can run like any other (indexed,
retrieved by bm25/dense/hybrid, reranked), and training can take records from.

The split by report (reports of the same company on one side) is fixed in
``training/splits/heldout.json`` so training never sees a held-out report.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from evidentia.text import json_line

SPLIT_FILE = Path(__file__).resolve().parent.parent / "training" / "splits" / "heldout.json"

_NOT_NAME = re.compile(r"\d+|\.pdf$|[_&]")
_GENERIC = {"report", "sustainability", "esg", "climate", "environmental", "annual", "global", "impact",
            "group", "business", "holdings", "and", "accounts", "summary", "highlights", "full", "the", "of"}


def report_group(report: str) -> str:
    """The company a report belongs to (its first non-generic word): the two
    Microsoft reports are one group, so they fall on the same side of the split."""
    words = [w for w in _NOT_NAME.sub(" ", report.lower()).split() if w not in _GENERIC]
    return words[0] if words else report.lower()


def doc_id_of(report: str) -> str:
    stem = re.sub(r"\.pdf$", "", report.strip(), flags=re.I)
    return "CR_" + re.sub(r"[^A-Za-z0-9]+", "_", stem).strip("_")


LAYOUTS = ("passage", "printed")
# A real report's glossary defines every term of a climate question and answers none.
# On the two graded BHP reports, a model that never met one put a glossary page first
# in 12 of 48 searches (hybrid: 8; docs/BENCHMARKS.md 8u). The ``printed`` layout ends
# with one: a sample of these terms chosen by the report's name (the same every run).
GLOSSARY_TERMS_PER_REPORT = 20
# Terms a climate report's glossary defines; written for the generated reports,
# none of them defines climate change adaptation (the subject of a ClimRetrieve
# question, so a glossary that defined it would be that question's evidence).
GLOSSARY = (
    ("Biodiversity",
     "The variety of living organisms in an ecosystem, including the diversity within species, between species and "
     "of ecosystems."),
    ("Carbon dioxide equivalent (CO2-e)",
     "The universal unit of measurement used to indicate the global warming potential of a greenhouse gas, "
     "expressed in terms of the global warming potential of one unit of carbon dioxide."),
    ("Carbon offset",
     "A reduction or removal of greenhouse gas emissions made to compensate for emissions occurring elsewhere, "
     "certified under a recognised standard and retired on behalf of the company."),
    ("Carbon price",
     "A cost applied to greenhouse gas emissions, either through a tax or an emissions trading scheme, or used "
     "internally to assess investments."),
    ("Circular economy",
     "An economic model that keeps products and materials in use for as long as possible, through reuse, repair, "
     "remanufacturing and recycling."),
    ("Climate-related opportunity",
     "A potential positive impact of climate change on an organisation, such as resource efficiency, new products "
     "and services, or access to new markets."),
    ("Decarbonisation",
     "The reduction of the greenhouse gas emissions associated with an activity, a product or an economy."),
    ("Downstream",
     "Activities that occur after a product leaves the company, including distribution, use by customers and "
     "end-of-life treatment."),
    ("Emissions intensity",
     "Greenhouse gas emissions per unit of output, such as per tonne of product or per unit of revenue."),
    ("Greenhouse gas (GHG)",
     "A gas that traps heat in the atmosphere, including carbon dioxide, methane, nitrous oxide and fluorinated "
     "gases."),
    ("GHG Protocol",
     "The Greenhouse Gas Protocol Corporate Accounting and Reporting Standard, which sets out how companies "
     "measure and report their emissions."),
    ("Hazardous waste",
     "Waste with properties that make it dangerous or potentially harmful to human health or the environment."),
    ("Industry association",
     "An organisation of companies in the same sector that represents their common interests, including in public "
     "policy."),
    ("IPCC",
     "The Intergovernmental Panel on Climate Change, the United Nations body for assessing the science related to "
     "climate change."),
    ("Just transition",
     "Greening the economy in a way that is as fair and inclusive as possible to everyone concerned, creating "
     "decent work and leaving no one behind."),
    ("Landfill", "A site for the disposal of waste materials by burial."),
    ("Life cycle assessment",
     "A method to assess the environmental impacts associated with all the stages of a product's life, from raw "
     "material extraction to disposal."),
    ("Materiality assessment",
     "A process to identify the environmental, social and governance issues that matter most to a business and its "
     "stakeholders."),
    ("Net zero",
     "A state in which the greenhouse gas emissions released into the atmosphere are balanced by those removed "
     "from it."),
    ("NGFS",
     "The Network of Central Banks and Supervisors for Greening the Financial System, which publishes climate "
     "scenarios for risk assessment."),
    ("Paris Agreement",
     "The international treaty on climate change adopted in 2015, which aims to limit global warming to well below "
     "2 degrees Celsius."),
    ("Physical climate risk",
     "Risk arising from the physical effects of climate change: acute risks from extreme weather events and "
     "chronic risks from longer-term shifts in climate patterns."),
    ("Renewable energy",
     "Energy from sources that are naturally replenished, such as solar, wind, hydro and geothermal power."),
    ("Resilience",
     "The capacity of a system, organisation or community to absorb disruption and continue to function."),
    ("Scenario analysis",
     "A process for identifying and assessing the potential implications of a range of plausible future states "
     "under conditions of uncertainty."),
    ("Science Based Targets initiative (SBTi)",
     "A partnership that defines and promotes best practice in setting emissions reduction targets in line with "
     "climate science."),
    ("Scope 1 emissions", "Direct greenhouse gas emissions from sources that are owned or controlled by the company."),
    ("Scope 2 emissions",
     "Indirect greenhouse gas emissions from the generation of purchased electricity, steam, heat or cooling "
     "consumed by the company."),
    ("Scope 3 emissions",
     "All other indirect greenhouse gas emissions that occur in the company's value chain, upstream and "
     "downstream."),
    ("Stakeholder",
     "A person or organisation that can affect or be affected by the company's activities, such as employees, "
     "customers, suppliers, investors and communities."),
    ("TCFD",
     "The Task Force on Climate-related Financial Disclosures, which recommends disclosures on governance, "
     "strategy, risk management, and metrics and targets."),
    ("Transition risk",
     "Risk arising from the transition to a lower-carbon economy, including policy and legal, technology, market "
     "and reputational changes."),
    ("Upstream",
     "Activities that occur before a product reaches the company, including the extraction and production of "
     "purchased goods and their transport."),
    ("Value chain",
     "The full range of activities, upstream and downstream, involved in bringing a product or service from "
     "conception to end use."),
    ("Waste diversion rate",
     "The share of waste generated that is diverted from landfill and incineration through reuse, recycling or "
     "composting."),
    ("Water consumption",
     "Water withdrawn that is not returned to its source, because it is evaporated, incorporated into products or "
     "otherwise used up."),
    ("Water stress", "The ratio of total water withdrawals to available renewable water supply in a region."),
    ("Water withdrawal",
     "The total volume of water drawn from surface water, groundwater, seawater or a third party for any use."),
)



@dataclass
class Unit:
    """One marked passage."""

    text: str
    marked: dict[str, int] = field(default_factory=dict)  # question -> the expert's relevance
    printed_page: int | None = None  # the report's page number the experts cited


@dataclass
class ReportPage:
    """One page of a generated report: its text and the marks of its passages."""

    text: str
    marked: dict[str, int] = field(default_factory=dict)


@dataclass
class Report:
    name: str
    units: list[Unit]
    answers: dict[str, str]  # question -> expert answer (first given)

    @property
    def doc_id(self) -> str:
        return doc_id_of(self.name)

    @property
    def questions(self) -> list[str]:
        return sorted(self.answers)

    def layout_doc_id(self, layout: str) -> str:
        """The generated PDF's document id: the ``passage`` layout keeps the report's
        id (the pools of earlier rounds), the others add their name."""
        return self.doc_id if layout == "passage" else f"{self.doc_id}_{layout}"

    @property
    def title(self) -> str:
        return re.sub(r"\s+", " ", re.sub(r"\.pdf$", "", self.name.strip(), flags=re.I).replace("_", " ")).strip()

    def pages(self, layout: str = "passage") -> list[ReportPage]:
        if layout not in LAYOUTS:
            raise ValueError(f"unknown layout {layout!r}; one of {', '.join(LAYOUTS)}")
        if layout == "passage":
            return [ReportPage(u.text, dict(u.marked)) for u in self.units]
        by_page: dict[int, list[Unit]] = defaultdict(list)
        unplaced = []
        for unit in self.units:
            if unit.printed_page is None:
                unplaced.append(unit)
            else:
                by_page[unit.printed_page].append(unit)
        groups = [by_page[n] for n in sorted(by_page)] + [[u] for u in unplaced]
        return [ReportPage(self.title)] + [_page_of(units) for units in groups] + [self.glossary()]

    def glossary(self) -> ReportPage:
        """The printed layout's last page: GLOSSARY_TERMS_PER_REPORT of GLOSSARY's
        terms, alphabetically, relevant to no question."""
        seed = int(hashlib.sha256(self.name.encode("utf-8")).hexdigest()[:8], 16)
        terms = sorted(random.Random(seed).sample(GLOSSARY, GLOSSARY_TERMS_PER_REPORT))
        return ReportPage("Glossary\n\n" + "\n\n".join(f"{term}\n{definition}" for term, definition in terms))


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def _page_of(units: list[Unit]) -> ReportPage:
    """The passages of one printed page; neighbouring passages' contexts overlap,
    so a sentence already on the page is not written again."""
    seen: set[str] = set()
    paragraphs = []
    marked: dict[str, int] = {}
    for unit in units:
        sentences = [s for s in _SENTENCE_END.split(unit.text) if s.strip() and s.strip() not in seen]
        seen.update(s.strip() for s in sentences)
        if sentences:
            paragraphs.append(" ".join(s.strip() for s in sentences))
        for question, relevance in unit.marked.items():
            marked[question] = max(marked.get(question, 0), relevance)
    return ReportPage("\n\n".join(paragraphs), marked)


def _is_missing(text) -> bool:
    return not isinstance(text, str) or text.strip().lower() in ("", "nan")


def passage_text(row: dict) -> str:
    """The text a ClimRetrieve row shows: its context (the marked passage with the
    sentences around it), else the marked text itself; "" for a mark without any
    text ("nan" for both), which no page and no training record can show."""
    context = row.get("context")
    if not _is_missing(context):
        return context.strip()
    text = row.get("relevant_text")
    return "" if _is_missing(text) else text.strip()


def load_reports(passages_file: Path) -> list[Report]:
    """Reports with their distinct passages (keyed by the text a page shows) and marks."""
    by_report: dict[str, list[dict]] = defaultdict(list)
    with open(passages_file, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                by_report[row["report"]].append(row)
    reports = []
    for name, rows in sorted(by_report.items()):
        units: dict[str, Unit] = {}
        answers: dict[str, str] = {}
        for row in rows:
            text = passage_text(row)
            if _is_missing(text):
                # a mark without any text ("nan" for both the passage and its context;
                # 17 rows, 7 of them rated relevant): no page can show it, and as a
                # page reading "nan" it was evidence a model learnt to rank first
                continue
            # Keyed by the text shown, not the marked sentence: sentences of one paragraph
            # marked for different questions share their context, and keyed apart they
            # made pages of the same text labelled relevant on one and not on the others
            # (38 of 545 pages; 26 of 140 report questions, docs/BENCHMARKS.md 8ah).
            key = " ".join(text.split())
            unit = units.setdefault(key, Unit(text, printed_page=printed_page(row)))
            if unit.printed_page is None:
                unit.printed_page = printed_page(row)
            try:
                relevance = int(row.get("relevance"))
            except (TypeError, ValueError):
                relevance = 0  # unrated marks count as not relevant
            question = row["question"]
            unit.marked[question] = max(unit.marked.get(question, 0), relevance)
            answers.setdefault(question, str(row.get("answer") or "").strip())
        reports.append(Report(name, list(units.values()), answers))
    return reports


def printed_page(row: dict) -> int | None:
    """The report's page number the experts cited for a row (None where not given)."""
    try:
        return int(row.get("printed_page"))
    except (TypeError, ValueError):
        return None


def load_definitions(path: Path | None) -> dict[str, str]:
    if path is None or not Path(path).exists():
        return {}
    out = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                out[row["question"].strip()] = str(row.get("Definition") or "").strip()
    return out


def load_split(path: Path = SPLIT_FILE) -> dict:
    return json.loads(Path(path).read_text())


def held_out_reports(split: dict) -> set[str]:
    return set(split["climretrieve-train"]["held_out_reports"])


def queries_of(report: Report, definitions: dict[str, str] | None = None, layout: str = "passage") -> list[dict]:
    """Eval-format queries of a report in ``layout``: one per question with a relevant page."""
    out = []
    pages = report.pages(layout)
    doc_id = report.layout_doc_id(layout)
    for qi, question in enumerate(report.questions):
        relevant = [i + 1 for i, p in enumerate(pages) if p.marked.get(question, 0) >= 1]
        if not relevant:
            continue
        # string fields become evaluation categories: only the short ones
        row = {"id": f"{doc_id}-q{qi:02d}", "doc_id": doc_id, "question": question,
               "answer": report.answers[question], "relevant_pages": relevant, "company": report_group(report.name),
               "has_definition": bool(definitions and definitions.get(question.strip())), "layout": layout}
        out.append(row)
    return out


_FONT_SIZES = (11, 9, 7, 5, 4)


def write_report_pdf(report: Report, path: Path, layout: str = "passage") -> Path:
    """One PDF page per ``report.pages(layout)``; the font shrinks until the whole
    text fits, and a page too long even at the smallest size grows taller."""
    import pymupdf

    doc = pymupdf.open()
    for report_page in report.pages(layout):
        height = 842
        while True:
            fitted = False
            for size in _FONT_SIZES:
                page = doc.new_page(width=595, height=height)
                # insert_textbox returns a negative number when the text did not fit
                if page.insert_textbox(pymupdf.Rect(56, 56, 540, height - 52), report_page.text, fontsize=size,
                                       fontname="helv") >= 0:
                    fitted = True
                    break
                doc.delete_page(-1)
            if fitted:
                break
            height *= 2
    doc.save(path)
    doc.close()
    return path


def write_pools(passages_file: Path, out_dir: Path, definitions_file: Path | None = None,
                split: dict | None = None, layouts: Sequence[str] = ("passage",)) -> dict[str, int]:
    """``out_dir``/pdfs/<doc_id>.pdf, train_queries.jsonl and heldout_queries.jsonl:
    each report in each of ``layouts`` (a document and queries of its own)."""
    for layout in layouts:
        if layout not in LAYOUTS:
            raise ValueError(f"unknown layout {layout!r}; one of {', '.join(LAYOUTS)}")
    split = split if split is not None else load_split()
    held = held_out_reports(split)
    definitions = load_definitions(definitions_file)
    out_dir = Path(out_dir)
    (out_dir / "pdfs").mkdir(parents=True, exist_ok=True)
    counts = {"reports": 0, "train_queries": 0, "heldout_queries": 0, "pages": 0}
    sides: dict[str, list[str]] = {"train": [], "heldout": []}
    for report in load_reports(passages_file):
        side = "heldout" if report.name in held else "train"
        counts["reports"] += 1
        for layout in layouts:
            write_report_pdf(report, out_dir / "pdfs" / f"{report.layout_doc_id(layout)}.pdf", layout)
            sides[side].extend(json_line(q) for q in queries_of(report, definitions, layout))
            counts["pages"] += len(report.pages(layout))
    for side, lines in sides.items():
        (out_dir / f"{side}_queries.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        counts[f"{side}_queries"] = len(lines)
    return counts


def labelled_pairs(reports: list[Report], names: set[str] | None = None) -> list[tuple[str, str, str, int]]:
    """(report, question, passage text, label) for every question of a report and
    every passage of that report: 1 when marked for the question (relevance >= 1)."""
    out = []
    for report in reports:
        if names is not None and report.name not in names:
            continue
        for question in report.questions:
            for unit in report.units:
                out.append((report.name, question, unit.text, int(unit.marked.get(question, 0) >= 1)))
    return out
