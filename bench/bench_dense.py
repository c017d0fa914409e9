"""Dense and hybrid first stages on financebench-dev, in one run:

- indexing throughput (pages/s) of the same PDFs without embeddings and with
  them (EVIDENTIA_DENSE's default model and windows), the embedding share, and
  the model's load time apart;
- R@3 and R@20 (and MRR) of the candidate pool, query = question + answer,
  pages ranked within the query's document, for:
  bm25; dense with each page scored by its best window (``max``, the default),
  by the mean of its windows (``mean``, one pooled vector per page) and by its
  first window only (``first``, the first 256 tokens); hybrid (weighted RRF) for
  each of those, and for a few RRF weights, k values and depths;
- query embedding and dense search latency.

Every number comes from the same backend code the CLI uses (TantivyBackend,
``search``/``search_dense``, ``retriever.fusion.rrf``).

Usage: python bench/bench_dense.py [--data ../shared/data/financebench-dev] [--json]
       [--keep DIR]   keep the index with embeddings in DIR (it is reused when it exists)
       [--rankings FILE]  write every query's rankings (JSON) for further study
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from evidentia.config import Settings
from evidentia.evaluation import metrics
from evidentia.language import LanguageDetector
from evidentia.indexing import index_paths
from evidentia.records import Candidate
from evidentia.retriever.dense import PageEmbedder
from evidentia.retriever.fusion import rrf
from evidentia.retriever.query import build_query
from evidentia.retriever.tantivy_backend import TantivyBackend

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_bm25 import financebench  # noqa: E402

POOL = 20
DEPTH = 200  # how deep each single ranking is read (every page of most filings)
POOLINGS = ("max", "mean", "first")
WEIGHTS = ((1.0, 1.0), (1.0, 0.5), (0.5, 1.0), (1.0, 2.0), (2.0, 1.0))
KS = (60, 20)
DEPTH_FACTORS = (1, 2, 3, 5)


def scores(rankings: list[list[tuple[str, int]]], relevant: list[frozenset]) -> dict[str, float]:
    r3 = [metrics.recall_at_k(r, rel, 3) for r, rel in zip(rankings, relevant)]
    r20 = [metrics.recall_at_k(r, rel, POOL) for r, rel in zip(rankings, relevant)]
    rr = [metrics.reciprocal_rank(r[:POOL], rel) for r, rel in zip(rankings, relevant)]
    return {"R@3": round(metrics.mean_of(r3), 3), "R@20": round(metrics.mean_of(r20), 3),
            "MRR": round(metrics.mean_of(rr), 3)}


def keys(cands: list[Candidate]) -> list[tuple[str, int]]:
    return [(c.doc_id, c.page) for c in cands]


def fuse(bm25: list[Candidate], dense: list[Candidate], weights, k: int, factor: int) -> list[tuple[str, int]]:
    depth = POOL * factor
    return keys(rrf([bm25[:depth], dense[:depth]], weights, k=k, top_k=POOL))


def index_run(pdfs: list[Path], directory: Path, detector: LanguageDetector, embedder: PageEmbedder | None):
    backend = TantivyBackend(directory)
    t0 = time.perf_counter()
    summary = index_paths(pdfs, backend, detector, embedder=embedder)
    seconds = time.perf_counter() - t0
    assert not summary.failures, summary.failures
    return backend, summary, seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared/data/financebench-dev")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep", type=Path, help="keep (or reuse) the index with embeddings here")
    ap.add_argument("--rankings", type=Path, help="write the rankings of every query here (JSON)")
    args = ap.parse_args()
    pdfs, queries = financebench(args.data)
    settings = Settings.from_env({})  # the defaults, whatever the environment says
    detector = LanguageDetector()
    embedder = PageEmbedder.from_settings(settings)
    t0 = time.perf_counter()
    dim = embedder.dim  # load the model before any timing
    load_s = time.perf_counter() - t0
    embedder.embed_query("warm up")
    result: dict = {
        "machine": f"{platform.machine()}, python {platform.python_version()}",
        "model": embedder.name, "dim": dim, "model_load_s": round(load_s, 1),
        "windows": {"max_tokens": embedder.max_tokens, "overlap": embedder.window_overlap,
                    "max_windows": embedder.max_windows, "batch_size": embedder.batch_size},
    }

    with tempfile.TemporaryDirectory() as tmp:
        # 1. indexing, same PDFs, without then with embeddings (the first run also warms the file cache)
        _, plain, plain_s = index_run(pdfs, Path(tmp) / "plain", detector, None)
        result["pages"] = plain.pages
        result["index_pages_per_s_without_embeddings"] = round(plain.pages / plain_s, 1)
        keep = args.keep
        if keep is not None and (keep / "vectors").is_dir():
            backend = TantivyBackend(keep)
            result["index_with_embeddings"] = f"reused {keep}"
        else:
            backend, dense_summary, dense_s = index_run(pdfs, keep or Path(tmp) / "dense", detector, embedder)
            stats = embedder.stats
            result["index_pages_per_s_with_embeddings"] = round(dense_summary.pages / dense_s, 2)
            result["embedding_share_of_indexing"] = round(dense_summary.embed_seconds / dense_s, 3)
            result["embedded_windows"] = stats.windows
            result["windows_per_s"] = round(stats.windows / stats.seconds, 1)
            result["slowdown"] = round(dense_s / plain_s, 1)

        # 2. rankings of every query
        relevant, bm25_runs, dense_runs = [], [], {p: [] for p in POOLINGS}
        embed_ms, dense_ms = [], []
        for q in queries:
            doc = [q["doc_id"]]
            relevant.append(frozenset((q["doc_id"], p) for p in q["relevant_pages"]))
            query = build_query(q["question"], q["answer"], detector)
            bm25_runs.append(backend.search(query.keywords, doc, DEPTH))
            t0 = time.perf_counter()
            vector = embedder.embed_query(query.text)
            embed_ms.append((time.perf_counter() - t0) * 1000)
            for pooling in POOLINGS:
                backend.dense_pooling = pooling
                t0 = time.perf_counter()
                dense_runs[pooling].append(backend.search_dense(vector, doc, DEPTH, model=embedder.name))
                if pooling == "max":
                    dense_ms.append((time.perf_counter() - t0) * 1000)
        backend.dense_pooling = "max"
        result["query_embed_ms_p50"] = round(statistics.median(embed_ms), 1)
        result["dense_search_ms_p50"] = round(statistics.median(dense_ms), 1)

    # 3. metrics
    table: dict[str, dict] = {"bm25": scores([keys(r) for r in bm25_runs], relevant)}
    for pooling in POOLINGS:
        table[f"dense[{pooling}]"] = scores([keys(r) for r in dense_runs[pooling]], relevant)
    for pooling in POOLINGS:
        table[f"hybrid[{pooling}] w=1,1 k=60 depth=2x"] = scores(
            [fuse(b, d, (1.0, 1.0), 60, 2) for b, d in zip(bm25_runs, dense_runs[pooling])], relevant)
    variants = ([((1.0, 1.0), 60, f) for f in DEPTH_FACTORS] + [(w, 60, 2) for w in WEIGHTS]
                + [((1.0, 1.0), k, 2) for k in KS])
    for weights, k, factor in variants:
        label = f"hybrid[max] w={weights[0]:g},{weights[1]:g} k={k} depth={factor}x"
        if label not in table:
            table[label] = scores(
                [fuse(b, d, weights, k, factor) for b, d in zip(bm25_runs, dense_runs["max"])], relevant)
    result["pool"] = table
    result["queries"] = len(queries)

    if args.rankings:
        args.rankings.write_text(json.dumps({
            "queries": [q["id"] for q in queries],
            "bm25": [keys(r) for r in bm25_runs],
            **{f"dense_{p}": [keys(r) for r in dense_runs[p]] for p in POOLINGS},
        }))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for key, value in result.items():
        if key != "pool":
            print(f"{key:>40}: {value}")
    print(f"\n{'first stage (pool of 20)':<44} {'R@3':>6} {'R@20':>6} {'MRR':>6}")
    for label, row in table.items():
        print(f"{label:<44} {row['R@3']:>6.3f} {row['R@20']:>6.3f} {row['MRR']:>6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
