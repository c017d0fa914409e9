"""One contract, every search backend: the same records for the same data.

"embedded" (tantivy in a temporary directory) always runs; "elasticsearch" runs
when EVIDENTIA_ES_URL points at a cluster (each test gets its own index, deleted
afterwards), e.g.::

    docker compose up -d elasticsearch
    EVIDENTIA_ES_URL=http://localhost:9200 python -m pytest tests/retriever/test_backend_contract.py

The tail of the file unit-tests the Elasticsearch backend's pure helpers and its
write protocol against a fake client, so those run without a cluster.
"""

from __future__ import annotations

import json
import socket

import pytest
from elasticsearch import ConnectionError as ESConnectionError
from elasticsearch import helpers as es_helpers

import numpy as np

from evidentia.records import Candidate, Document, DocumentInfo, Page, PageVectors
from evidentia.retriever import elasticsearch_backend as esb
from evidentia.retriever.base import BackendError, UnknownDocumentError
from evidentia.text import LANGUAGES, keywords, tokens



# --- fixtures and builders -----------------------------------------------------
from tests.utils.backends import backend  # noqa: E402,F401  (fixture)
from tests.utils.fake_elasticsearch import FakeStoreClient  # noqa: E402
from tests.utils.paths import REPO  # noqa: E402


def page(doc_id: str, n: int, text: str, language: str | None = "en", raw_text: str | None = None) -> Page:
    return Page(doc_id=doc_id, page=n, raw_text=text if raw_text is None else raw_text, text=text,
                language=language if text else None, char_count=len(text))


def empty(doc_id: str, n: int) -> Page:
    return Page(doc_id=doc_id, page=n, raw_text="", text="", language=None, char_count=0)


def doc(doc_id: str, *pages: Page, source: str = "") -> Document:
    return Document(doc_id=doc_id, pages=tuple(pages), source=source or f"{doc_id}.pdf")


def solar_doc(doc_id: str) -> Document:
    """Pages of equal length with 1..5 mentions of "solar": BM25 ranks 5, 4, 3, 2, 1."""
    return doc(doc_id, *(page(doc_id, i, " ".join(["solar"] * i + ["panel"] * (10 - i))) for i in range(1, 6)))


def hits(results: list[Candidate]) -> list[tuple[str, int]]:
    return [(c.doc_id, c.page) for c in results]


# --- search ---------------------------------------------------------------------
def test_search_returns_candidates_best_first_from_requested_docs_only(backend):
    backend.index_document(solar_doc("a"))
    backend.index_document(solar_doc("b"))
    backend.index_document(doc("c", page("c", 1, "solar solar solar solar solar solar solar solar solar solar")))

    results = backend.search(["solar"], ["a"], 10)
    assert hits(results) == [("a", 5), ("a", 4), ("a", 3), ("a", 2), ("a", 1)]
    assert all(isinstance(c, Candidate) for c in results)
    scores = [c.score for c in results]
    assert scores == sorted(scores, reverse=True) and scores[-1] > 0 and len(set(scores)) == 5
    best = results[0]
    assert best.text == solar_doc("a").pages[4].text and best.language == "en"
    assert "solar" in best.snippet

    both = backend.search(["solar"], ["b", "a"], 10)
    assert {d for d, _ in hits(both)} == {"a", "b"} and len(both) == 10
    # equal pages score equally; ties go by doc id, then page
    assert hits(both)[:2] == [("a", 5), ("b", 5)]
    assert both[0].score == pytest.approx(both[1].score)


def test_top_k_is_respected(backend):
    backend.index_document(solar_doc("a"))
    assert hits(backend.search(["solar"], ["a"], 3)) == [("a", 5), ("a", 4), ("a", 3)]
    assert hits(backend.search(["solar"], ["a"], 1)) == [("a", 5)]
    assert backend.search(["solar"], ["a"], 0) == []
    assert backend.search([], ["a"], 5) == []
    assert backend.search(["photovoltaic"], ["a"], 5) == []


