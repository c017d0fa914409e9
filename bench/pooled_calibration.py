"""Calibration of one configuration over several `evidentia eval` runs together: the
reliability table and the ECE of every scored pool page of all of them.

Why several runs: a calibration held out by document scores each document with a model
that was calibrated without it, so the queries of one test set come from two or more
runs (docs/BENCHMARKS.md 8ad: batch 9's queries on one BHP report scored by the model
calibrated on the other, and the other way round). `evidentia eval` reports the ECE of
one run.

    python bench/pooled_calibration.py --set runA.jsonl:ctap-queries.jsonl --set runB.jsonl:ccr-queries.jsonl \
        [--config hybrid+classifier] [--bins 10]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from evidentia.evaluation.metrics import expected_calibration_error, reliability_bins

sys.path.insert(0, str(Path(__file__).resolve().parent))
from threshold_rule import pools_of  # noqa: E402


def pooled_pairs(sets: list[tuple[Path, Path]], config: str) -> tuple[list[float], list[int]]:
    """(probability, relevant) of every page each run's ``config`` ranked, all runs together."""
    probabilities: list[float] = []
    labels: list[int] = []
    for run_file, queries_file in sets:
        pools = pools_of(run_file, queries_file, config)
        if not pools:
            raise SystemExit(f"{run_file.name}: no ranking of configuration {config!r}")
        for probs, rel in pools:
            probabilities += probs
            labels += rel
    return probabilities, labels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", action="append", required=True, help="RUN:QUERIES, one per run")
    ap.add_argument("--config", default="hybrid+classifier", help="the configuration whose probabilities are read")
    ap.add_argument("--bins", type=int, default=10)
    args = ap.parse_args()
    sets = []
    for spec in args.set:
        run, _, queries = spec.partition(":")
        if not queries:
            raise SystemExit(f"--set {spec!r}: expected RUN:QUERIES")
        sets.append((Path(run), Path(queries)))
    probabilities, labels = pooled_pairs(sets, args.config)
    print(f"{len(probabilities)} pages, {sum(labels)} relevant, from {len(sets)} run(s)")
    print("| p | pages | mean p | relevant |\n|---|---|---|---|")
    for i, b in enumerate(reliability_bins(probabilities, labels, args.bins)):
        if b.count:
            print(f"| {i / args.bins:.1f}-{(i + 1) / args.bins:.1f} | {b.count} | {b.mean_probability:.3f} | "
                  f"{b.observed_frequency:.3f} |")
    print(f"ECE {expected_calibration_error(probabilities, labels, args.bins):.4f}")


if __name__ == "__main__":
    main()
