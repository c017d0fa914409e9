"""Labelled sustainability-report pools from ClimRetrieve's expert passages.

ClimRetrieve (``passages.jsonl``) gives, per report, the passages experts marked
for each of the report's questions, but not the report PDFs. Each distinct
marked passage (its ``context``: the marked text with the sentences around it,
about a paragraph) becomes one page of a generated PDF per report; a query is a
(report, question) pair whose relevant pages are the passages marked for that
question (relevance >= 1). Passages the experts marked for the report's *other*
questions are its non-relevant pages: hard negatives from the same document.
This is a page-level benchmark the evaluation can run like any other (indexed,
retrieved by bm25/dense/hybrid, reranked), and training can take records from.

The split by report (reports of the same company on one side) is fixed in
``training/splits/heldout.json`` so training never sees a held-out report.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

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


@dataclass
class Unit:
    """One marked passage: a page of the generated report."""

    text: str
    marked: dict[str, int] = field(default_factory=dict)  # question -> the expert's relevance


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


def _unit_text(row: dict) -> str:
    context = row.get("context")
    if isinstance(context, str) and context.strip() and context.strip().lower() != "nan":
        return context.strip()
    return str(row.get("relevant_text") or "").strip()


def load_reports(passages_file: Path) -> list[Report]:
    """Reports with their distinct passages (keyed by the marked text) and marks."""
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
            key = str(row.get("relevant_text") or "").strip() or _unit_text(row)
            text = _unit_text(row)
            if not text:
                continue
            unit = units.setdefault(key, Unit(text))
            try:
                relevance = int(row.get("relevance"))
            except (TypeError, ValueError):
                relevance = 0  # unrated marks count as not relevant
            question = row["question"]
            unit.marked[question] = max(unit.marked.get(question, 0), relevance)
            answers.setdefault(question, str(row.get("answer") or "").strip())
        reports.append(Report(name, list(units.values()), answers))
    return reports


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


def queries_of(report: Report, definitions: dict[str, str] | None = None) -> list[dict]:
    """Eval-format queries of a report: one per question with a relevant page."""
    out = []
    for qi, question in enumerate(report.questions):
        relevant = [i + 1 for i, u in enumerate(report.units) if u.marked.get(question, 0) >= 1]
        if not relevant:
            continue
        # string fields become evaluation categories: only the short ones
        row = {"id": f"{report.doc_id}-q{qi:02d}", "doc_id": report.doc_id, "question": question,
               "answer": report.answers[question], "relevant_pages": relevant, "company": report_group(report.name),
               "has_definition": bool(definitions and definitions.get(question.strip()))}
        out.append(row)
    return out


def write_report_pdf(report: Report, path: Path) -> Path:
    """One page per passage; the font shrinks until the whole passage fits."""
    import pymupdf

    doc = pymupdf.open()
    for unit in report.units:
        page = doc.new_page(width=595, height=842)
        for size in (11, 9, 7, 5, 4):
            # insert_textbox returns a negative number when the text did not fit
            if page.insert_textbox(pymupdf.Rect(56, 56, 540, 790), unit.text, fontsize=size, fontname="helv") >= 0:
                break
            page.clean_contents()
            doc.delete_page(-1)
            page = doc.new_page(width=595, height=842)
    doc.save(path)
    doc.close()
    return path


def write_pools(passages_file: Path, out_dir: Path, definitions_file: Path | None = None,
                split: dict | None = None) -> dict[str, int]:
    """``out_dir``/pdfs/<doc_id>.pdf, train_queries.jsonl and heldout_queries.jsonl."""
    split = split if split is not None else load_split()
    held = held_out_reports(split)
    definitions = load_definitions(definitions_file)
    out_dir = Path(out_dir)
    (out_dir / "pdfs").mkdir(parents=True, exist_ok=True)
    counts = {"reports": 0, "train_queries": 0, "heldout_queries": 0, "pages": 0}
    sides: dict[str, list[str]] = {"train": [], "heldout": []}
    for report in load_reports(passages_file):
        write_report_pdf(report, out_dir / "pdfs" / f"{report.doc_id}.pdf")
        side = "heldout" if report.name in held else "train"
        sides[side].extend(json.dumps(q, ensure_ascii=False) for q in queries_of(report, definitions))
        counts["reports"] += 1
        counts["pages"] += len(report.units)
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
