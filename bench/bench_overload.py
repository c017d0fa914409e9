"""The validation API past its capacity (`evidentia serve`, loopback only).

It starts `evidentia serve` on a free 127.0.0.1 port with a temporary data dir and
EVIDENTIA_REQUEST_TIMEOUT_S=``--timeout`` (other settings from the environment),
lets ``--tenants`` tenants each upload the same filing (default: 3M's 2018 10-K from
../shared/data, 160 pages), then for ``--seconds`` runs ``--clients`` clients per
tenant, each validating in a loop (reranker ``classifier``, top_k ``--top-k``, the
next request as soon as the last is answered, or after its Retry-After), while one client lists its
documents every 0.5 s. Prints the count of each status, the answered validations'
median latency and the document list's median and 95th percentile.

A server that admits every search at once shares its cores between them until each
takes as long as all together and ends past its deadline: few are answered. One that
keeps a line and refuses at once what the line would not reach in time answers
about its capacity, and the rest quickly (503, Retry-After).

Run it with another checkout's `evidentia` (``--evidentia PATH``) to compare versions.

Usage: python bench/bench_overload.py [--timeout 3] [--tenants 6] [--clients 5] [--seconds 30] [--pdf FILE]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.utils
from tests.utils.server import Server  # noqa: E402

ADMIN = "bench-overload-admin"
FILING = Path(__file__).resolve().parents[1] / "../shared/data/financebench-dev/pdfs/3M_2018_10K.pdf"
QUESTION = "What is the FY2018 capital expenditure amount (in USD millions) for 3M?"
ANSWER = "$1577 million"


def run(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-overload-"))
    env = dict(os.environ, EVIDENTIA_DATA_DIR=str(work / "data"), EVIDENTIA_ADMIN_KEY=ADMIN,
               EVIDENTIA_REQUEST_TIMEOUT_S=str(args.timeout), EVIDENTIA_RATE_LIMIT_PER_MINUTE="1000000",
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    exe = args.evidentia or shutil.which("evidentia") or str(Path(sys.executable).with_name("evidentia"))
    server = Server(env, work / "server.log", exe)
    url = server.url
    try:
        server.wait_ready(300)
        keys = [httpx.post(url + "/v1/admin/keys", json={"tenant": f"t{n}"}, headers={"X-API-Key": ADMIN}).json()["key"]
                for n in range(args.tenants)]
        data = args.pdf.read_bytes()
        for key in keys:
            r = httpx.post(url + "/v1/documents", data={"document_id": "filing"}, headers={"X-API-Key": key},
                           files={"file": (args.pdf.name, data, "application/pdf")}, timeout=120)
            if r.status_code != 202:
                raise SystemExit(f"upload: HTTP {r.status_code} {r.text[:300]}")
        print(f"indexing {args.tenants} copies of {args.pdf.name} ...", file=sys.stderr)
        for key in keys:
            while httpx.get(url + "/v1/documents/filing", headers={"X-API-Key": key}).json()["status"] != "ready":
                time.sleep(1)
        stop = time.monotonic() + args.seconds
        codes: list[int] = []
        answered: list[float] = []
        listing: list[float] = []

        def validating(key: str) -> None:
            with httpx.Client(timeout=args.timeout * 4 + 30, headers={"X-API-Key": key}) as c:
                while time.monotonic() < stop:
                    t0 = time.monotonic()
                    r = c.post(url + "/v1/validate", json={"question": QUESTION, "answer": ANSWER,
                                                           "document_ids": ["filing"], "reranker": "classifier",
                                                           "top_k": args.top_k})
                    codes.append(r.status_code)
                    if r.status_code == 200:
                        answered.append(time.monotonic() - t0)
                    elif "Retry-After" in r.headers:  # as a well-behaved client does
                        time.sleep(min(float(r.headers["Retry-After"]), max(0.0, stop - time.monotonic())))

        def listing_documents() -> None:
            with httpx.Client(timeout=120, headers={"X-API-Key": keys[0]}) as c:
                while time.monotonic() < stop:
                    t0 = time.monotonic()
                    c.get(url + "/v1/documents")
                    listing.append(time.monotonic() - t0)
                    time.sleep(0.5)

        print(f"{args.tenants * args.clients} clients for {args.seconds:.0f} s ...", file=sys.stderr)
        threads = [threading.Thread(target=validating, args=(key,)) for key in keys for _ in range(args.clients)]
        threads.append(threading.Thread(target=listing_documents))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return {"machine": f"{platform.machine()}, {os.cpu_count()} CPU(s)", "evidentia": exe,
            "statuses": dict(sorted(Counter(codes).items())),
            "answered_p50_s": round(statistics.median(answered), 2) if answered else None,
            "list_p50_s": round(statistics.median(listing), 2),
            "list_p95_s": round(sorted(listing)[int(len(listing) * 0.95)], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=3.0, help="EVIDENTIA_REQUEST_TIMEOUT_S of the server")
    parser.add_argument("--tenants", type=int, default=6)
    parser.add_argument("--clients", type=int, default=5, help="validating clients per tenant")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--top-k", type=int, default=100)
    parser.add_argument("--pdf", type=Path, default=FILING)
    parser.add_argument("--evidentia", help="the `evidentia` executable to run (default: the one on the PATH)")
    args = parser.parse_args()
    if not args.pdf.is_file():
        parser.error(f"--pdf {args.pdf}: no such file (the default is in ../shared/data)")
    report = run(args)
    print(f"{report['machine']}; timeout {args.timeout:g} s; {args.tenants} tenants x {args.clients} clients, "
          f"classifier, top_k {args.top_k}, {args.seconds:.0f} s; {report['evidentia']}")
    print(f"statuses {report['statuses']}; answered p50 {report['answered_p50_s']} s; "
          f"GET /v1/documents p50 {report['list_p50_s']} s, p95 {report['list_p95_s']} s")


if __name__ == "__main__":
    main()
