"""evidentia/store.py: feedback is kept only on the upload a validation searched, never
outlives its document, is bounded per page, and a store written before version 4 is
upgraded in place."""

from __future__ import annotations

import sqlite3

import pytest

from evidentia.store import MAX_VERDICTS_PER_PAGE, SCHEMA_VERSION, FeedbackRefused, Store, ValidationRow


def _ready(store: Store, doc: str = "d", generation: str = "g1") -> None:
    store.put_document("acme", doc, f"{doc}.pdf", 10, f"/x/{generation}/{doc}.pdf", generation)
    store.set_status("acme", doc, generation, "ready", pages=2, empty_pages=0, languages={"en": 2})


def _validation(store: Store, vid: str = "val_1", docs=("d",), created: str = "2026-01-01T00:00:00.000+00:00"):
    store.add_validation(ValidationRow(
        validation_id=vid, tenant="acme", question="q", answer="a", document_ids=list(docs), reranker="none",
        threshold=None, top_k=3, pages=[{"document_id": d, "page": 1} for d in docs], model_version=None,
        fallback_reason=None, created=created))


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "api.sqlite3")
    s.add_tenant("acme")
    yield s
    s.close()


def test_feedback_after_the_delete_is_refused_and_leaves_nothing(store):
    """The delete raced past post_feedback's checks: the insert came after the delete's
    transaction and kept the deleted document's page text in the export."""
    _ready(store)
    _validation(store)
    assert store.delete_document("acme", "d") is not None
    with pytest.raises(FeedbackRefused) as info:
        store.add_feedback("acme", "val_1", "d", 1, True, "ann", "the deleted page's text", "g1")
    assert info.value.code == "document_gone"
    assert list(store.iter_feedback("acme")) == []


def test_feedback_on_a_validation_of_an_earlier_upload_is_refused(store):
    """Re-uploaded and re-indexed: the old question was paired with the new file's page."""
    _ready(store)
    _validation(store)
    assert store.get_validation("acme", "val_1").generations == {"d": "g1"}
    store.put_document("acme", "d", "b.pdf", 10, "/x/g2/b.pdf", "g2")  # served as g1 until promoted
    store.promote_next("acme", "d", "g2", pages=1, empty_pages=0, languages={"en": 1})
    with pytest.raises(FeedbackRefused) as info:
        store.add_feedback("acme", "val_1", "d", 1, True, "ann", "Lunch menu", "g2")
    assert info.value.code == "document_changed" and "validate again" in str(info.value)
    assert list(store.iter_feedback("acme")) == []
    _validation(store, "val_2")  # a validation of the new upload takes feedback
    assert store.add_feedback("acme", "val_2", "d", 1, True, "ann", "Lunch menu", "g2").relevant is True


def test_text_read_from_another_upload_than_the_validation_s_is_refused(store):
    _ready(store)
    _validation(store)
    with pytest.raises(FeedbackRefused, match="re-indexed") as info:
        store.add_feedback("acme", "val_1", "d", 1, True, "ann", "text of g0", "g0")
    assert info.value.code == "document_changed"


def test_an_updated_verdict_moves_to_the_end(store):
    """The update kept the first row's id, so the export (ordered by id) put it first,
    and the export's resolution of a tie disagreed with the store's."""
    _ready(store)
    _validation(store)
    for analyst, relevant in (("ann", False), ("bob", True), ("ann", False)):
        store.add_feedback("acme", "val_1", "d", 1, relevant, analyst, "text", "g1")
    rows = list(store.iter_feedback("acme"))
    assert [(f.analyst, f.relevant) for f in rows] == [("bob", True), ("ann", False)]
    assert rows[0].id < rows[1].id and rows[0].created <= rows[1].created


def test_verdicts_per_page_are_bounded(store):
    """3000 analyst names on one page: 3000 copies of a 95 KB page text, 273 MB."""
    _ready(store)
    _validation(store)
    for i in range(MAX_VERDICTS_PER_PAGE):
        store.add_feedback("acme", "val_1", "d", 1, True, f"an{i}", "x" * 1000, "g1")
    with pytest.raises(FeedbackRefused) as info:
        store.add_feedback("acme", "val_1", "d", 1, True, "one-too-many", "x" * 1000, "g1")
    assert info.value.code == "too_many_verdicts"
    # an analyst who gave one may still change it
    assert store.add_feedback("acme", "val_1", "d", 1, False, "an0", "x" * 1000, "g1").relevant is False
    assert len(list(store.iter_feedback("acme"))) == MAX_VERDICTS_PER_PAGE


def test_pages_judged_beyond_the_results_are_bounded(store):
    """A verdict may be on any page of a searched document, and keeps its text: every page of
    20 documents of 2,000 pages was within reach of one validation."""
    from evidentia.store import MAX_PAGES_BEYOND_RESULTS

    _ready(store)
    _validation(store)  # it returned page 1
    for page in range(2, 2 + MAX_PAGES_BEYOND_RESULTS):
        store.add_feedback("acme", "val_1", "d", page, True, "ann", "text", "g1")
    with pytest.raises(FeedbackRefused) as info:
        store.add_feedback("acme", "val_1", "d", 2 + MAX_PAGES_BEYOND_RESULTS, True, "ann", "text", "g1")
    assert info.value.code == "too_many_pages"
    # a page it returned, another analyst on a page judged already, a verdict changed: still taken
    store.add_feedback("acme", "val_1", "d", 1, True, "ann", "text", "g1")
    store.add_feedback("acme", "val_1", "d", 2, False, "bob", "text", "g1")
    store.add_feedback("acme", "val_1", "d", 3, False, "ann", "text", "g1")


def _as_version_3(path) -> None:
    """The store as written before validations recorded generations."""
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE validations DROP COLUMN generations")
        conn.execute("PRAGMA user_version=3")


def test_a_version_3_store_is_upgraded_and_its_old_validations_checked(tmp_path):
    path = tmp_path / "api.sqlite3"
    store = Store(path)
    store.add_tenant("acme")
    _ready(store, "same")
    _ready(store, "swapped")
    _ready(store, "gone")
    for vid, doc in (("val_same", "same"), ("val_swapped", "swapped"), ("val_gone", "gone")):
        _validation(store, vid, [doc], created="2999-01-01T00:00:00.000+00:00")  # after the documents' times
    # feedback a delete raced past before version 4: the document row is gone, the verdict stayed
    store.add_feedback("acme", "val_gone", "gone", 1, True, "ann", "deleted text", "g1")
    store.close()
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM documents WHERE document_id = 'gone'")
    _as_version_3(path)

    store = Store(path)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
    assert list(store.iter_feedback("acme")) == []  # the orphan's text went with its document
    assert store.get_validation("acme", "val_same").generations is None
    # an old validation: accepted while nothing touched the document since it
    assert store.add_feedback("acme", "val_same", "same", 1, True, "ann", "text", "g1").relevant is True
    store.put_document("acme", "swapped", "b.pdf", 10, "/x/g2/b.pdf", "g2", replace_ready=True)
    store.set_status("acme", "swapped", "g2", "ready", pages=1, empty_pages=0, languages={"en": 1})
    with sqlite3.connect(path) as conn:  # the re-upload came after the validation
        conn.execute("UPDATE documents SET updated = '3000-01-01T00:00:00.000+00:00' WHERE document_id = 'swapped'")
    with pytest.raises(FeedbackRefused) as info:
        store.add_feedback("acme", "val_swapped", "swapped", 1, True, "ann", "new text", "g2")
    assert info.value.code == "document_changed"
    store.close()