def test_keywords_are_or_ed(backend):
    backend.index_document(doc("a", page("a", 1, "wind turbines offshore"), page("a", 2, "solar parks inland"),
                               page("a", 3, "coal plants")))
    assert sorted(hits(backend.search(["wind", "solar"], ["a"], 10))) == [("a", 1), ("a", 2)]


def test_words_too_long_to_be_indexed_match_nothing_and_break_nothing(backend):
    """Two 60-digit numbers made tantivy's query parser raise (every term dropped by the
    analyser): a 500 for the validation."""
    backend.index_document(doc("a", page("a", 1, "wind turbines offshore")))
    assert backend.search(["1" * 60, "2" * 60], ["a"], 5) == []
    assert backend.search(["a" * 70], ["a"], 5) == []
    assert hits(backend.search(["1" * 60, "wind"], ["a"], 5)) == [("a", 1)]


def test_unknown_doc_id_raises(backend):
    with pytest.raises(UnknownDocumentError) as err:
        backend.search(["solar"], ["nope"], 5)
    assert err.value.doc_ids == ["nope"]
    backend.index_document(solar_doc("a"))
    with pytest.raises(UnknownDocumentError) as err:
        backend.search(["solar"], ["a", "nope", "nope2"], 5)
    assert err.value.doc_ids == ["nope", "nope2"]
    # doc ids are exact, not prefixes
    with pytest.raises(UnknownDocumentError):
        backend.search(["solar"], ["A"], 5)


# Pairs whose Snowball stems agree (checked with tantivy) and that Elasticsearch's
# built-in (partly "light") stemmers also conflate. The keyword is never a token of
# the page, so only the language field can match.
STEMMING = [
    ("en", "Greenhouse gas emissions decreased sharply last year.", "emission"),
    ("fr", "Les émissions de gaz à effet de serre ont baissé.", "émission"),
    ("de", "Die Emissionen des Konzerns sind deutlich gesunken.", "Emission"),
    ("es", "Las emisiones de gases disminuyeron este año.", "emisión"),
    ("it", "Le emissioni di gas serra sono diminuite.", "emissione"),
    ("pt", "Os investimentos da empresa aumentaram muito.", "investimento"),
    ("nl", "De investeringen van het bedrijf stegen sterk.", "investering"),
]


@pytest.mark.parametrize("lang,text,word", STEMMING, ids=[s[0] for s in STEMMING])
def test_stemming_per_language(backend, lang, text, word):
    pages = [page("m", i, t, language=l) for i, (l, t, _) in enumerate(STEMMING, start=1)]
    backend.index_document(doc("m", *pages, empty("m", len(pages) + 1)))
    kws = keywords(word, lang)
    assert kws and not set(kws) & set(tokens(text))  # the neutral field alone cannot match
    expected = next(i for i, (l, _, _) in enumerate(STEMMING, start=1) if l == lang)
    found = backend.search(kws, ["m"], 10)
    assert ("m", expected) in hits(found)
    assert next(c for c in found if c.page == expected).language == lang


def test_language_without_stemmer_is_found_through_the_neutral_field(backend):
    backend.index_document(doc("p", page("p", 1, "Emisje gazów cieplarnianych spadły.", language="pl"),
                               page("p", 2, "Emissions fell.", language="en")))
    assert hits(backend.search(["emisje"], ["p"], 5)) == [("p", 1)]
    # and an accented word is found on a page of any language, unstemmed
    backend.index_document(doc("q", page("q", 1, "Les émissions ont baissé.", language="fr")))
    assert hits(backend.search(["émissions"], ["q"], 5)) == [("q", 1)]


@pytest.mark.parametrize("text,lang,answer", [
    ("In 2023 the group reported capital expenditures of $1,577 million.", "en", "$1577.00"),
    ("Une hausse de 12,5 % des émissions a été constatée.", "fr", "12.5%"),
    ("Der Umsatz betrug 1.577.000 Euro im Geschäftsjahr.", "de", "1,577,000"),
])
def test_numbers_are_normalised_end_to_end(backend, text, lang, answer):
    backend.index_document(doc("n", page("n", 1, text, language=lang), page("n", 2, "Nothing to see here.")))
    kws = keywords(answer, lang)
    assert kws
    assert hits(backend.search(kws, ["n"], 5)) == [("n", 1)]


