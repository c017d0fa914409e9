"""Classifier reranker throughput on this machine: pages (and windows) scored per
second by the shipped CPU model, on real financebench pages with real queries.

Usage: python bench/bench_classifier.py --data-dir DIR_WITH_FINANCEBENCH_INDEX
       [--queries ../shared/data/financebench-dev/queries.jsonl] [--n 10] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

from evidentia.language import LanguageDetector
from evidentia.reranker.classifier import ClassifierReranker
from evidentia.reranker.classifier_model import encode_windows
from evidentia.retriever.query import build_query
from evidentia.retriever.tantivy_backend import TantivyBackend


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--queries", type=Path,
                    default=Path(__file__).resolve().parents[2] / "shared/data/financebench-dev/queries.jsonl")
    ap.add_argument("--n", type=int, default=10, help="queries (pools of 20 pages each)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=16)
    args = ap.parse_args()
    backend = TantivyBackend(args.data_dir / "index")
    detector = LanguageDetector()
    t0 = time.perf_counter()
    reranker = ClassifierReranker(threshold=None, threads=args.threads, batch_size=args.batch_size)
    load_s = time.perf_counter() - t0
    queries = [json.loads(line) for line in args.queries.open()][: args.n]
    pages = windows = 0
    seconds = 0.0
    for q in queries:
        query = build_query(q["question"], q["answer"], detector)
        pool = backend.search(query.keywords, [q["doc_id"]], 20)
        windows += sum(len(encode_windows(reranker.tokenizer, q["question"], q["answer"], c.text,
                                          reranker.input_format)) for c in pool)
        t0 = time.perf_counter()
        reranker.rerank(query, pool)
        seconds += time.perf_counter() - t0
        pages += len(pool)
    print(json.dumps({
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}",
        "threads": args.threads, "batch_size": args.batch_size, "model_load_s": round(load_s, 2),
        "queries": len(queries), "pages": pages, "windows": windows,
        "pages_per_s": round(pages / seconds, 2), "windows_per_s": round(windows / seconds, 1),
        "seconds_per_pool_of_20": round(seconds / len(queries), 2),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
