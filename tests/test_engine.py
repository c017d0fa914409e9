"""evidentia/engine.py: one search through the first stage and the reranker, within the
engine's search slots."""

from __future__ import annotations

import time

import pytest

from evidentia.config import Settings
from evidentia.engine import Engine
from evidentia.records import Document, Page, RankedPage
from evidentia.reranker.base import NoReranker, RerankResult
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


class _RemoteReranker(NoReranker):
    """A reranker that waits on a remote model, as the LLM does: it keeps page 2 only."""

    name = "remote"
    takes_deadline = True

    def __init__(self):
        self.calls = 0

    def rerank(self, query, candidates, deadline=None):
        self.calls += 1
        return RerankResult(pages=[RankedPage(c.doc_id, c.page, 1.0, text=c.text) for c in candidates if c.page == 2],
                            info={"kept": 1})


def test_a_remote_reranker_is_handed_back_and_completes_the_first_stage_result(engine):
    """The API awaits an LLM outside its thread pool; the engine still assembles the result
    (run_awaiting, then SearchResult.with_rerank), as Engine.run does for any reranker."""
    more = "Scope 2 emissions were 3,100 tCO2e in 2023; Scope 1 as above."
    engine.backend.index_document(Document("acme2", (Page("acme2", 1, "unrelated", "unrelated", "en", 9),
                                                     Page("acme2", 2, more, more, "en", len(more))), "acme2.pdf"))
    config = engine.config(stage="bm25", reranker="none")
    query = engine.query("Scope 1 emissions?", "")
    remote = _RemoteReranker()
    first, handed_back = engine.run_awaiting(query, ["acme", "acme2"], config, reranker=remote)
    assert handed_back is remote and remote.calls == 0  # not run inside the engine's slot
    assert first.reranker == "none" and [p.page for p in first.pages] == [p.page for p in first.candidates]
    done = first.with_rerank(remote, remote.rerank(query, first.candidates), 5.0)
    assert done.reranker == "remote" and [(p.doc_id, p.page) for p in done.pages] == [("acme2", 2)]
    assert done.info == {"kept": 1} and done.timings_ms["rerank"] == 5.0
    assert done.timings_ms["total"] == pytest.approx(first.timings_ms["total"] + 5.0)
    # a local reranker runs in the engine, as in Engine.run
    local, none_left = engine.run_awaiting(query, ["acme"], config, reranker=NoReranker())
    assert none_left is None and [p.page for p in local.pages] == [1]
