"""Queries with page labels written here: the two real BHP reports in
../shared/data/csr-samples, and new questions on the held-out SEC filings; for
`evidentia eval` and `bench/paired_bootstrap.py`.

ClimRetrieve's labelled reports are generated from their expert-marked passages only,
so every page of them is evidence for some climate question. A real report also
holds covers, contents, glossaries, assurance statements and pages on other
subjects. These labels measure the rerankers on such documents.

`bench/data/bhp_page_labels.jsonl` holds six batches of twelve questionnaire
questions without an answer (1-5 and 7), each asked of each report alone (24 queries
a batch), and ten (6, 8-16) of questions with the supplier's answer:
- batch 1, the questions of `bench/short_pages.py`: every page that the hybrid pool
  (20 pages) returned for any of them, 71 pages (45 of the 48 of the 2020 Climate
  Change Report, 26 of the 27 of the Climate Transition Action Plan), each against
  all twelve questions: 852 grades;
- batches 2 to 5: twelve other questions each, graded on every page of both
  reports (900 grades a batch).
The relevance model's signed weights were chosen on batch 1 and its glossary feature
on batches 1 and 2; batches 3 and 4 were written after that choice, 4 after the model
shipped: the confirmation (docs/BENCHMARKS.md 8u). Batch 5 was written and graded a
round later, the shipped model unchanged (section 8v).
- batch 6: forty (questionnaire question, answer) pairs, twenty per report, each
  asked of its own report: the way the product is used (an analyst checks a supplier's
  answer), where batches 1-5 give the question alone. Four agents wrote them from the
  report's text (the answer in BHP's words, with the report's figures, targets and
  programmes, and the pages it came from, `cited_by_writer`), six others graded every
  page of the report against each pair, blind to the writers' pages and to any
  ranking: 1,500 grades (docs/BENCHMARKS.md section 8x). ``--question-only`` drops
  the answers, to measure the same labels as batches 1-5 are measured;
  ``--reworded`` takes each answer as another agent reworded it, seeing only the
  question and the answer (the same facts, figures and names, none of the report's
  phrasing: `answer_reworded`), since the writers' answers echo the page.
- batch 7: twelve more questions without an answer, graded on every page of both
  reports (900 grades) by six agents, one per sixth of the pages; written and graded
  before any result of section 8y, and measured once after its decision
  (docs/BENCHMARKS.md section 8y).
- batch 8: twenty-four more (question, answer) pairs, twelve per report, written by one
  agent from the report's text; graded by two others (one per report) on the pages of
  each query's hybrid pool of 20 and the writer's pages, in page order, blind to the
  ranking and to the writer's pages: 480 grades. Written and graded to test the
  default threshold chosen on batches 1-7 and the other held-out pools, before any
  score on them was computed (docs/BENCHMARKS.md section 8ac). Pages outside the
  pool count as not relevant.
- batch 9: twenty-four more, written the same way by two agents (one per report, told
  to ask for nothing the 136 earlier questions asked), graded the same way by four
  others (six pairs each): 480 grades, written and graded before any score on them
  (docs/BENCHMARKS.md section 8ad). Every writer's page was in its pool.
- batch 10: twenty-four more, written and graded as batch 9 (480 grades), to test a
  calibration candidate of section 8ad chosen on batches 6-9, before any score on them.
- batch 11: twenty-four more, the same way (480 grades), written for section 8ae's
  candidates; first scored by the shipped model after the first of them had failed.
  Batches 8-11 are now also training data: the shipped model's document calibration
  reads them (`--calibration-only-docs BHP_`, README).
- batch 12: twenty-four more, the same way (480 grades), the test of that model
  (section 8ae), written before any score on them.
- batch 13: twenty-four more, the same way (480 grades), a first reading of that model
  (section 8af), written before any score on them. One grader gave a glossary page a 2
  (its greenhouse-gas entry is the only page that names the gases the report covers);
  kept as graded.
- batch 14: twenty-four more, the same way (480 grades), before any score on them: the
  test of section 8ag's candidate and a first reading of the shipped model. One writer
  asked how the company defines a carbon offset, which BHP defines only in its glossary;
  its grader gave the glossary page a 2 (and another glossary page a 1 for planning
  scenarios), against the rubric's "glossary 0"; kept as graded.
- batch 15: twenty-four more, the same way (480 grades; every question with a page
  graded 2), before any score on them: the test of section 8ah's candidate and a first
  reading of the shipped model.
- batch 16: twenty-four more, the same way (480 grades; every question with a page
  graded 2), before any score on them: the test of section 8ai's candidate and a first
  reading of the shipped model.
- batch 17: twenty-four more, the same way (480 grades; every question with a page
  graded 2), before any score on them: the test of section 8aj's candidate and a first
  reading of the shipped model. Two of its graders' judgement calls are kept as graded:
  the assurance statement graded 2 for a question on what that assurance leaves out,
  and a glossary page graded 2 for the countries of BHP's minerals asset groups, which
  the report states nowhere else.
- batch 18: twenty-four more, the same way (480 grades; every question with a page
  graded 2), before any score on them: the test of section 8ak's threshold and a first
  reading of the shipped model. Kept as graded: the assurance statement graded 2 as the
  only page listing the review's procedures, and two "Reporting terms" pages graded 2 for
  BHP's own definitions.
- batch 19: twenty-four more, the same way (480 grades), written after that threshold
  shipped, as the test of section 8ak's second candidate. One question has no page
  graded 2: its definition is stated only in the glossary, which its grader held to the
  rubric's 0 (another grader gave a glossary's word-for-word definition a 2; both kept).
- batch 20: twenty-four more, the same way (480 grades; every question with a page
  graded 2), before any score on them: the test of section 8al's candidate. Its graders
  read the index's page text (the Action Plan's page 9 as its figure reads), where the
  earlier batches' read the PDF's text layer.
- batch 21: twenty-four more, the same way (554 grades), before any score on them: the
  test of section 8am's candidate. Each question's pages to grade are the union of its
  hybrid pools with and without the answer (and the writer's), so that the question
  asked alone is graded on its own pool. Two Action Plan questions have no page graded
  2: their answers are the glossary's definitions, which the rubric grades 0.
- batch 22: twenty-four questionnaire questions **without an answer** (twelve a report),
  written by two agents as a CDP/TCFD/GRI questionnaire asks any company (5-14 words, no
  figure, no name, not written from one page), avoiding the 446 questions of batches
  1-21; graded by four others on each question's hybrid pool (and the writer's pages),
  blind (482 grades, 53 graded 2, 69 graded 1), with the rubric below for a question
  without an answer. The test of docs/BENCHMARKS.md 8an's reading: whether the steep
  calibration of the answer-stripped questions of batches 15-21 comes from grading the
  pool or from the kind of question. One question (GRI reporting) has no page graded 2: its
  grader found GRI's wording on the Report's page 42 but not its name, and gave it a 1.
- batch 23: twenty-four more questionnaire questions without an answer, the same way,
  avoiding the 469 of batches 1-22 (481 grades, 45 graded 2, 59 graded 1; every question
  with a page graded 2): whether batch 22's calibration was its kind's or its own (8an).
- batch 24: twenty-four answered questions (twelve a report) written from one page each,
  as batches 15-21, by two agents avoiding the 493 questions of batches 1-23; graded by
  two others (one a report) on the union of each question's hybrid pools with and
  without its answer and the writer's pages, in page order, blind to any ranking and to
  the writer's pages, seeing the question alone (542 grades, 34 graded 2, 29 graded 1;
  every question with a page graded 2). The fresh test of section 8ao's candidate, asked
  with and without the answer, written before any score on them.
- batch 25: twenty-four questionnaire questions without an answer, as batches 22-23, by
  two agents avoiding the same 493; graded by two others on each question's hybrid pool
  and the writer's pages (485 grades, 37 graded 2, 48 graded 1). Four questions have no
  page graded 2 (the report quantifies no physical-risk cost, names tailings only in a
  list, sets no revenue goal and no other climate target but one site's renewable power):
  queries without evidence. Batches 22 and 23 are since 8ao the calibration records of
  that section's candidate; 25 is the fresh test of its kind.
- batches 26 and 27: twenty-four more of each kind, the same way (26: 551 grades, 27 graded
  2, 23 graded 1, every question with a page graded 2; 27: 485 grades, 41 graded 2, 64
  graded 1, three questions without one), avoiding the 541 questions of batches 1-25:
  the fresh test of section 8ao's second candidate (a back cover), written after its rule
  and graded before any score on them.

Who graded: four LLM agents, each given a quarter of the pages, the twelve
questions and this rubric (batch 22: "the question comes from a CSR questionnaire asked
of any company; there is no supplier answer: judge what the page states about it"), and nothing of any ranking or probability:
- 2: the page itself states information that answers the question for BHP (the
  passage an analyst would cite);
- 1: BHP-specific information that partly answers it or that an analyst would read
  to check an answer;
- 0: the topic absent or in passing, a contents page, a glossary or definition, a
  cover, an assurance statement.
They are not expert annotations: read the figures as a second opinion on real
documents beside ClimRetrieve's expert labels, and the ungraded pages (4) as not
relevant.

Page 9 of the Action Plan is a figure printed as an image; until the indexer read such
figures (docs/BENCHMARKS.md 8al) its text was its 21-word caption, and its graders
graded that (112 of the plan's 236 questions, no 2). `bench/data/bhp_figure_regrades.jsonl`
holds it regraded from its image against all 236 by two other agents (25 graded 2, 44
graded 1); ``--figure-regrades`` applies them. The labels above are kept as graded.

    EVIDENTIA_DATA_DIR=/tmp/bhp evidentia index ../shared/data/csr-samples
    python bench/report_labels.py --min-grade 2 --batch 3 --batch 4 --batch 5 > bhp-direct.jsonl
    EVIDENTIA_DATA_DIR=/tmp/bhp evidentia eval --queries bhp-direct.jsonl \
        --compare hybrid,hybrid+cosine,hybrid+classifier,hybrid+classifier@0.07 --run-out run.jsonl
    python bench/paired_bootstrap.py --run run.jsonl --queries bhp-direct.jsonl --pair hybrid:hybrid+classifier

`bench/data/financebench_heldout_labels.jsonl` (`--filings`) holds 720 questions on the
17 filings of the six companies the shipped model never saw
(training/splits/heldout.json), to measure it on more than financebench's 27
held-out queries (docs/BENCHMARKS.md section 8w). Written after the model shipped by
LLM agents, each given four or five filings' text and financebench's three question
kinds (a figure from a statement, an analyst's question asked of every company, a
question particular to the filing), with an answer and the pages it came from; batch
1 with long answers (the figures and the reason), batch 2 with financebench's short
ones (the working kept apart in `working`, never searched). Other agents graded, with
the rubric above for a filing (2: the page states the answer or all the figures it is
computed from; 1: part of it; 0: not), every page that any of bm25, hybrid,
hybrid+classifier (their top 5), dense and hybrid+cosine (top 3) returned for a
question, with the writer's pages (`cited_by_writer`), in page order: 830 grades.
Pages outside that pool count as not relevant, so P@1 and P@3 of those
configurations are exact and recall is measured against the pooled pages. Batch 3:
48 more (question, answer) pairs, written by three agents (five or six filings each)
and graded by five others on the pages of each question's hybrid pool of 20 and the
writer's, in page order, blind to the ranking: 920 grades. Written and graded to test
the default threshold chosen on batches 1-2 and the other held-out pools, before any
score on them was computed (docs/BENCHMARKS.md section 8ac); three of them have no
page graded 2 (an answer whose parts are on different pages): they count in P@k as
misses and are left out of R@k. Batch 4: 48 more, written and graded the same way (three
writers, four graders, 913 grades), to test the calibration candidate of section 8ad
before any score on them; five have no page graded 2. Batches 5 and 6: 48 more each,
the same way (913 and 916 grades; three and five without a page graded 2), written for
section 8ae's candidates, batch 6 the test of its first one (C12). Batch 7: 48 more
(912 grades, two without a page graded 2), the test of the model shipped there (C13).
Batch 8: 48 more (914 grades, nine without a page graded 2), a first reading of that
model (section 8af). Batch 9: 48 more (911 grades, seven without a page graded 2), for
section 8ag's candidate and a first reading of the shipped model. Batch 10: 48 more (912
grades, seven without a page graded 2; 16, 15 and 17 of the three kinds as the writers
chose them), written for section 8ah's candidate before any score on them. Batch 11: 48
more (905 grades, two without a page graded 2), written for section 8ai's candidate
before any score on them (19 novel, 17 metrics and 12 domain questions). Batch 12: 48
more (914 grades, eight without a page graded 2; 14 novel, 18 metrics and 16 domain
questions), written for section 8aj's candidate before any score on them. Batch 13: 48
more (907 grades, six without a page graded 2; 19 novel, 15 metrics and 14 domain
questions), the test of section 8ak's threshold, before any score on them. Batch 14: 48
more (913 grades, six without a page graded 2; 18 novel, 16 metrics and 14 domain
questions), written after that threshold shipped, before any score on them. Batch 15: 48
more (920 grades, three without a page graded 2; 18 novel, 16 metrics and 14 domain
questions), written for section 8al's candidate before any score on them; its packets
carry the index's page text, as every batch's does from 15 on.

`bench/data/financebench_train_labels.jsonl` (`--training-filings`): 48 questions
written and graded the same way on the 14 filings of the companies training keeps
(934 grades, each question with a page graded 2): training data of the shipped model
(README; docs/BENCHMARKS.md 8ae), never an evaluation set.

    EVIDENTIA_DATA_DIR=/tmp/evd evidentia index ../shared/data/financebench-dev/pdfs
    python bench/report_labels.py --filings --batch 1 --batch 2 > fb-new.jsonl    # the 96 of section 8w
    EVIDENTIA_DATA_DIR=/tmp/evd evidentia eval --queries fb-new.jsonl --compare hybrid,hybrid+classifier ...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

LABELS = Path(__file__).with_name("data") / "bhp_page_labels.jsonl"
BATCHES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27)
# questions with the supplier's answer, each asked of one report
ANSWERED_BATCHES = (6, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 24, 26)
# graded on the pages of the hybrid pool (21, 24, 26: with and without the answer; and the writer's), not every
# page; 22, 23, 25, 27: questions without an answer, each asked of one report
POOL_GRADED_BATCHES = (8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27)
FILING_LABELS = Path(__file__).with_name("data") / "financebench_heldout_labels.jsonl"
# questions written and graded the same way on the filings of the companies training
# keeps (training/splits/heldout.json): training data of the shipped model (README)
TRAINING_FILING_LABELS = Path(__file__).with_name("data") / "financebench_train_labels.jsonl"
# The Action Plan's page 9 (a figure printed as an image) regraded from its image against
# every question of that report: its graders had its 21-word caption as its text
# (docs/BENCHMARKS.md 8al). Applied with --figure-regrades only.
FIGURE_REGRADES = Path(__file__).with_name("data") / "bhp_figure_regrades.jsonl"


def queries(labels: Path, min_grade: int, batches: tuple[int, ...] | None = None,
            question_only: bool = False, reworded: bool = False, regrades: Path | None = None) -> list[dict]:
    """One query per (document, question) of the given batches, in file order;
    relevant: the pages graded at least ``min_grade``; ``partly_relevant_pages``: those
    graded 1 below it (training leaves them out; evaluation counts them not relevant). A
    question without a relevant page in a document is kept (a query without evidence:
    what the threshold returns for it is measured too). ``question_only``: the answers left out; ``reworded``: each
    answer as reworded (``answer_reworded``) where a row has one. ``regrades``: rows of
    (doc_id, page, question, grade) that replace that page's grade for that question,
    or grade it where it was not graded."""
    rows = [json.loads(line) for line in labels.read_text(encoding="utf-8").splitlines() if line.strip()]
    if batches is not None:
        rows = [row for row in rows if row["batch"] in batches]
    if regrades is not None:
        override = {(r["doc_id"], r["page"], r["question"]): r["grade"]
                    for r in map(json.loads, filter(str.strip, regrades.read_text(encoding="utf-8").splitlines()))}
        first = {}
        for row in rows:
            first.setdefault((row["doc_id"], row["question"]), row)
        graded = {(row["doc_id"], row["page"], row["question"]) for row in rows}
        rows = [{**row, "grade": override.get((row["doc_id"], row["page"], row["question"]), row["grade"])}
                for row in rows]
        rows += [{**first[(doc_id, question)], "page": page, "grade": grade}
                 for (doc_id, page, question), grade in override.items()
                 if (doc_id, question) in first and (doc_id, page, question) not in graded]
    out: dict[tuple[str, str], dict] = {}
    for row in rows:
        key = (row["doc_id"], row["question"])
        if key not in out:
            out[key] = {"id": f"{row['doc_id']}-b{row['batch']}-q{len(out):02d}", "doc_id": row["doc_id"],
                        "question": row["question"],
                        "answer": "" if question_only else row.get("answer_reworded" if reworded else "answer",
                                                                   row.get("answer", "")),
                        "relevant_pages": [], "partly_relevant_pages": [],
                        "company": row.get("company", row["doc_id"])}
            if "question_type" in row:
                out[key]["question_type"] = row["question_type"]
        if row["grade"] >= min_grade:
            out[key]["relevant_pages"].append(row["page"])
        elif row["grade"] >= 1:  # answers in part: training leaves it out, evaluation counts it not relevant
            out[key]["partly_relevant_pages"].append(row["page"])
    for query in out.values():
        query["relevant_pages"].sort()
        query["partly_relevant_pages"].sort()
    return list(out.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--labels", type=Path, default=LABELS)
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--filings", action="store_true",
                       help=f"the held-out filings' labels ({FILING_LABELS.name}) instead of the BHP reports'")
    which.add_argument("--training-filings", action="store_true",
                       help=f"the training filings' labels ({TRAINING_FILING_LABELS.name}): training data")
    ap.add_argument("--min-grade", type=int, choices=(1, 2), default=2,
                    help="2: pages that answer the question; 1: also pages that partly answer it")
    ap.add_argument("--batch", type=int, action="append",
                    help="BHP: 1, 2: the questions the model was chosen on; 3, 4: the confirmation of that choice; "
                         "5: written after the model shipped; 6: questions with the supplier's answer; "
                         "7: written after them, measured once (section 8y); 8: answered, graded on the hybrid "
                         "pool, the threshold's test (section 8ac); 9-21: answered, fresh tests (8ad-8am); "
                         "22, 23: questionnaire questions without an answer, graded on their pool (8an); 24: answered, "
                         "graded on the pools with and without the answer, 25: as 22-23; 26, 27: as 24, 25 (8ao). "
                         "Filings: 1, long answers; 2, short ones; 3, the threshold's test; 4-15: fresh tests "
                         "(8ad-8al) (default: all)")
    ap.add_argument("--question-only", action="store_true", help="leave the answers out of the queries")
    ap.add_argument("--reworded", action="store_true",
                    help="batch 6: the answers as reworded by another agent (the same facts, not the report's words)")
    ap.add_argument("--figure-regrades", action="store_true",
                    help="BHP: the Action Plan's page 9, a figure, as regraded from its image "
                         f"({FIGURE_REGRADES.name})")
    args = ap.parse_args()
    labels = FILING_LABELS if args.filings else TRAINING_FILING_LABELS if args.training_filings else args.labels
    if args.question_only and args.reworded:
        ap.error("--question-only and --reworded exclude each other")
    if args.figure_regrades and (args.filings or args.training_filings):
        ap.error("--figure-regrades applies to the BHP reports' labels")
    found = queries(labels, args.min_grade, tuple(args.batch) if args.batch else None, args.question_only,
                    args.reworded, FIGURE_REGRADES if args.figure_regrades else None)
    if args.batch and not found:
        ap.error(f"no batch {', '.join(map(str, args.batch))} in {labels.name}")
    for query in found:
        print(json.dumps(query))
    return 0


if __name__ == "__main__":
    sys.exit(main())
