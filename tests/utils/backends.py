"""The `backend` fixture shared by the backend test modules: tantivy always,
Elasticsearch when EVIDENTIA_ES_URL points at a cluster (a fresh index per test)."""

from __future__ import annotations

import os
import uuid

import pytest

from evidentia.retriever import elasticsearch_backend as esb
from evidentia.retriever.base import SearchBackend
from evidentia.retriever.tantivy_backend import TantivyBackend


@pytest.fixture(params=["embedded", pytest.param("elasticsearch", marks=pytest.mark.elasticsearch)])
def backend(request, tmp_path) -> SearchBackend:
    if request.param == "embedded":
        b = TantivyBackend(tmp_path / "index")
        yield b
        b.close()
        return
    url = os.environ.get("EVIDENTIA_ES_URL")
    if not url:
        pytest.skip("EVIDENTIA_ES_URL is not set: no Elasticsearch cluster to run the backend tests against "
                    "(start one with `docker compose up -d elasticsearch`)")
    index = f"evidentia-test-{uuid.uuid4().hex[:12]}"
    b = esb.ElasticsearchBackend(url, index=index, api_key=os.environ.get("EVIDENTIA_ES_API_KEY") or None)
    try:
        yield b
    finally:
        b._client.indices.delete(index=index, ignore_unavailable=True)
        b.close()