def test_a_continental_figure_meets_its_english_writing(backend):
    """"48.300 Tonnen" on a German page was indexed as 48.3: an answer of "48,300 t" never found it."""
    backend.index_document(doc("g", page("g", 1, "Die direkten Emissionen betrugen 48.300 Tonnen CO2e.", language="de"),
                               page("g", 2, "Der Vorstand tagte viermal.", language="de")))
    assert hits(backend.search(keywords("48,300 t", "en"), ["g"], 5)) == [("g", 1)]
    # and an English answer that copies the German figure still meets it (both read 48.3 before)
    assert hits(backend.search(keywords("48.300 t", "en"), ["g"], 5)) == [("g", 1)]


# --- writing ----------------------------------------------------------------------
def test_reindexing_replaces_the_document(backend):
    backend.index_document(doc("a", page("a", 1, "legacy boilers"), page("a", 2, "legacy pumps"),
                               page("a", 3, "legacy fans")))
    backend.index_document(doc("ab", page("ab", 1, "legacy heating in a neighbouring document")))
    assert len(backend.search(["legacy"], ["a"], 10)) == 3

    backend.index_document(doc("a", page("a", 1, "modern heat pumps"), page("a", 2, "modern insulation"),
                               source="a-v2.pdf"))
    assert backend.search(["legacy"], ["a"], 10) == []
    assert sorted(hits(backend.search(["modern"], ["a"], 10))) == [("a", 1), ("a", 2)]
    assert backend.get_document("a") == DocumentInfo("a", pages=2, empty_pages=0, languages={"en": 2},
                                                     source="a-v2.pdf")
    assert backend.get_page("a", 3) is None
    assert backend.get_page("a", 1).text == "modern heat pumps"
    assert [d.doc_id for d in backend.list_documents()] == ["a", "ab"]
    # a document whose id starts with the same letters is untouched
    assert hits(backend.search(["legacy"], ["ab"], 10)) == [("ab", 1)]


def test_delete_document(backend):
    backend.index_document(solar_doc("a"))
    backend.index_document(solar_doc("b"))
    assert backend.delete_document("a") is True
    assert backend.get_document("a") is None
    assert backend.get_page("a", 1) is None
    assert [d.doc_id for d in backend.list_documents()] == ["b"]
    with pytest.raises(UnknownDocumentError):
        backend.search(["solar"], ["a"], 5)
    assert backend.delete_document("a") is False
    assert backend.delete_document("never-there") is False
    assert len(backend.search(["solar"], ["b"], 10)) == 5
    # an id can be indexed again after deletion
    backend.index_document(doc("a", page("a", 1, "fresh start")))
    assert hits(backend.search(["fresh"], ["a"], 5)) == [("a", 1)]


# --- reading ----------------------------------------------------------------------
def test_list_get_document_and_get_page_values(backend):
    b_pages = (
        page("b", 1, "Rapport annuel", language="fr"),
        page("b", 2, "Nachhaltigkeitsbericht", language="de"),
        page("b", 3, "Sustainability report", language="en"),
        page("b", 4, "Rapport de gestion", language="fr"),
    )
    raw = "Scope 1 emis-\nsions\x0c"
    a_pages = (page("a", 1, "Scope 1 emissions", raw_text=raw), empty("a", 2))
    backend.index_document(doc("b", *b_pages, source="b report.pdf"))
    backend.index_document(doc("a", *a_pages, source="a.pdf"))

    expected = [
        DocumentInfo("a", pages=2, empty_pages=1, languages={"en": 1}, source="a.pdf"),
        DocumentInfo("b", pages=4, empty_pages=0, languages={"fr": 2, "de": 1, "en": 1}, source="b report.pdf"),
    ]
    assert backend.list_documents() == expected
    assert backend.get_document("a") == expected[0]
    assert backend.get_document("b") == expected[1]
    assert backend.get_document("c") is None

    assert backend.get_page("a", 1) == a_pages[0]
    assert backend.get_page("a", 1).raw_text == raw
    for p in b_pages:
        assert backend.get_page("b", p.page) == p
    assert backend.get_page("a", 9) is None
    assert backend.get_page("zzz", 1) is None


