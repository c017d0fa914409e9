"""evidentia/engine.py: one search through the first stage and the reranker, within the
engine's search slots."""

from __future__ import annotations

import time

import pytest

from evidentia.config import Settings
from evidentia.engine import Engine
from evidentia.records import Document, Page
from evidentia.retriever.tantivy_backend import TantivyBackend
from evidentia.runtime import Overloaded
from tests.utils.gates import slot_held


@pytest.fixture
def engine(tmp_path):
    backend = TantivyBackend(tmp_path / "index")
    text = "Scope 1 emissions were 12,450 tCO2e in 2023."
    backend.index_document(Document("acme", (Page("acme", 1, text, text, "en", len(text)),), "acme.pdf"))
    yield Engine(Settings(data_dir=tmp_path, dense=False, search_concurrency=1), backend=backend)
    backend.close()


def test_a_search_takes_a_search_slot_and_waits_for_one(engine):
    """Searches computed all at once shared the cores until each took as long as all together
    (bench/bench_overload.py): the engine runs EVIDENTIA_SEARCH_CONCURRENCY at a time."""
    config = engine.config(stage="bm25", reranker="none")
    query = engine.query("Scope 1 emissions?", "12,450 tCO2e")  # built first: it loads the language models
    with slot_held(engine.search_gate, release_after=0.2):
        result = engine.run(query, ["acme"], config)
    assert [p.page for p in result.pages] == [1]
    assert result.timings_ms["queue"] > 100  # it waited for the slot


def test_a_search_the_line_would_not_reach_by_its_deadline_is_refused_at_once(engine):
    config = engine.config(stage="bm25", reranker="none")
    query = engine.query("Scope 1 emissions?", "")
    with engine.search_gate.enter():
        time.sleep(0.3)  # the usual hold: 0.3 s
    with slot_held(engine.search_gate):
        t0 = time.monotonic()
        with pytest.raises(Overloaded):
            engine.run(query, ["acme"], config, deadline=time.monotonic() + 0.4)
        assert time.monotonic() - t0 < 0.3  # at once, not at its deadline
