"""What looking up the earlier verdicts costs a validation (Store.earlier_verdicts).

POST /v1/validate shows, for each page returned, what analysts said of it before for the
same question and answer. This fills a store with ``--verdicts`` verdicts on one
document (the worst case: every verdict on the pages searched), then times the lookup
for a 20-page result:

    python bench/bench_earlier_verdicts.py --verdicts 100000
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from evidentia.store import Store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verdicts", type=int, default=100_000)
    parser.add_argument("--questions", type=int, default=500, help="distinct questions asked")
    parser.add_argument("--pages", type=int, default=300, help="pages of the document")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "api.sqlite3")
        c = store._conn  # filled in bulk: through add_feedback it would take minutes
        c.execute("INSERT INTO tenants VALUES ('t', 'now')")
        c.execute("INSERT INTO documents (tenant, document_id, status, filename, size_bytes, file_path, generation, "
                  "created, updated) VALUES ('t', 'doc', 'ready', 'doc.pdf', 1, 'p', 'g1', 'now', 'now')")
        per_validation = 5
        validations = args.verdicts // per_validation
        c.executemany("INSERT INTO validations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [
            (f"v{i}", "t", f"question {i % args.questions}", "answer", json.dumps(["doc"]), "none", None, 20, "[]",
             None, None, "now", json.dumps({"doc": "g1"})) for i in range(validations)])
        c.executemany("INSERT INTO feedback (validation_id, tenant, document_id, page, relevant, analyst, page_text, "
                      "created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", [
                          (f"v{i}", "t", "doc", (i * 7 + p) % args.pages + 1, p % 2, f"analyst{i % 3}",
                           f"text of page {(i * 7 + p) % args.pages + 1}", "now")
                          for i in range(validations) for p in range(per_validation)])
        c.commit()
        first = 7 * 7 % args.pages + 1  # the pages "question 7"'s first validation judged, and the next ones
        shown = [("doc", first + p, f"text of page {first + p}") for p in range(20)]
        t0 = time.perf_counter()
        for _ in range(args.repeat):
            found = store.earlier_verdicts("t", "Question  7", "answer", shown)  # asked alike
        ms = (time.perf_counter() - t0) / args.repeat * 1000
        store.close()
    print(f"{validations * per_validation} verdicts on one document of {args.pages} pages, {args.questions} questions: "
          f"{ms:.1f} ms per 20-page validation ({sum(len(v) for v in found.values())} earlier verdicts found)")


if __name__ == "__main__":
    main()
