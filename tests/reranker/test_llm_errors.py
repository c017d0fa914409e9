"""What the LLM reranker says when the endpoint fails: its `fallback_reason` goes to every
tenant (POST /v1/validate returns it, the store keeps it, the web page shows it), so it
names the category and the status only; the upstream body, which may echo the request's
Authorization header and internal hosts, goes to the server's log with the key masked."""

from __future__ import annotations

import json
import logging

import pytest

from evidentia.records import Candidate
from evidentia.reranker.base import passthrough
from evidentia.reranker.llm import ANSWER_KEY, LLMReranker, mask_secret
from evidentia.retriever.query import build_query

from tests.utils.fake_openai import FakeOpenAI, char_token_estimate, server, sleeps  # noqa: F401  (fixtures)

SECRET_KEY = "sk-SECRET-abc123-0123456789"
QUERY = build_query("Does the supplier report its Scope 1 and 2 emissions?", "Yes, 12,450 tCO2e in 2023.")
POOL = [Candidate(doc_id="report-a", page=p, score=10.0 - p, text=f"page {p} text on emissions", snippet="s")
        for p in (1, 2, 3)]
LEAKS = (SECRET_KEY, "Incorrect API key", "llm-gw", "/srv/models", "Bearer")


def echoing(status: int):
    """An upstream that answers ``status`` with a body quoting the request's Authorization
    header and internal hosts (as the attacker's stub did)."""
    def answer(request: dict):
        return status, {"error": {"message": f"Incorrect API key provided: Bearer {SECRET_KEY}. internal host "
                                             "llm-gw.corp.internal:8443 path /srv/models/llama/ggml.bin",
                                  "type": "invalid_request_error"}}
    return answer


def make(server: FakeOpenAI, sleeps: list, **kw) -> LLMReranker:
    kw.setdefault("max_retries", 0)
    return LLMReranker(base_url=server.base_url, api_key=SECRET_KEY, timeout_s=5.0, sleep=sleeps.append,
                       structured_output="off", tokenizer="chars", **kw)


@pytest.mark.parametrize("status, reason", [
    (401, "LLM request rejected: 401 Unauthorized: check EVIDENTIA_LLM_API_KEY"),
    (403, "LLM request rejected: 403 Forbidden: check EVIDENTIA_LLM_API_KEY and its access to EVIDENTIA_LLM_MODEL"),
    (404, "LLM request rejected: 404 Not Found: check EVIDENTIA_LLM_MODEL and EVIDENTIA_LLM_BASE_URL"),
    (400, "LLM request rejected: 400 Bad Request"),
])
def test_a_refusal_says_its_status_and_what_to_check_never_the_body(server, sleeps, caplog, status, reason):
    server.handler = echoing(status)
    with caplog.at_level(logging.WARNING, logger="evidentia.reranker.llm"):
        result = make(server, sleeps).rerank(QUERY, POOL)
    assert result.pages == passthrough(POOL)
    assert result.fallback_reason == f"{reason}; first-stage order returned"
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "Incorrect API key provided" in logged and "llm-gw.corp.internal:8443" in logged  # the log has it all
    assert SECRET_KEY not in logged  # but the key


def test_a_server_error_after_the_retries_says_the_status_only(server, sleeps, caplog):
    server.handler = echoing(500)
    with caplog.at_level(logging.WARNING, logger="evidentia.reranker.llm"):
        result = make(server, sleeps, max_retries=2).rerank(QUERY, POOL)
    assert len(server.requests) == 3
    assert result.fallback_reason == ("LLM unavailable after 3 attempts: 500 Internal Server Error; "
                                      "first-stage order returned")
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 3 and all("llm-gw" in m and SECRET_KEY not in m for m in logged)


def test_the_key_is_masked_wherever_a_reason_would_quote_it(server, sleeps):
    # a model (or a proxy before it) that answers with the key as its page numbers
    bad = json.dumps({ANSWER_KEY: [SECRET_KEY, f"Bearer {SECRET_KEY}"]})
    server.push_answer(bad).push_answer(bad)
    result = make(server, sleeps).rerank(QUERY, POOL)
    assert result.fallback_reason.startswith("LLM answer unusable after 2 attempts")
    assert SECRET_KEY not in result.fallback_reason and "***" in result.fallback_reason


def test_an_unexpected_client_error_is_named_by_its_type(caplog):
    class Exploding:
        """A client whose error message quotes the key and the server's paths."""

        class chat:
            class completions:
                @staticmethod
                def create(**kwargs):
                    raise RuntimeError(f"boom at http://llm-gw.corp.internal/v1 with {SECRET_KEY} in /srv/models/x")

    reranker = LLMReranker(api_key=SECRET_KEY, client=Exploding(), structured_output="off", tokenizer="chars")
    with caplog.at_level(logging.WARNING, logger="evidentia.reranker.llm"):
        result = reranker.rerank(QUERY, POOL)
    assert result.fallback_reason == "LLM request failed: RuntimeError; first-stage order returned"
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "boom at" in logged and SECRET_KEY not in logged


def test_reasons_never_quote_the_upstream_body_whatever_the_status(server, sleeps):
    for status in (401, 402, 409, 418, 422, 429, 451, 500, 502, 503):
        server.handler = echoing(status)
        reason = make(server, sleeps).rerank(QUERY, POOL).fallback_reason
        assert str(status) in reason and not any(leak in reason for leak in LEAKS), reason


def test_mask_secret():
    assert mask_secret(f"key {SECRET_KEY}!", SECRET_KEY) == "key ***!"
    assert mask_secret("Authorization: Bearer abc.def-ghi, then", None) == "Authorization: Bearer ***, then"
    assert mask_secret("none of it", "none") == "none of it"  # a key as short as a word is not looked for