def check_whole_document_and_its_vectors_read_back(backend) -> None:
    """What the classifier reads of a candidate's document: every page, and every
    window vector as float16, the same from every backend."""
    vectors = PageVectors("all-MiniLM-L6-v2", np.array([1, 1, 3], dtype=np.int32),
                          np.array([[0.6, 0.8], [1.0, 0.0], [0.28, 0.96]], dtype=np.float32), windows=(256, 32, 2))
    pages = (page("v", 1, "Scope 1 emissions"), empty("v", 2), page("v", 3, "Water withdrawal"))
    backend.index_document(Document("v", pages, "v.pdf", vectors=vectors))
    backend.index_document(doc("plain", page("plain", 1, "No vectors here")))
    # vectors written before their windows were recorded read back without them
    legacy = PageVectors("all-MiniLM-L6-v2", np.array([1], dtype=np.int32), np.array([[0.6, 0.8]], dtype=np.float32))
    backend.index_document(Document("old", (page("old", 1, "Scope 2"),), "old.pdf", vectors=legacy))

    stored = backend.stored_document("v")
    assert stored.pages == pages and stored.source == "v.pdf"
    read = backend.page_vectors("v")
    assert read.model == "all-MiniLM-L6-v2" and read.windows == (256, 32, 2)
    assert backend.page_vectors("old").windows is None
    np.testing.assert_array_equal(read.pages, [1, 1, 3])
    np.testing.assert_array_equal(np.asarray(read.vectors, dtype=np.float16), vectors.vectors.astype(np.float16))
    assert backend.page_vectors("plain") is None
    assert backend.stored_document("zzz") is None and backend.page_vectors("zzz") is None


def test_whole_document_and_its_vectors_read_back(backend):
    check_whole_document_and_its_vectors_read_back(backend)


def test_empty_pages_are_stored_but_never_match(backend):
    backend.index_document(doc("e", empty("e", 1), page("e", 2, "water withdrawal"), empty("e", 3)))
    stored = backend.get_page("e", 1)
    assert stored == Page("e", 1, "", "", None, 0) and stored.is_empty
    assert backend.get_page("e", 3).char_count == 0
    assert backend.get_document("e").empty_pages == 2
    assert hits(backend.search(["water", "withdrawal", "page"], ["e"], 10)) == [("e", 2)]


def test_document_with_only_empty_pages_is_listed_and_searchable(backend):
    backend.index_document(doc("blank", empty("blank", 1), empty("blank", 2)))
    assert backend.get_document("blank") == DocumentInfo("blank", 2, 2, {}, "blank.pdf")
    assert backend.search(["anything"], ["blank"], 5) == []


# --- the Elasticsearch mapping ------------------------------------------------------
def test_mapping_has_a_field_per_language():
    mapping = json.loads((REPO / "es_mappings" / "pages.json").read_text(encoding="utf-8"))
    assert esb.load_mapping() == mapping  # shipped as package data
    props = mapping["mappings"]["properties"]
    for code, name in LANGUAGES.items():
        assert props[f"body_{code}"] == {"type": "text", "analyzer": name, "similarity": "BM25"}
    assert {k for k in props if k.startswith("body_")} == {f"body_{c}" for c in LANGUAGES}
    neutral = props["body"]["analyzer"]
    assert mapping["settings"]["analysis"]["analyzer"][neutral] == {
        "type": "custom", "tokenizer": "standard", "filter": ["lowercase"]}
    for f in ("kind", "doc_id", "language", "source", "generation"):
        assert props[f]["type"] == "keyword"
    for f in ("page", "char_count"):
        assert props[f]["type"] == "integer"
    for f in ("raw_text", "text"):
        assert props[f]["index"] is False
    assert props["meta"] == {"type": "object", "enabled": False}
    assert mapping["mappings"]["_meta"]["evidentia_schema_version"] == esb.SCHEMA_VERSION


