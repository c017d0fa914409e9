"""The API server's memory over repeated large uploads (`evidentia serve`, loopback only).

It writes ``--files`` PDFs of ``--pages`` pages holding ``--chars`` characters each
(random words and figures: no two files alike), starts `evidentia serve` on a free
127.0.0.1 port with a temporary data dir (settings from the environment: the
defaults unless you set some, e.g. EVIDENTIA_DENSE=off), then uploads them
``--uploads`` times in turn under two document ids (each upload replaces the
document uploaded two before, so the index always holds two), waits for each to be
indexed and prints the server's RSS (its own, not the extraction child's) a second
after. A server that keeps what it freed grows with every upload; one that gives
it back stays near the memory of what it holds.

Run it with another checkout's `evidentia` on the PATH to compare two versions.

Usage: python bench/bench_server_memory.py [--uploads 8] [--files 4] [--pages 400] [--chars 41000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import pymupdf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.utils
from tests.utils.server import Server  # noqa: E402

ADMIN = "bench-memory-admin"
WORDS = "emissions revenue tonnes scope water energy waste supplier audit".split()


def large_pdf(path: Path, pages: int, chars: int, seed: int) -> Path:
    """``pages`` pages of about ``chars`` characters each, in 4-point type on a tall page."""
    rnd = random.Random(seed)
    doc = pymupdf.open()
    for _ in range(pages):
        page = doc.new_page(width=2000, height=14000)
        lines, n = [], 0
        while n < chars:
            line = " ".join(rnd.choice(WORDS) + str(rnd.randint(0, 999)) for _ in range(30))
            lines.append(line)
            n += len(line) + 1
        page.insert_textbox(page.rect, "\n".join(lines), fontname="helv", fontsize=4)
    doc.save(path, deflate=True)
    doc.close()
    return path


def wait_indexed(client: httpx.Client, url: str, document_id: str, limit_s: float) -> dict:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        doc = client.get(f"{url}/v1/documents/{document_id}").json()
        # a re-upload of a ready document is served as it was until the new file is indexed
        if doc["status"] in ("ready", "failed") and doc.get("reindex_status") in (None, "failed"):
            return doc
        time.sleep(0.5)
    raise SystemExit(f"{document_id} not indexed in {limit_s:.0f} s")


def run(uploads: int, files: int, pages: int, chars: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    print(f"writing {files} PDFs of {pages} pages x {chars} characters ...", file=sys.stderr)
    pdfs = [large_pdf(work / f"large-{n}.pdf", pages, chars, seed=n) for n in range(files)]
    env = dict(os.environ, EVIDENTIA_DATA_DIR=str(work / "data"), EVIDENTIA_ADMIN_KEY=ADMIN,
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), TOKENIZERS_PARALLELISM="false")
    exe = shutil.which("evidentia") or str(Path(sys.executable).with_name("evidentia"))
    server = Server(env, work / "server.log", exe)
    url = server.url
    report: dict = {"machine": f"{platform.machine()}, {os.cpu_count()} CPU(s)", "evidentia": exe,
                    "dense": os.environ.get("EVIDENTIA_DENSE", "on"), "pages": pages, "chars": chars, "uploads": []}
    try:
        server.wait_ready(300)
        key = httpx.post(url + "/v1/admin/keys", json={"tenant": "bench"}, headers={"X-API-Key": ADMIN}).json()["key"]
        client = httpx.Client(timeout=120, headers={"X-API-Key": key})
        process = psutil.Process(server.proc.pid)
        report["rss_mb_ready"] = round(process.memory_info().rss / 2**20)
        print(f"server ready: RSS {report['rss_mb_ready']} MB", file=sys.stderr)
        for n in range(uploads):
            pdf, document_id = pdfs[n % files], f"large-{n % 2}"
            t0 = time.perf_counter()
            r = client.post(url + "/v1/documents", data={"document_id": document_id},
                            files={"file": (pdf.name, pdf.read_bytes(), "application/pdf")})
            if r.status_code != 202:
                raise SystemExit(f"upload {n + 1}: HTTP {r.status_code} {r.text[:300]}")
            doc = wait_indexed(client, url, document_id, 900)
            seconds = time.perf_counter() - t0
            time.sleep(1.0)
            rss = round(process.memory_info().rss / 2**20)
            report["uploads"].append({"upload": n + 1, "status": doc["status"], "seconds": round(seconds, 1),
                                      "rss_mb": rss})
            print(f"upload {n + 1}: {doc['status']} in {seconds:.0f} s, server RSS {rss} MB", file=sys.stderr)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uploads", type=int, default=8)
    parser.add_argument("--files", type=int, default=4, help="distinct PDFs uploaded in turn (at least 3)")
    parser.add_argument("--pages", type=int, default=400)
    parser.add_argument("--chars", type=int, default=41_000, help="characters a page")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.files < 3 or min(args.uploads, args.pages, args.chars) <= 0:
        parser.error("--files must be at least 3 (an id re-uploaded with its own file is not indexed again); "
                     "the rest positive")
    report = run(args.uploads, args.files, args.pages, args.chars)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    rss = [u["rss_mb"] for u in report["uploads"]]
    print(f"{report['machine']}; EVIDENTIA_DENSE={report['dense']}; {args.uploads} uploads of {args.pages} pages x "
          f"{args.chars} characters, two document ids")
    print(f"server RSS: ready {report['rss_mb_ready']} MB; after each upload " + ", ".join(map(str, rss))
          + f" MB; last {rss[-1]} MB, highest {max(rss)} MB")


if __name__ == "__main__":
    main()
