"""An in-memory stand-in for the Elasticsearch client: it keeps what the backend
writes (document records, pages sent through ``helpers.bulk``) and answers the
reads of a whole document (``helpers.scan`` over one document's live pages).
Enough for the stored-document and stored-vector reads without a cluster; the
real contract runs against a cluster where EVIDENTIA_ES_URL is set.

Install it with ``monkeypatch.setattr(elasticsearch.helpers, "bulk", client.bulk)``
and the same for ``scan``."""

from __future__ import annotations

from evidentia.retriever import elasticsearch_backend as esb


class _Indices:
    def __init__(self) -> None:
        self.created = False

    def exists(self, index):
        return self.created

    def create(self, index, settings, mappings):
        self.created = True

    def get_mapping(self, index):
        return {index: {"mappings": {"_meta": {"evidentia_schema_version": esb.SCHEMA_VERSION}}}}

    def refresh(self, index):
        pass


class FakeStoreClient:
    def __init__(self) -> None:
        self.indices = _Indices()
        self.records: dict[str, dict] = {}
        self.pages: dict[str, dict] = {}
        self.scans = 0

    def options(self, **_):
        return self

    def get(self, index, id, source_includes=None, **_):
        if id not in self.records:
            return {"found": False}
        return {"found": True, "_seq_no": 1, "_primary_term": 1, "_source": self.records[id]}

    def mget(self, index, ids, **_):
        return {"docs": [{"_id": i, "found": i in self.records, "_source": self.records.get(i, {})} for i in ids]}

    def index(self, index, id, document, **kw):
        self.records[id] = document

    def delete_by_query(self, index, query, **kw):
        pass  # older generations stay; every read filters on the live one

    def bulk(self, client, actions, **kw):
        for action in actions:
            self.pages[action["_id"]] = action["_source"]
        return 0, []

    def scan(self, client, index, query, **kw):
        self.scans += 1
        wanted = {next(iter(f["term"])): next(iter(f["term"].values())) for f in query["query"]["bool"]["filter"]}
        for source in self.pages.values():
            if all(source.get(k) == v for k, v in wanted.items()):
                yield {"_source": {k: source[k] for k in query["_source"] if k in source}}

    def close(self):
        pass
