"""How much of each page must be embedded? Window size, overlap and windows per page
against R@20 on financebench-dev, and the ONNX (int8) runtime against torch.

For each window layout (``--layouts 256:32,128:0``: tokens per window : overlap)
every page is cut into at most max(``--caps``) windows and embedded once; the
runs with fewer windows per page are read from the same vectors (the first k
windows of a page are the same whatever the cap). Each row gives the
dense and the hybrid (weighted RRF 1,1, k=60, depth 2x, the defaults) pool's
R@3, R@20 and P@3, the windows embedded and the encoder's windows/s.

``--torch LAYOUT:K`` also embeds that layout with the torch runtime and reports
the same metrics and the cosine between the two runtimes' window vectors.

Vectors are cached in ``--cache`` (npz per layout and runtime) so a rerun only
recomputes what is missing. The BM25 rankings come from the embedded backend
(``TantivyBackend.search``), the dense ones from ``retriever.dense.page_scores``
(the backend's own scoring), fused by ``retriever.fusion.rrf``.

Usage: python bench/bench_windows.py [--data ../shared/data/financebench-dev]
       [--layouts 256:32,128:0] [--caps 1,2,4,8] [--torch 128:0:1]
       [--cache /tmp/evd-windows] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from evidentia.evaluation import metrics
from evidentia.language import LanguageDetector
from evidentia.indexer.pdf import extract_pages
from evidentia.records import Candidate, PageVectors
from evidentia.retriever.dense import PageEmbedder, page_scores
from evidentia.retriever.fusion import rrf
from evidentia.retriever.query import build_query
from evidentia.retriever.tantivy_backend import TantivyBackend

POOL = 20


def first_k(vectors: PageVectors, k: int) -> PageVectors:
    """The first ``k`` windows of every page (rows are grouped by page, in order)."""
    pages = vectors.pages
    if len(pages) == 0:
        return vectors
    starts = np.flatnonzero(np.r_[True, pages[1:] != pages[:-1]])
    rank = np.arange(len(pages)) - np.repeat(starts, np.diff(np.r_[starts, len(pages)]))
    keep = rank < k
    return PageVectors(vectors.model, pages[keep], vectors.vectors[keep])


def embed_corpus(documents, embedder: PageEmbedder, cache: Path) -> tuple[dict[str, PageVectors], float, int]:
    """Window vectors of every document (cached), seconds spent, windows embedded."""
    if cache.is_file():
        data = np.load(cache)
        meta = json.loads(str(data["meta"]))
        out = {d: PageVectors(embedder.name, data[f"{i}_p"], data[f"{i}_v"]) for i, d in enumerate(meta["docs"])}
        return out, meta["seconds"], meta["windows"]
    t0 = time.perf_counter()
    out = {}
    windows = 0
    for doc in documents:
        vectors = embedder.embed_pages(doc.pages)
        out[doc.doc_id] = vectors
        windows += len(vectors.pages)
        print(f"  {doc.doc_id}: {len(vectors.pages)} windows, {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    seconds = time.perf_counter() - t0
    cache.parent.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for i, d in enumerate(out):
        arrays[f"{i}_p"], arrays[f"{i}_v"] = out[d].pages, out[d].vectors
    np.savez(cache, meta=json.dumps({"docs": list(out), "seconds": seconds, "windows": windows}), **arrays)
    return out, seconds, windows


def dense_ranking(query_vec: np.ndarray, vectors: PageVectors, doc_id: str) -> list[tuple[str, int]]:
    pages, scores = page_scores(query_vec, vectors, "max")
    order = np.lexsort((pages, -scores))
    return [(doc_id, int(pages[i])) for i in order]


def evaluate(queries, bm25, query_vecs, corpus: dict[str, PageVectors]) -> dict[str, dict]:
    relevant = [frozenset((q["doc_id"], p) for p in q["relevant_pages"]) for q in queries]
    dense, hybrid = [], []
    for q, b, v in zip(queries, bm25, query_vecs):
        d = dense_ranking(v, corpus[q["doc_id"]], q["doc_id"])
        dense.append(d)
        as_cands = [Candidate(doc_id=x[0], page=x[1], score=0.0, text="", snippet="", language=None) for x in d]
        fused = rrf([b[:POOL * 2], as_cands[:POOL * 2]], (1.0, 1.0), k=60, top_k=POOL)
        hybrid.append([(c.doc_id, c.page) for c in fused])
    return {"dense": scores(dense, relevant), "hybrid": scores(hybrid, relevant)}


def scores(rankings, relevant) -> dict[str, float]:
    return {
        "R@3": round(metrics.mean_of([metrics.recall_at_k(r, rel, 3) for r, rel in zip(rankings, relevant)]), 3),
        "R@20": round(metrics.mean_of([metrics.recall_at_k(r, rel, POOL) for r, rel in zip(rankings, relevant)]), 3),
        "P@3": round(metrics.mean_of([metrics.precision_at_k(r, rel, 3) for r, rel in zip(rankings, relevant)]), 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared/data/financebench-dev")
    ap.add_argument("--layouts", default="256:32,128:0")
    ap.add_argument("--torch", default=None, help="LAYOUT:K also embedded with torch, e.g. 128:0:2")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "evd-windows")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--caps", default="1,2,4,8", help="windows per page read from each layout's vectors")
    ap.add_argument("--bm25-only", action="store_true", help="print the BM25 row and stop")
    args = ap.parse_args()
    if not (args.data / "queries.jsonl").exists():
        print(f"error: {args.data}/queries.jsonl not found (pass --data)", file=sys.stderr)
        return 2
    queries = [json.loads(line) for line in (args.data / "queries.jsonl").open()]
    detector = LanguageDetector()
    pdfs = sorted((args.data / "pdfs").glob("*.pdf"))
    documents = [extract_pages(p, p.stem, detector) for p in pdfs]
    with tempfile.TemporaryDirectory() as tmp:
        backend = TantivyBackend(Path(tmp))
        backend.index_documents(iter(documents))
        texts = [build_query(q["question"], q["answer"], detector) for q in queries]
        bm25 = [backend.search(t.keywords, [q["doc_id"]], POOL * 2) for q, t in zip(queries, texts)]
    relevant = [frozenset((q["doc_id"], p) for p in q["relevant_pages"]) for q in queries]
    print(f"{len(documents)} documents, {sum(d.page_count for d in documents)} pages, {len(queries)} queries")
    print(f"bm25: {scores([[(c.doc_id, c.page) for c in b] for b in bm25], relevant)}")

    if args.bm25_only:
        return 0
    runs = [("onnx", layout) for layout in args.layouts.split(",") if layout]
    if args.torch:
        runs.append(("torch", args.torch.rsplit(":", 1)[0]))
    onnx_vectors: dict[str, dict[str, PageVectors]] = {}
    for runtime, layout in runs:
        size, overlap = (int(x) for x in layout.split(":"))
        caps = tuple(int(c) for c in args.caps.split(",")) if runtime == "onnx" else (int(args.torch.rsplit(":", 1)[1]),)
        embedder = PageEmbedder(max_tokens=size, window_overlap=overlap, max_windows=max(caps),
                                runtime=runtime, threads=args.threads)
        embedder.load()
        query_vecs = [embedder.embed_query(t.text) for t in texts]
        corpus, seconds, windows = embed_corpus(documents, embedder,
                                                args.cache / f"{runtime}-{size}-{overlap}-{max(caps)}.npz")
        if runtime == "onnx":
            onnx_vectors[layout] = corpus
        for k in caps:
            view = {d: first_k(v, k) for d, v in corpus.items()}
            n = sum(len(v.pages) for v in view.values())
            row = evaluate(queries, bm25, query_vecs, view)
            print(f"{runtime:<5} {size:>3} tokens overlap {overlap:>2} <= {k} windows/page: {n:>6} windows  "
                  f"dense {row['dense']}  hybrid {row['hybrid']}")
        print(f"{runtime} {layout}: {windows} windows in {seconds:.0f} s = {windows / seconds:.1f} windows/s "
              f"({args.threads} thread)")
        if runtime == "torch" and layout in onnx_vectors:
            cos = np.concatenate([np.sum(first_k(onnx_vectors[layout][d], caps[0]).vectors * v.vectors, axis=1)
                                  for d, v in corpus.items()])
            print(f"cosine onnx vs torch per window: min {cos.min():.4f}, p1 {np.percentile(cos, 1):.4f}, "
                  f"mean {cos.mean():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
