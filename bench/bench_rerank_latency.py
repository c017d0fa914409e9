"""Scoring latency of the classifier reranker on a 20-page pool, as the product
runs it: the hybrid first stage's pool, the reranker attached to the index (page
window vectors read from it), timed from candidates in to ranked pages out.
Also timed: the same pools with the window vectors computed on the fly (a
reranker used without an index, or pages indexed with EVIDENTIA_DENSE=off).

Usage: python bench/bench_rerank_latency.py --data-dir DIR_WITH_AN_INDEX --queries QUERIES.jsonl
       [--model DIR] [--n 20] [--threads 1] [--stage hybrid]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from evidentia.config import Settings
from evidentia.engine import Engine
from evidentia.evaluation.queries import load_queries
from evidentia.reranker.classifier import ClassifierReranker


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--queries", type=Path, required=True)
    ap.add_argument("--model", type=Path, default=None, help="model directory (default: the shipped one)")
    ap.add_argument("--n", type=int, default=20, help="queries (one pool each)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--stage", default="hybrid")
    args = ap.parse_args()
    settings = Settings.from_env().with_(data_dir=args.data_dir, threads=args.threads)
    engine = Engine(settings)
    backend = engine.backend
    embedder = engine.embedder
    t0 = time.perf_counter()
    reranker = ClassifierReranker(args.model, threshold=None, embedder=embedder)
    reranker.extractor.embedder.load()  # load the bi-encoder now, not inside the first timing
    load_s = time.perf_counter() - t0
    queries = load_queries(args.queries)[: args.n]
    pools = []
    for q in queries:
        query = engine.query(q.question, q.answer)
        pools.append((query, engine.retrieve(query, q.doc_ids, args.stage, 20)))
    timings: dict[str, list[float]] = {"stored_vectors": [], "computed_vectors": []}
    for mode in timings:
        reranker.attach_backend(backend if mode == "stored_vectors" else None)
        for q, pool in pools:
            reranker.extractor._windows.clear()  # no page is already cached
            t = time.perf_counter()
            reranker.rerank(q, pool)
            timings[mode].append(time.perf_counter() - t)
    out = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores", "load_average": os.getloadavg(),
        "threads": args.threads, "stage": args.stage, "model_load_s": round(load_s, 2),
        "pools": len(pools), "pages_per_pool": round(statistics.mean(len(p) for _, p in pools), 1),
    }
    for mode, ts in timings.items():
        ts = sorted(ts)
        out[mode] = {"median_s": round(statistics.median(ts), 3), "p90_s": round(ts[int(0.9 * (len(ts) - 1))], 3),
                     "max_s": round(ts[-1], 3)}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
