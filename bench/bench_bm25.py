"""BM25 stage benchmark on financebench-dev, in one run:

- raw PyMuPDF text extraction throughput (pages/s) on the same files;
- Evidentia indexing throughput (extract + clean + language + tantivy), and the ratio;
- language detection: the probe used at indexing vs langdetect on the full page
  (agreement and time per page);
- search latency p50/p95 over the queries;
- P@1, P@3, R@1, R@3, MRR of BM25 with query = question + answer, pages ranked
  within the query's document;
- optionally the peer baseline (bm25s, English stop words + Snowball stemming)
  on the same pages, when bm25s is installed.

Usage: python bench/bench_bm25.py [--data ../shared/data/financebench-dev]
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

import pymupdf

from evidentia.language import LanguageDetector
from evidentia.indexing import index_paths
from evidentia.retriever.query import build_query
from evidentia.retriever.tantivy_backend import TantivyBackend


def raw_extraction(pdfs: list[Path]) -> tuple[int, float]:
    """(pages, seconds) of PyMuPDF's text extraction alone: the floor under indexing."""
    t0 = time.perf_counter()
    pages = 0
    for path in pdfs:
        with pymupdf.open(path) as doc:
            for page in doc:
                page.get_text("text")
                pages += 1
    return pages, time.perf_counter() - t0


def metrics(ranking: list[int], relevant: set[int]) -> dict[str, float]:
    hits = [p in relevant for p in ranking]
    rr = next((1.0 / (i + 1) for i, h in enumerate(hits) if h), 0.0)
    return {
        "P@1": sum(hits[:1]) / 1,
        "P@3": sum(hits[:3]) / 3,
        "R@1": sum(hits[:1]) / len(relevant),
        "R@3": sum(hits[:3]) / len(relevant),
        "R@20": sum(hits[:20]) / len(relevant),
        "MRR": rr,
    }


def mean_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.fmean(r[k] for r in rows), 3) for k in rows[0]}


def language_probe_study(pdfs: list[Path], detector: LanguageDetector, sample_pages: int = 400) -> dict:
    """Agreement of the short probe with a full-page detection, and the time of each."""
    from evidentia.text import clean_text

    texts = []
    for path in pdfs:
        with pymupdf.open(path) as doc:
            texts.extend(clean_text(p.get_text("text")) for p in doc)
    step = max(1, len(texts) // sample_pages)
    texts = [t for t in texts[::step] if t]
    t0 = time.perf_counter()
    full = [detector.detect_with_probability(t, full=True)[0] for t in texts]
    t_full = time.perf_counter() - t0
    t0 = time.perf_counter()
    fast = [detector.detect_page(t)[0] for t in texts]
    t_fast = time.perf_counter() - t0
    agree = sum(a == b for a, b in zip(full, fast)) / len(texts)
    out = {"pages": len(texts), "full_ms_per_page": round(1000 * t_full / len(texts), 2),
           "indexing_ms_per_page": round(1000 * t_fast / len(texts), 2), "agreement": round(agree, 3)}
    out["multilingual"] = multilingual_study(detector)
    return out


def multilingual_study(detector: LanguageDetector, per_language: int = 40) -> dict | None:
    """The same comparison on non-English text: Faker's word lists per locale
    (word salad, so few stop words: a hard case for the vote, it mostly tests
    the probe). Skipped when faker is not installed."""
    try:
        from faker import Faker
    except ImportError:
        return None
    locales = {"en": "en_US", "fr": "fr_FR", "de": "de_DE", "es": "es_ES", "it": "it_IT", "nl": "nl_NL"}
    full_ok = fast_ok = n = 0
    for lang, locale in locales.items():
        fake = Faker(locale)
        fake.seed_instance(7)
        for _ in range(per_language):
            text = fake.text(1500)
            full_ok += detector.detect_with_probability(text, full=True)[0] == lang
            fast_ok += detector.detect_page(text)[0] == lang
            n += 1
    return {"pages": n, "full_page_accuracy": round(full_ok / n, 3), "indexing_accuracy": round(fast_ok / n, 3)}


def peer_bm25s(queries: list[dict], pages_by_doc: dict[str, list[str]]) -> dict[str, float] | None:
    try:
        import bm25s
        import Stemmer  # PyStemmer, used by bm25s for Snowball
    except ImportError:
        return None

    stemmer = Stemmer.Stemmer("english")
    rows = []
    for q in queries:
        corpus = pages_by_doc[q["doc_id"]]
        retriever = bm25s.BM25()
        retriever.index(bm25s.tokenize(corpus, stopwords="en", stemmer=stemmer, show_progress=False), show_progress=False)
        tokens = bm25s.tokenize([q["question"] + " " + q["answer"]], stopwords="en", stemmer=stemmer, show_progress=False)
        docs, _ = retriever.retrieve(tokens, k=len(corpus), show_progress=False)
        rows.append(metrics([int(i) + 1 for i in docs[0]], set(q["relevant_pages"])))
    return mean_metrics(rows)


def financebench(data: Path) -> tuple[list[Path], list[dict]]:
    """The PDFs and queries of a financebench-style folder (``pdfs/``, ``queries.jsonl``);
    exits with code 2 and a one-line message without them."""
    if not (data / "queries.jsonl").exists():
        print(f"error: {data}/queries.jsonl not found (pass --data)", file=sys.stderr)
        sys.exit(2)
    return sorted((data / "pdfs").glob("*.pdf")), [json.loads(line) for line in (data / "queries.jsonl").open()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared/data/financebench-dev")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    pdfs, queries = financebench(args.data)
    detector = LanguageDetector()  # profiles loaded before timing

    # Raw extraction twice, the second one timed, so both runs see a warm file cache.
    raw_extraction(pdfs)
    raw_pages, raw_s = raw_extraction(pdfs)

    with tempfile.TemporaryDirectory() as tmp:
        backend = TantivyBackend(Path(tmp) / "index")
        t0 = time.perf_counter()
        summary = index_paths(pdfs, backend, detector)
        index_s = time.perf_counter() - t0
        assert not summary.failures, summary.failures

        latencies, rows = [], []
        for q in queries:
            t0 = time.perf_counter()
            query = build_query(q["question"], q["answer"], detector)
            cands = backend.search(query.keywords, [q["doc_id"]], 1000)
            latencies.append((time.perf_counter() - t0) * 1000)
            rows.append(metrics([c.page for c in cands], set(q["relevant_pages"])))
        pages_by_doc = {}
        for q in queries:
            if q["doc_id"] not in pages_by_doc:
                info = backend.get_document(q["doc_id"])
                pages_by_doc[q["doc_id"]] = [backend.get_page(q["doc_id"], n).text for n in range(1, info.pages + 1)]

    lat = sorted(latencies)
    result = {
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, python {platform.python_version()}",
        "documents": summary.documents,
        "pages": summary.pages,
        "empty_pages": summary.empty_pages,
        "raw_pymupdf_pages_per_s": round(raw_pages / raw_s, 1),
        "evidentia_index_pages_per_s": round(summary.pages / index_s, 1),
        "ratio": round((summary.pages / index_s) / (raw_pages / raw_s), 3),
        "search_ms_p50": round(statistics.median(lat), 2),
        "search_ms_p95": round(lat[min(len(lat) - 1, int(0.95 * len(lat)))], 2),
        "queries": len(queries),
        "evidentia_bm25": mean_metrics(rows),
        "peer_bm25s": peer_bm25s(queries, pages_by_doc),
        "language_probe": language_probe_study(pdfs, detector),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:>28}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
