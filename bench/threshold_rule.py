"""Does the threshold chosen on some queries keep the evidence of new ones?

`evidentia train --kind features` chooses the default t on out-of-fold pools of the
training queries (``choose_threshold``). This draws, many times, a set of queries to
choose t on and the rest as "new companies", from the per-query pools of an
`evidentia eval --run-out` run (each pool scored by a model that never saw its company,
e.g. bench/crossfit_eval.py's run files), and reports what t keeps of the new queries'
R@3 and how much of their pools it returns, for the rule with and without resampling
(``confidence``). ``--also`` reports the pool share at each chosen t on another set of
pools (e.g. ClimRetrieve, which the threshold is not chosen on).

    python bench/threshold_rule.py --run /tmp/crossfit-train/run-fb.jsonl --queries /tmp/crossfit-train/queries-fb.jsonl \
        --also /tmp/crossfit-train/run-cr.jsonl:/tmp/crossfit-train/queries-cr.jsonl --choose 20
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np

from evidentia.reranker.relevance_model import choose_threshold, recall_at_thresholds


def pools_of(run_file: Path, queries_file: Path, config: str) -> list[tuple[list[float], list[int]]]:
    relevant = {}
    for line in queries_file.read_text(encoding="utf-8").splitlines():
        if line.strip():
            q = json.loads(line)
            relevant[q["id"]] = {(q["doc_id"], p) for p in q["relevant_pages"]}
    out = []
    for line in run_file.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row["config"] == config:
            out.append(([p["probability"] for p in row["ranking"]],
                        [int((p["doc_id"], p["page"]) in relevant[row["id"]]) for p in row["ranking"]]))
    return out


def kept_and_share(pools, t: float, k: int = 3) -> tuple[float, float]:
    """Share of the unthresholded R@k that t keeps, and of the pool pages it returns."""
    recall, share = recall_at_thresholds(pools, [0.0, t], k)
    return (recall[1].sum() / recall[0].sum() if recall[0].sum() else 1.0), float(share[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, required=True)
    ap.add_argument("--queries", type=Path, required=True)
    ap.add_argument("--also", action="append", default=[], help="RUN:QUERIES of other pools, share reported")
    ap.add_argument("--config", default="hybrid+classifier")
    ap.add_argument("--choose", type=int, default=20, help="queries t is chosen on per draw; the rest are new")
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--confidence", default="none,0.8,0.9", help="rules to compare: none = no resampling")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    pools = pools_of(args.run, args.queries, args.config)
    others = [pools_of(Path(r), Path(q), args.config) for r, q in (a.split(":") for a in args.also)]
    rules = [None if c == "none" else float(c) for c in args.confidence.split(",")]
    rng = random.Random(args.seed)
    results: dict = {rule: [] for rule in rules}
    for draw in range(args.draws):
        order = list(range(len(pools)))
        rng.shuffle(order)
        chosen_on = [pools[i] for i in order[:args.choose]]
        new = [pools[i] for i in order[args.choose:]]
        for rule in rules:
            t = choose_threshold(chosen_on, confidence=rule, seed=draw).threshold
            kept, share = kept_and_share(new, t)
            results[rule].append((t, kept, share, *[kept_and_share(o, t)[1] for o in others]))
    print(f"{len(pools)} pools; t chosen on {args.choose}, measured on the other {len(pools) - args.choose}; "
          f"{args.draws} draws")
    for rule, rows in results.items():
        r = np.asarray(rows)
        also = "".join(f", other pools returned {r[:, 3 + i].mean():.0%}" for i in range(len(others)))
        print(f"confidence {rule if rule is not None else 'none':>4}: t {r[:, 0].mean():.3f} (sd {r[:, 0].std():.3f}); "
              f"new queries: R@3 kept {r[:, 1].mean():.1%} on average, below 90 % in {np.mean(r[:, 1] < 0.9):.0%} "
              f"of draws, pool returned {r[:, 2].mean():.0%}{also}")


if __name__ == "__main__":
    main()