def test_written_fields_all_exist_in_the_strict_mapping():
    props = esb.load_mapping()["mappings"]["properties"]
    d = doc("x", page("x", 1, "Scope 2 emissions", language="en"), page("x", 2, "tekst", language="pl"),
            empty("x", 3))
    for action in esb.page_actions("idx", d, "g1"):
        assert set(action["_source"]) <= set(props)
    assert set(esb.record_source(d, "g1")) <= set(props)


# --- pure helpers of the Elasticsearch backend -----------------------------------
def test_page_actions():
    d = doc("x", page("x", 1, "Capex of $1,577 million", language="en"), page("x", 2, "tekst", language="pl"),
            empty("x", 3))
    actions = esb.page_actions("idx", d, "gen1")
    assert [a["_id"] for a in actions] == ["x:gen1:1", "x:gen1:2", "x:gen1:3"]
    assert all(a["_index"] == "idx" and a["_op_type"] == "index" for a in actions)
    first, second, third = (a["_source"] for a in actions)
    assert first == {
        "kind": "page", "doc_id": "x", "generation": "gen1", "page": 1, "char_count": 23,
        "raw_text": "Capex of $1,577 million", "text": "Capex of $1,577 million", "language": "en",
        "body": "Capex of $1577 million", "body_en": "Capex of $1577 million", "text_source": "text",
    }
    assert second["body"] == "tekst" and not any(k.startswith("body_") for k in second)
    assert "body" not in third and "language" not in third and third["char_count"] == 0
    assert third["text_source"] == "none" and "ocr_confidence" not in third


def test_record_source_and_info_roundtrip():
    d = doc("x", page("x", 1, "a b c", language="fr"), page("x", 2, "d e f", language="en"),
            page("x", 3, "g h i", language="fr"), empty("x", 4), source="x.pdf")
    rec = esb.record_source(d, "gen1")
    assert rec["kind"] == "doc" and rec["generation"] == "gen1" and rec["doc_id"] == "x"
    assert rec["meta"] == {"pages": 4, "empty_pages": 1, "languages": {"fr": 2, "en": 1}, "source": "x.pdf",
                           "ocr_pages": 0, "unread_pages": 0, "ocr_confidence": None}
    assert esb.info_from_record("x", rec) == DocumentInfo("x", 4, 1, {"fr": 2, "en": 1}, "x.pdf")
    src = esb.page_actions("i", d, "g")[0]["_source"]
    assert esb.page_from_source(src) == d.pages[0]
    empty_src = esb.page_actions("i", d, "g")[3]["_source"]
    assert esb.page_from_source(empty_src) == d.pages[3]


def test_search_request():
    req = esb.search_request(["scope", "1577"], {"b": "g2", "a": "g1"}, 7, neutral_boost=1.0, language_boost=2.0)
    assert req["size"] == 7
    query = req["query"]["bool"]
    assert query["filter"] == [
        {"term": {"kind": "page"}},
        {"terms": {"doc_id": ["a", "b"]}},
        {"terms": {"generation": ["g1", "g2"]}},
    ]
    match, multi = query["should"]
    assert match == {"match": {"body": {"query": "scope 1577", "operator": "or", "boost": 1.0}}}
    assert multi["multi_match"]["query"] == "scope 1577"
    assert multi["multi_match"]["fields"] == [f"body_{c}" for c in LANGUAGES]
    assert multi["multi_match"]["operator"] == "or" and multi["multi_match"]["boost"] == 2.0
    assert query["minimum_should_match"] == 1
    assert [next(iter(s)) for s in req["sort"]] == ["_score", "doc_id", "page"]
    assert set(req["source"]) >= {"doc_id", "page", "text", "language"}


def test_generations_sort_by_age_and_ids_do_not_collide():
    gens = [esb.new_generation() for _ in range(50)]
    assert gens == sorted(gens) and len(set(gens)) == 50
    assert esb.record_id("a") == "a:doc"
    assert esb.page_id("a", gens[0], 3) == f"a:{gens[0]}:3"
    # a record id never equals a page id: page ids end in a number
    assert esb.record_id("a:" + gens[0]) != esb.page_id("a", gens[0], 1)


def test_safe_url_hides_credentials():
    assert esb._safe_url("https://elastic:secret@es.example:9243/path") == "https://es.example:9243/path"
    assert esb._safe_url("http://localhost:9200") == "http://localhost:9200"


