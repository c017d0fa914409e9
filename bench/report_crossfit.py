"""Does training on real-report labels help on a real report it never saw, for questions
it never met? A 2 x 2 cross-fit over the BHP page labels (bench/report_labels.py).

The graded queries (pages graded 2 relevant, pages graded 1 left out of training) are
cut by report and by question: the questions fall in two halves (a hash of the
question), and the queries of one report and one half are scored by a model trained on
the base records (the README's shipped-model records) plus the records of the *other*
report's *other* half only, so that neither the document nor the question was met in
training. Each cell's model is trained with the README's commands (`evidentia dataset`,
`evidentia train --kind features`) and scored with `evidentia eval` at its own default
t; the four cells' runs are pooled and compared with hybrid and with a baseline model
(default: the shipped one) on the same queries and index: paired bootstrap of the gains,
ECE of the pools, and the share of R@3 and of the pool kept at the default t.

    export EVIDENTIA_DATA_DIR=/tmp/evd      # the README's index, plus ../shared/data/csr-samples
    python bench/report_crossfit.py --base-records train.jsonl --work /tmp/report-crossfit \
        [--record-weight 0.38] [--threshold-skip-docs BHP_] [--memory-exclude-docs BHP_]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from crossfit_eval import (DEFAULT_T, default_threshold, evaluate_at_default, pool_statistics,  # noqa: E402
                           read_jsonl, repeated, run, write_jsonl)
from paired_bootstrap import compare, per_query  # noqa: E402
from report_labels import LABELS, queries  # noqa: E402

from evidentia.reranker.classifier_model import SHIPPED_MODEL_DIR  # noqa: E402

TRAINING_BATCHES = (1, 2, 3, 4, 5, 6)
CONFIGS = ("hybrid", "hybrid+classifier")


def question_half(question: str) -> int:
    return hashlib.sha256(("bhp-half:" + question.lower().strip()).encode("utf-8")).digest()[0] % 2


def cells(graded: list[dict]) -> dict[tuple[str, int], list[dict]]:
    """(report, question half) -> its queries."""
    reports = sorted({q["doc_id"] for q in graded})
    return {(r, h): [q for q in graded if q["doc_id"] == r and question_half(q["question"]) == h]
            for r in reports for h in (0, 1)}


def training_cell(cell: tuple[str, int], reports: list[str]) -> tuple[str, int]:
    """The cell whose records train the model that scores ``cell``: the other report, the other half."""
    report_id, half = cell
    return reports[1 - reports.index(report_id)], 1 - half


def report(name: str, run_file: Path, queries_file: Path, samples: int, seed: int) -> None:
    scores = per_query(run_file, queries_file)
    ids = sorted(scores["hybrid"])
    for config in ("hybrid+classifier", DEFAULT_T):
        for metric, col in (("P@1", 2), ("P@3", 0)):
            c = compare([scores["hybrid"][q][col] for q in ids], [scores[config][q][col] for q in ids], samples, seed)
            print(f"  {name}, {config} - hybrid {metric}: {c['difference']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}] "
                  f"({c['better']} better / {c['worse']} worse)")
    qs = read_jsonl(queries_file)
    with_evidence = {q["id"] for q in qs if q["relevant_pages"]}
    relevant = {q["id"]: {(q["doc_id"], p) for p in q["relevant_pages"]} for q in qs}
    stats = pool_statistics([r for r in read_jsonl(run_file) if r["id"] in with_evidence], relevant)
    print(f"  {name}, pools of the {len(with_evidence)} queries with evidence: {stats['pages']} pages, "
          f"{stats['relevant']} relevant, mean p {stats['mean_p']:.3f}, ECE {stats['ECE']:.3f}; at the default t: "
          f"{stats['R@3 kept']:.0%} of R@3 kept, {stats['pool share']:.0%} of the pool returned")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-records", type=Path, required=True, help="the README's training records (train.jsonl)")
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--batch", type=int, action="append", help=f"BHP batches (default {TRAINING_BATCHES})")
    ap.add_argument("--record-weight", type=float, default=None, help="weight of the BHP records in the fit")
    ap.add_argument("--threshold-skip-docs", action="append", default=[],
                    help="documents whose pools do not choose a cell's t, besides CR_ (repeatable)")
    ap.add_argument("--memory-exclude-docs", action="append", default=[],
                    help="documents kept out of the question memory in a cell's training (repeatable)")
    ap.add_argument("--baseline", type=Path, default=SHIPPED_MODEL_DIR, help="model compared on the same queries")
    ap.add_argument("--samples", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    log = work / "log.txt"
    graded = queries(LABELS, 2, tuple(args.batch or TRAINING_BATCHES))
    reports = sorted({q["doc_id"] for q in graded})
    if len(reports) != 2:
        sys.exit(f"expected two reports in {LABELS.name}, found {len(reports)}")
    t0 = time.perf_counter()
    by_cell = cells(graded)
    for (r, h), cell in by_cell.items():
        write_jsonl(work / f"queries-{r}-{h}.jsonl", cell)
    pooled = []
    for (r, h), cell in by_cell.items():
        other = training_cell((r, h), reports)
        records = work / f"records-{other[0]}-{other[1]}.jsonl"
        if not records.exists():
            run(["evidentia", "dataset", "--queries", str(work / f"queries-{other[0]}-{other[1]}.jsonl"),
                 "--negatives", "20", "--document-negatives", "200", "--stage", "hybrid", "--out", str(records),
                 *(["--record-weight", str(args.record_weight)] if args.record_weight else [])], log)
        train = work / f"train-{r}-{h}.jsonl"
        train.write_text(args.base_records.read_text(encoding="utf-8") + records.read_text(encoding="utf-8"),
                         encoding="utf-8")
        model = work / f"model-{r}-{h}"
        run(["evidentia", "train", "--kind", "features", "--data", str(train), "--out", str(model),
             *repeated("--threshold-skip-docs", ("CR_", *args.threshold_skip_docs)),
             *repeated("--memory-exclude-docs", args.memory_exclude_docs)], log)
        t = default_threshold(model)
        evaluate_at_default(work / f"queries-{r}-{h}.jsonl", model, t, CONFIGS, work / f"run-{r}-{h}.jsonl", log)
        pooled += read_jsonl(work / f"run-{r}-{h}.jsonl")
        print(f"cell {r}, half {h}: {len(cell)} queries, trained with {other[0]} half {other[1]}, t {t} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    all_queries = work / "queries.jsonl"
    write_jsonl(all_queries, [q for cell in by_cell.values() for q in cell])
    write_jsonl(work / "run-crossfit.jsonl", pooled)
    evaluate_at_default(all_queries, args.baseline, default_threshold(args.baseline), CONFIGS,
                        work / "run-baseline.jsonl", log)
    print(f"\n{len(graded)} queries (pages graded 2), hybrid pools; load {os.getloadavg()[0]:.1f}")
    report("cross-fitted", work / "run-crossfit.jsonl", all_queries, args.samples, args.seed)
    report(f"baseline ({args.baseline.name})", work / "run-baseline.jsonl", all_queries, args.samples, args.seed)


if __name__ == "__main__":
    main()
