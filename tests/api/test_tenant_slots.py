"""A tenant's burst of searches or uploads runs EVIDENTIA_TENANT_CONCURRENCY at a time
and waits for its own slots, so another tenant's request goes ahead of the burst."""

from __future__ import annotations

import threading
import time
from collections import Counter

from fastapi.testclient import TestClient

from evidentia.samples import write_sample_report
from evidentia.tenants import split_internal_id
from tests.utils.api import make_app, new_tenant, ready_document, services_of, upload, validate, wait_ready


class Concurrency:
    """Counts the calls of each tenant running at once, each held ``hold_s``."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self.running: Counter = Counter()
        self.most: Counter = Counter()
        self.most_overall = 0
        self._lock = threading.Lock()

    def hold(self, tenant: str) -> None:
        with self._lock:
            self.running[tenant] += 1
            self.most[tenant] = max(self.most[tenant], self.running[tenant])
            self.most_overall = max(self.most_overall, sum(self.running.values()))
        time.sleep(self.hold_s)
        with self._lock:
            self.running[tenant] -= 1


def _at_once(calls: dict[str, callable], first: list[str]) -> dict[str, float]:
    """Runs the calls in threads, those in ``first`` a moment before the others; when each ended."""
    ended: dict[str, float] = {}

    def go(name):
        calls[name]()
        ended[name] = time.monotonic()

    threads = {name: threading.Thread(target=go, args=(name,)) for name in calls}
    for name in first:
        threads[name].start()
    time.sleep(0.15)
    for name, thread in threads.items():
        if name not in first:
            thread.start()
    for thread in threads.values():
        thread.join(60)
    return ended


def test_a_burst_of_searches_waits_for_its_tenants_slots(tmp_path, monkeypatch):
    pdf = write_sample_report(tmp_path / "acme-2023.pdf")
    with TestClient(make_app(tmp_path, tenant_concurrency=1)) as c:
        wait_ready(c)
        burst, other = new_tenant(c, "burst"), new_tenant(c, "other")
        ready_document(c, burst, pdf)
        ready_document(c, other, pdf)
        engine = services_of(c).engine
        seen = Concurrency(0.4)
        real_run = engine.run

        def held_run(query, doc_ids, *args, **kwargs):
            seen.hold(split_internal_id(doc_ids[0])[0])
            return real_run(query, doc_ids, *args, **kwargs)

        monkeypatch.setattr(engine, "run", held_run)

        def ask(headers):
            return lambda: validate(c, headers, ["acme-2023"]).raise_for_status()

        calls = {f"burst{i}": ask(burst) for i in range(4)} | {"other": ask(other)}
        ended = _at_once(calls, first=[f"burst{i}" for i in range(4)])
    assert len(ended) == 5
    assert seen.most["burst"] == 1 and seen.most_overall == 2  # the other tenant ran beside the burst
    assert ended["other"] < max(ended[f"burst{i}"] for i in range(4)) - 0.6  # not behind the four (1.6 s)


def test_a_burst_of_uploads_waits_for_its_tenants_slots(tmp_path, monkeypatch):
    from evidentia.api.routers import documents

    pdf = write_sample_report(tmp_path / "acme-2023.pdf")
    seen = Concurrency(0.3)
    real_count = documents._count_pages

    def held_count(services, path):
        seen.hold(path.parent.name)  # <uploads>/<tenant>/.tmp-<generation>.pdf
        return real_count(services, path)

    monkeypatch.setattr(documents, "_count_pages", held_count)
    with TestClient(make_app(tmp_path, tenant_concurrency=1)) as c:
        wait_ready(c)
        burst, other = new_tenant(c, "burst"), new_tenant(c, "other")

        def send(headers, document_id):
            def call():
                assert upload(c, headers, pdf, document_id).status_code == 202
            return call

        calls = {f"burst{i}": send(burst, f"doc-{i}") for i in range(3)} | {"other": send(other, "doc")}
        ended = _at_once(calls, first=[f"burst{i}" for i in range(3)])
    assert len(ended) == 4
    assert seen.most["burst"] == 1 and seen.most_overall == 2
    assert ended["other"] < max(ended[f"burst{i}"] for i in range(3)) - 0.3