def test_unreachable_server_gives_a_helpful_error():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(BackendError) as err:
        esb.ElasticsearchBackend(url, index="evidentia-test")
    msg = str(err.value)
    assert url in msg and "EVIDENTIA_ES_URL" in msg and "running" in msg


# --- the write protocol, against a fake client --------------------------------------
class FakeIndices:
    def __init__(self, client, exists=True, version=esb.SCHEMA_VERSION):
        self.client, self._exists, self.version = client, exists, version

    def exists(self, index):
        return self._exists

    def create(self, index, settings, mappings):
        self.client.calls.append(("create", index, settings, mappings))
        self._exists = True

    def get_mapping(self, index):
        return {index: {"mappings": {"_meta": {"evidentia_schema_version": self.version}}}}

    def refresh(self, index):
        self.client.calls.append(("refresh",))


class FakeClient:
    """Records calls; holds one document record (or none)."""

    def __init__(self, record_generation=None, **indices):
        self.calls = []
        self.indices = FakeIndices(self, **indices)
        self.record_generation = record_generation

    def options(self, **_):
        return self

    def get(self, index, id, **_):
        if self.record_generation is None:
            return {"found": False}
        return {"found": True, "_seq_no": 3, "_primary_term": 1,
                "_source": {"generation": self.record_generation}}

    def index(self, index, id, document, **kw):
        self.calls.append(("index", id, document["generation"], kw))
        self.record_generation = document["generation"]

    def delete_by_query(self, index, query, **kw):
        self.calls.append(("delete_by_query", query))

    def close(self):
        pass


def _fake_bulk(calls, fail=None):
    def bulk(client, actions, **kw):
        actions = list(actions)
        calls.append(("bulk", [a["_id"] for a in actions]))
        if fail is not None:
            raise fail
        return len(actions), []
    return bulk


def test_index_document_writes_pages_then_switches_then_drops_older(monkeypatch):
    client = FakeClient(record_generation="00000000000000000001-old")
    monkeypatch.setattr(es_helpers, "bulk", _fake_bulk(client.calls))
    backend = esb.ElasticsearchBackend("http://es:9200", index="idx", client=client)
    backend.index_document(doc("a", page("a", 1, "one"), page("a", 2, "two")))

    kinds = [c[0] for c in client.calls]
    assert kinds == ["bulk", "refresh", "index", "delete_by_query"]
    gen = client.calls[2][2]
    assert client.calls[0][1] == [f"a:{gen}:1", f"a:{gen}:2"]
    _, rid, _, kw = client.calls[2]
    assert rid == "a:doc" and kw["if_seq_no"] == 3 and kw["if_primary_term"] == 1
    assert kw["refresh"] == "wait_for"
    dropped = client.calls[3][1]["bool"]["filter"]
    assert {"term": {"doc_id": "a"}} in dropped and {"range": {"generation": {"lt": gen}}} in dropped


def test_first_version_is_created_not_overwritten(monkeypatch):
    client = FakeClient()
    monkeypatch.setattr(es_helpers, "bulk", _fake_bulk(client.calls))
    backend = esb.ElasticsearchBackend("http://es:9200", index="idx", client=client)
    backend.index_document(doc("a", page("a", 1, "one")))
    assert client.calls[2][3]["op_type"] == "create"


@pytest.mark.parametrize("failure", [
    ESConnectionError("connection reset"),
    es_helpers.BulkIndexError("1 document(s) failed to index.", [{"index": {"error": "mapper_parsing_exception"}}]),
])
def test_failed_bulk_removes_the_new_generation_and_keeps_the_old(monkeypatch, failure):
    client = FakeClient(record_generation="00000000000000000001-old")
    monkeypatch.setattr(es_helpers, "bulk", _fake_bulk(client.calls, fail=failure))
    backend = esb.ElasticsearchBackend("https://user:pw@es:9200", index="idx", client=client)
    with pytest.raises(BackendError) as err:
        backend.index_document(doc("a", page("a", 1, "one"), page("a", 2, "two")))
    assert "https://es:9200" in str(err.value) and "pw" not in str(err.value)
    assert "index" not in [c[0] for c in client.calls]  # the record still names the old version
    assert client.record_generation == "00000000000000000001-old"
    gen = client.calls[0][1][0].split(":")[1]
    deletes = [c[1] for c in client.calls if c[0] == "delete_by_query"]
    assert deletes == [{"bool": {"filter": [{"term": {"doc_id": "a"}}, {"term": {"generation": gen}}]}}]


