"""What a user waits for, on financebench-dev, in one run (issue #14):

1. raw PyMuPDF text extraction, pages/s (the floor of any indexing);
2. indexing pages/s without embeddings (EVIDENTIA_DENSE=off) and with them (the
   default embedder, its runtime and window defaults), in-process through
   ``index_paths``, plus the embedder's first load (and ONNX export when no
   cached export exists) apart;
3. fresh-process wall time of ``evidentia search`` (the CLI, a new Python each
   time) for ``--stage bm25``, ``--stage hybrid`` and hybrid + ``--reranker
   classifier``, on the index built in 2;
4. the API: ``evidentia serve`` in a subprocess on a temporary data dir, a few
   financebench PDFs uploaded (embedded by the server), then ``POST
   /v1/validate`` (default stage) p50/p95 with 1 and 4 concurrent clients, for
   reranker ``none`` and ``classifier``; time from start to /ready.

The machine's load (``os.getloadavg``) is printed with each part: other
processes share the cores, and wall-clock numbers mean little without it. So
each part also reports CPU seconds (this process's, or the child's for a fresh
process): with one thread, pages per CPU-second is about what an idle core
does, whatever the load.

Usage: python bench/bench_speed.py [--data ../shared/data/financebench-dev]
       [--repeat 3] [--api-docs 3] [--skip-classifier] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_api import evidentia_exe, run_load, running_server, wait_status  # noqa: E402
from bench_bm25 import raw_extraction  # noqa: E402

from evidentia.config import Settings  # noqa: E402
from evidentia.language import LanguageDetector  # noqa: E402
from evidentia.indexing import index_paths  # noqa: E402
from evidentia.retriever.dense import PageEmbedder  # noqa: E402
from evidentia.retriever.tantivy_backend import TantivyBackend  # noqa: E402
from evidentia.runtime import batch_threads  # noqa: E402


def load() -> str:
    return "load %.2f %.2f %.2f" % os.getloadavg()


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def cpu() -> float:
    return time.process_time()


def children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cli_search(env: dict, doc_id: str, question: str, answer: str, *extra: str) -> tuple[float, float, int, str]:
    """(wall s, CPU s of the child, exit code, last stderr line) of one fresh `evidentia search`."""
    t0, c0 = time.perf_counter(), children_cpu()
    done = subprocess.run([evidentia_exe(), "search", "--doc", doc_id, "-q", question, "-a", answer, "--json",
                           *extra], env=env, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - t0
    return seconds, children_cpu() - c0, done.returncode, (done.stderr.strip().splitlines() or [""])[-1]


def validate_bodies(queries: list[dict], doc_ids: dict[str, str], reranker: str):
    """The validate body of the i-th request: the financebench queries in turn."""
    def body(i: int) -> dict:
        q = queries[i % len(queries)]
        return {"question": q["question"], "answer": q["answer"], "document_ids": [doc_ids[q["doc_id"]]],
                "reranker": reranker}

    return body


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared/data/financebench-dev")
    ap.add_argument("--repeat", type=int, default=3, help="fresh-process searches per stage")
    ap.add_argument("--api-docs", type=int, default=3, help="financebench PDFs uploaded to the API")
    ap.add_argument("--api-requests", type=int, default=20, help="validations per (reranker, clients) level")
    ap.add_argument("--skip-classifier", action="store_true")
    ap.add_argument("--skip-api", action="store_true")
    ap.add_argument("--docs", type=int, default=0, help="only the first N PDFs (a smoke test)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not (args.data / "queries.jsonl").exists():
        print(f"error: {args.data}/queries.jsonl not found (pass --data)", file=sys.stderr)
        return 2
    pdfs = sorted((args.data / "pdfs").glob("*.pdf"))[:args.docs or None]
    queries = [json.loads(line) for line in (args.data / "queries.jsonl").open()]
    queries = [q for q in queries if q["doc_id"] in {p.stem for p in pdfs}]
    settings = Settings.from_env({})  # the defaults, whatever the environment says
    res: dict = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
                 "threads": settings.inference_threads, "index_threads": batch_threads()}
    work = Path(tempfile.mkdtemp(prefix="evd-speed-"))
    detector = LanguageDetector()

    # 1. extraction (twice: the first run also warms the file cache)
    raw_extraction(pdfs[:3])
    log(f"extraction ... {load()}")
    c0 = cpu()
    pages, seconds = raw_extraction(pdfs)
    res["pages"] = pages
    res["extract_pages_per_s"] = round(pages / seconds, 1)
    res["extract_pages_per_cpu_s"] = round(pages / (cpu() - c0), 1)
    res["extract_load"] = load()

    # 2. indexing
    log(f"indexing without embeddings ... {load()}")
    t0, c0 = time.perf_counter(), cpu()
    plain = index_paths(pdfs, TantivyBackend(work / "plain"), detector)
    res["index_pages_per_s_without_embeddings"] = round(plain.pages / (time.perf_counter() - t0), 1)
    res["index_pages_per_cpu_s_without_embeddings"] = round(plain.pages / (cpu() - c0), 1)
    res["index_plain_load"] = load()

    # as `evidentia index` embeds: a batch command uses every CPU (runtime.batch_threads)
    embedder = PageEmbedder.from_settings(settings.with_(data_dir=work / "data", threads=batch_threads()))
    t0 = time.perf_counter()
    embedder.load()
    res["embedder_first_load_s"] = round(time.perf_counter() - t0, 1)  # includes the ONNX export when not cached
    res["embedder"] = {"runtime": embedder.runtime, "threads": embedder.threads, "max_tokens": embedder.max_tokens,
                       "overlap": embedder.window_overlap, "max_windows": embedder.max_windows,
                       "batch_size": embedder.batch_size}
    log(f"indexing with embeddings ({embedder.runtime}) ... {load()}")
    data_dir = work / "data"
    backend = TantivyBackend(data_dir / "index")
    t0, c0 = time.perf_counter(), cpu()
    dense = index_paths(pdfs, backend, detector, embedder=embedder)
    seconds = time.perf_counter() - t0
    backend.close()
    res["index_pages_per_s_with_embeddings"] = round(dense.pages / seconds, 1)
    res["index_pages_per_cpu_s_with_embeddings"] = round(dense.pages / (cpu() - c0), 1)
    res["embedded_windows"] = embedder.stats.windows
    res["embedding_share"] = round(dense.embed_seconds / seconds, 2)
    res["index_dense_load"] = load()

    # 3. fresh-process searches on that index
    env = {**os.environ, "EVIDENTIA_DATA_DIR": str(data_dir), "EVIDENTIA_BACKEND": "embedded"}
    env.pop("EVIDENTIA_STAGE", None)
    env.pop("EVIDENTIA_DENSE", None)
    if not (data_dir / "index").is_dir():
        raise SystemExit("the CLI's index directory layout changed: update bench_speed.py")
    runs = [("bm25", ("--stage", "bm25")), ("hybrid", ("--stage", "hybrid"))]
    if not args.skip_classifier:
        runs.append(("hybrid+classifier", ("--stage", "hybrid", "--reranker", "classifier")))
    searches = {}
    for label, extra in runs:
        log(f"fresh-process search {label} ... {load()}")
        times, cpus, notes = [], [], set()
        for i in range(args.repeat):
            q = queries[(7 * i) % len(queries)]
            seconds, cpu_s, code, last = cli_search(env, q["doc_id"], q["question"], q["answer"], *extra)
            if code == 0:
                times.append(seconds)
                cpus.append(cpu_s)
            else:
                notes.add(f"rc={code}: {last[:200]}")
        searches[label] = {"median_s": round(statistics.median(times), 2) if times else None,
                           "min_s": round(min(times), 2) if times else None,
                           "cpu_s_median": round(statistics.median(cpus), 2) if cpus else None, "runs": len(times),
                           "load": load(), **({"errors": sorted(notes)} if notes else {})}
    res["cli_search"] = searches

    # 4. the API
    if not args.skip_api:
        res["api"] = run_api(args, pdfs, queries, work)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        for key, value in res.items():
            print(f"{key:>40}: {value}")
    return 0


def run_api(args, pdfs: list[Path], queries: list[dict], work: Path) -> dict:
    out: dict = {}
    env = {**os.environ, "EVIDENTIA_DATA_DIR": str(work / "api-data"), "EVIDENTIA_BACKEND": "embedded",
           "EVIDENTIA_RATE_LIMIT_PER_MINUTE": "1000000"}
    for name in ("EVIDENTIA_STAGE", "EVIDENTIA_DENSE", "EVIDENTIA_DEFAULT_RERANKER"):
        env.pop(name, None)
    if not args.skip_classifier:
        env["EVIDENTIA_DEFAULT_RERANKER"] = "classifier"  # loaded before /ready
    with running_server(env, work, 300) as (http, ready_s):
        out["start_to_ready_s"] = ready_s
        # the documents with the most queries
        counts: dict[str, int] = {}
        for q in queries:
            counts[q["doc_id"]] = counts.get(q["doc_id"], 0) + 1
        chosen = sorted(counts, key=lambda d: (-counts[d], d))[:args.api_docs]
        doc_ids: dict[str, str] = {}
        t0 = time.monotonic()
        pages = 0
        for doc in chosen:
            pdf = next(p for p in pdfs if p.stem == doc)
            status, body = http.upload(pdf, doc.lower().replace("_", "-")[:100])
            if status != 202:
                raise RuntimeError(f"upload of {pdf}: {status} {body}")
            doc_ids[doc] = body.get("document_id") or doc.lower().replace("_", "-")[:100]
            info = wait_status(http, doc_ids[doc], 900)
            if info["status"] != "ready":
                raise RuntimeError(f"{pdf}: {info.get('reason')}")
            pages += info.get("pages") or 0
        seconds = time.monotonic() - t0
        out["upload_to_ready_pages_per_s"] = round(pages / seconds, 1)
        mine = [q for q in queries if q["doc_id"] in doc_ids]
        levels = []
        for reranker in ("none",) + (() if args.skip_classifier else ("classifier",)):
            for clients in (1, 4):
                log(f"API {reranker} x{clients} ... {load()}")
                row = run_load(http, reranker, clients, args.api_requests, 300, validate_bodies(mine, doc_ids, reranker),
                               timeout=300)
                row["load"] = load()
                levels.append(row)
        out["validate"] = levels
    return out


if __name__ == "__main__":
    sys.exit(main())
