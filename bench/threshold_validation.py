"""Choose the classifier's default t on labelled validation pools, then test it on others.

The issue asks for a default t "chosen by measurement on held-out pools" that keeps at
least 90 % of the unthresholded R@3 while returning at most half of the pool. The
training-split rule (``choose_threshold`` on out-of-fold pools of the training
filings) gives 0.07, which returns 64-73 % of a report's pool. This reads run files of
`evidentia eval --run-out` (each pool scored by the model under test, unthresholded),
one group per kind of document, and picks

    the lowest t on a 0.005 grid at which, in every validation group,
    (a) R@3 kept >= --min-recall-kept in >= --confidence of bootstrap resamples of the
        group's queries, and (b) the group's share of pool pages returned <= --max-pool-share.

Lowest, not highest: of the thresholds that meet both, the one that hides the least
evidence. Then, on each ``--test`` set (labels no choice was made on), it prints R@3
kept with a 95 % bootstrap interval and the share of the pool returned, at the chosen t
and at each ``--t``.

    python bench/threshold_validation.py --config hybrid+classifier \
        --validate filings:run-filings.jsonl:filings.jsonl --validate bhp:run-bhp.jsonl:bhp.jsonl \
        --validate printed:run-printed.jsonl:printed.jsonl --validate passages:run-passages.jsonl:passages.jsonl \
        --test fresh-filings:run-f.jsonl:f.jsonl --test fresh-bhp:run-b.jsonl:b.jsonl --t 0.07
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from evidentia.reranker.relevance_model import (MAX_POOL_SHARE, MIN_RECALL_KEPT, THRESHOLD_CONFIDENCE,
                                                THRESHOLD_GRID, recall_at_thresholds, resamples_keeping)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from threshold_rule import pools_of  # noqa: E402

GRID = list(THRESHOLD_GRID)


def group_curves(pools, grid, resamples: int, min_recall_kept: float, seed: int):
    """Per t: R@3 kept, share of resamples keeping >= min_recall_kept, share of pool pages returned."""
    recall, share = recall_at_thresholds(pools, grid, 3)
    kept = recall.sum(axis=1) / recall[0].sum()
    return kept, resamples_keeping(recall, min_recall_kept, resamples, seed), share


def lowest_threshold(groups, min_recall_kept: float = MIN_RECALL_KEPT, max_pool_share: float = MAX_POOL_SHARE,
                     confidence: float = THRESHOLD_CONFIDENCE, resamples: int = 1000, seed: int = 0):
    """The lowest grid t meeting both goals in every group (None if none does), with
    each group's curves and, per grid t, whether it meets them."""
    curves = [group_curves(pools, GRID, resamples, min_recall_kept, seed + g) for g, pools in enumerate(groups)]
    ok = [all(sure[j] >= confidence and share[j] <= max_pool_share for _kept, sure, share in curves)
          for j in range(len(GRID))]
    return next((t for t, good in zip(GRID, ok) if good), None), curves, ok


def kept_interval(pools, t: float, resamples: int, seed: int) -> tuple[float, float, float, float, int]:
    """R@3 kept at t with its 95 % bootstrap interval, pool share, queries left with no page."""
    recall, share = recall_at_thresholds(pools, [0.0, t], 3)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, recall.shape[1], size=(resamples, recall.shape[1]))
    ratios = recall[1][draws].sum(axis=1) / np.maximum(recall[0][draws].sum(axis=1), 1e-12)
    empty = sum(1 for probs, _labels in pools if not any(p >= t for p in probs))
    return (float(recall[1].sum() / recall[0].sum()), float(np.percentile(ratios, 2.5)),
            float(np.percentile(ratios, 97.5)), float(share[1]), empty)


def parse_set(spec: str, config: str):
    name, run, queries = spec.split(":")
    return name, pools_of(Path(run), Path(queries), config)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--validate", action="append", required=True, help="NAME:RUN:QUERIES, one per group")
    ap.add_argument("--test", action="append", default=[], help="NAME:RUN:QUERIES, measured at the chosen t")
    ap.add_argument("--config", default="hybrid+classifier")
    ap.add_argument("--min-recall-kept", type=float, default=MIN_RECALL_KEPT)
    ap.add_argument("--max-pool-share", type=float, default=MAX_POOL_SHARE)
    ap.add_argument("--confidence", type=float, default=THRESHOLD_CONFIDENCE)
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--t", type=float, action="append", default=[], help="other thresholds to test")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    groups = [parse_set(spec, args.config) for spec in args.validate]
    chosen, curves, ok = lowest_threshold([pools for _name, pools in groups], args.min_recall_kept,
                                          args.max_pool_share, args.confidence, args.resamples, args.seed)

    shown = [t for t in GRID if 0.04 <= t <= 0.2 and abs(t * 100 - round(t * 100)) < 1e-6 or t == chosen]
    print(f"validation ({', '.join(f'{n} {len(p)}' for n, p in groups)}): R@3 kept / resamples keeping "
          f">= {args.min_recall_kept:.0%} / pool share returned")
    print("| t | " + " | ".join(n for n, _ in groups) + " | both goals |")
    print("|---|" + "---|" * (len(groups) + 1))
    for t in shown:
        j = GRID.index(t)
        cells = [f"{kept[j]:.2f} / {sure[j]:.2f} / {share[j]:.2f}" for kept, sure, share in curves]
        print(f"| {t:g}{' (chosen)' if t == chosen else ''} | " + " | ".join(cells) + f" | {'yes' if ok[j] else 'no'} |")
    if chosen is None:
        print("no t meets both goals in every group")
        return
    print(f"chosen t = {chosen:g}")
    tests = [parse_set(spec, args.config) for spec in args.test] + groups
    print("\n| set | queries | t | R@3 kept [95 % interval] | pool share | queries with no page |")
    print("|---|---|---|---|---|---|")
    for name, pools in tests:
        for t in [chosen, *args.t]:
            kept, low, high, share, empty = kept_interval(pools, t, args.resamples, args.seed)
            print(f"| {name} | {len(pools)} | {t:g} | {kept:.3f} [{low:.3f}, {high:.3f}] | {share:.2f} | {empty} |")


if __name__ == "__main__":
    main()