def test_a_newer_live_version_is_not_overwritten(monkeypatch):
    client = FakeClient(record_generation="99999999999999999999-newer")
    monkeypatch.setattr(es_helpers, "bulk", _fake_bulk(client.calls))
    backend = esb.ElasticsearchBackend("http://es:9200", index="idx", client=client)
    backend.index_document(doc("a", page("a", 1, "one")))
    assert client.record_generation == "99999999999999999999-newer"
    assert "index" not in [c[0] for c in client.calls]
    gen = client.calls[0][1][0].split(":")[1]
    assert client.calls[-1] == ("delete_by_query", {"bool": {"filter": [
        {"term": {"doc_id": "a"}}, {"term": {"generation": gen}}]}})


def test_missing_index_is_created_from_the_mapping():
    client = FakeClient(exists=False)
    esb.ElasticsearchBackend("http://es:9200", index="idx", client=client)
    _, index, settings, mappings = client.calls[0]
    mapping = esb.load_mapping()
    assert (index, settings, mappings) == ("idx", mapping["settings"], mapping["mappings"])


def test_index_of_another_schema_version_is_refused():
    with pytest.raises(BackendError, match="schema version 0"):
        esb.ElasticsearchBackend("http://es:9200", index="idx", client=FakeClient(version=0))


class FakeSearchClient(FakeClient):
    def mget(self, index, ids, **_):
        live = {"a:doc": "g1", "b:doc": "g2"}
        return {"docs": [{"_id": i, "found": True, "_source": {"generation": live[i]}} if i in live
                         else {"_id": i, "found": False} for i in ids]}

    def search(self, index, **request):
        self.calls.append(("search", request))
        return {"hits": {"hits": [
            {"_score": 1.5, "_source": {"doc_id": "b", "page": 2, "text": "solar b", "language": "en"}},
            {"_score": 2.5, "_source": {"doc_id": "a", "page": 7, "text": "solar a"}},
        ]}}


def test_search_reads_live_generations_and_builds_candidates():
    client = FakeSearchClient()
    backend = esb.ElasticsearchBackend("http://es:9200", index="idx", client=client)
    with pytest.raises(UnknownDocumentError) as err:
        backend.search(["solar"], ["a", "zz"], 5)
    assert err.value.doc_ids == ["zz"]
    results = backend.search(["solar"], ["b", "a", "b"], 5)
    assert results == [
        Candidate("a", 7, 2.5, "solar a", None, "solar a"),
        Candidate("b", 2, 1.5, "solar b", "en", "solar b"),
    ]
    request = client.calls[-1][1]
    assert {"terms": {"generation": ["g1", "g2"]}} in request["query"]["bool"]["filter"]
    assert backend.search([], ["a"], 5) == [] and backend.search(["solar"], ["a"], 0) == []


def test_elasticsearch_reads_a_whole_document_and_its_vectors_in_one_request_each(monkeypatch):
    """On Elasticsearch the classifier's document features and stored vectors used to
    be missing (each page stood alone: ECE 0.39 on held-out financebench pools,
    docs/BENCHMARKS.md section 8f), and reading a document cost two requests per page."""
    client = FakeStoreClient()
    monkeypatch.setattr(es_helpers, "bulk", client.bulk)
    monkeypatch.setattr(es_helpers, "scan", client.scan)
    backend = esb.ElasticsearchBackend("http://es:9200", index="idx", client=client)
    check_whole_document_and_its_vectors_read_back(backend)
    assert client.scans == 3  # stored_document("v"), page_vectors("v") and ("old"); "plain" has none to read
    assert all("window_vectors" not in f for f in esb._PAGE_FIELDS + esb._PAGE_SOURCE)
