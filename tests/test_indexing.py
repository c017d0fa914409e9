"""api/indexing.py with the bounded extraction: re-uploads served from the previous
version until the new one is ready, failed re-indexes, cancellation on delete,
bounded attempts after restarts, hostile uploads failing with their reason and
nothing in the index. In-process (TestClient), small limits, seconds each."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from tests.utils import hostile_pdfs as H
from tests.utils.processes import running
from evidentia.tenants import internal_id
from evidentia.store import Store
from tests.utils.api import (
    assert_error, make_app, new_tenant, services_of, upload, validate, wait_indexed, wait_ready,
)

LIMITS = dict(extract_timeout_s=20, extract_memory_mb=400, max_page_content_mb=4, max_document_content_mb=40,
              max_page_chars=20_000)


def doc(client, h, document_id):
    r = client.get(f"/v1/documents/{document_id}", headers=h)
    assert r.status_code == 200, r.text
    return r.json()


def test_reupload_serves_the_previous_version_until_the_new_one_is_ready(tmp_path):
    v1 = H.real_report(tmp_path / "v1.pdf", pages=3)
    v2 = H.real_report(tmp_path / "v2.pdf", pages=8)
    with TestClient(make_app(tmp_path, **LIMITS)) as c:
        wait_ready(c)
        h = new_tenant(c)
        assert upload(c, h, v1, document_id="report").status_code == 202
        assert wait_indexed(c, h, "report")["pages"] == 3
        r = upload(c, h, v2, document_id="report")
        assert r.status_code == 202 and r.json() == {"document_id": "report", "status": "ready",
                                                     "reindex_status": "queued"}
        during = doc(c, h, "report")
        assert during["status"] == "ready" and during["pages"] == 3 and during["reindex_status"] in ("queued",
                                                                                                    "indexing")
        v = validate(c, h, ["report"])
        assert v.status_code == 200, v.text  # no 409 while re-indexing
        assert c.get("/v1/documents/report/pages/1", headers=h).status_code == 200
        after = wait_indexed(c, h, "report")
        assert after["pages"] == 8 and after["filename"] == "v2.pdf" and after["reindex_status"] is None
        assert c.get("/v1/documents/report/pages/8", headers=h).status_code == 200


def test_a_failed_reindex_keeps_the_served_version_and_says_why(tmp_path):
    v1 = H.real_report(tmp_path / "v1.pdf", pages=3)
    bomb = H.content_bomb(tmp_path / "bomb.pdf", inflated_mb=16)
    with TestClient(make_app(tmp_path, **LIMITS)) as c:
        wait_ready(c)
        h = new_tenant(c)
        upload(c, h, v1, document_id="report")
        wait_indexed(c, h, "report")
        services = services_of(c)
        tenant = services.store.authenticate(h["X-API-Key"]).tenant
        served = services.store.get_document(tenant, "report").file_path
        assert upload(c, h, bomb, document_id="report").status_code == 202
        after = wait_indexed(c, h, "report")
        assert after["status"] == "ready" and after["pages"] == 3 and after["filename"] == "v1.pdf"
        assert after["reindex_status"] == "failed"
        assert after["reindex_reason"] == ("report.pdf: page 1: its content inflates to more than 4 MB "
                                           "(EVIDENTIA_MAX_PAGE_CONTENT_MB)")
        assert validate(c, h, ["report"]).status_code == 200
        assert services.backend.get_page(internal_id(tenant, "report"), 1) is not None
        assert services.store.get_document(tenant, "report").file_path == served
        assert c.get("/v1/documents/report/pages/1.png?width=200", headers=h).status_code == 200


def test_hostile_uploads_fail_with_a_reason_and_leave_nothing_indexed(tmp_path):
    files = {
        "bomb": (H.content_bomb(tmp_path / "bomb.pdf", inflated_mb=32), "content inflates to more than 4 MB"),
        "shared": (H.shared_stream(tmp_path / "shared.pdf", pages=60, inflated_mb=1), "more than 40 MB"),
        "long": (H.long_page(tmp_path / "long.pdf", chars=40_000), "page 1: more than 20000 characters"),
        "random": (H.random_after_header(tmp_path / "random.pdf"), "corrupted PDF (its structure cannot be read"),
        "header": (H.header_only(tmp_path / "header.pdf"), "corrupted PDF (its structure cannot be read"),
        "html": (H.html_polyglot(tmp_path / "html.pdf"), "not a PDF (an HTML document"),
        "cut": (H.truncated(tmp_path / "cut.pdf"), "truncated"),
    }
    with TestClient(make_app(tmp_path, **LIMITS)) as c:
        wait_ready(c)
        h = new_tenant(c)
        services = services_of(c)
        tenant = services.store.authenticate(h["X-API-Key"]).tenant
        for name, (path, _) in files.items():
            assert upload(c, h, path, document_id=name).status_code == 202
        for name, (_, expected) in files.items():
            d = wait_indexed(c, h, name)
            assert d["status"] == "failed" and expected in d["reason"], (name, d)
            assert str(tmp_path) not in d["reason"] and "code=" not in d["reason"], d["reason"]
            assert services.backend.get_document(internal_id(tenant, name)) is None
            assert_error(c.get(f"/v1/documents/{name}/pages/1", headers=h), 409, "document_not_ready")


def test_delete_kills_the_running_extraction(tmp_path):
    spaces = H.spaces_bomb(tmp_path / "spaces.pdf", inflated_mb=512)  # seconds of parsing
    no_caps = dict(extract_timeout_s=120, max_page_content_mb=100_000, max_document_content_mb=100_000)
    with TestClient(make_app(tmp_path, **no_caps)) as c:
        wait_ready(c)
        h = new_tenant(c)
        services = services_of(c)
        upload(c, h, spaces, document_id="slow")
        deadline = time.monotonic() + 20
        while not services.worker.running_pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        [pid] = services.worker.running_pids()
        assert c.delete("/v1/documents/slow", headers=h).status_code == 204
        deadline = time.monotonic() + 5
        while running(pid):
            assert time.monotonic() < deadline, "the extraction still runs after the delete"
            time.sleep(0.05)
        assert services.worker.running_pids() == []


def test_a_document_interrupted_too_often_fails_instead_of_looping(tmp_path):
    data_dir = tmp_path / "api-data"
    store = Store(data_dir / "api.sqlite3")
    key = store.create_key("crashy").key
    folder = data_dir / "uploads" / "crashy" / "gen-1"
    folder.mkdir(parents=True)
    path = H.real_report(folder / "killer.pdf", pages=2)
    store.put_document("crashy", "killer", "killer.pdf", path.stat().st_size, str(path), "gen-1")
    for _ in range(3):  # three starts that each ended with the server dying
        assert store.begin_indexing("crashy", "killer", "gen-1") is not None
    store.close()
    with TestClient(make_app(tmp_path, index_max_attempts=3)) as c:
        d = wait_indexed(c, {"X-API-Key": key}, "killer")
        assert d["status"] == "failed"
        assert d["reason"] == ("killer.pdf: indexing was interrupted 3 times (the server stopped while it ran; "
                               "EVIDENTIA_INDEX_MAX_ATTEMPTS=3); upload the file again")


def test_a_version_1_store_is_upgraded_in_place(tmp_path):
    import sqlite3

    path = tmp_path / "old.sqlite3"
    Store(path).close()
    conn = sqlite3.connect(path)
    conn.executescript("DROP TABLE feedback; DROP TABLE documents; PRAGMA user_version=1;")
    conn.execute("CREATE TABLE documents (tenant TEXT NOT NULL, document_id TEXT NOT NULL, status TEXT NOT NULL, "
                 "reason TEXT, pages INTEGER, empty_pages INTEGER, languages TEXT NOT NULL DEFAULT '{}', "
                 "filename TEXT NOT NULL, size_bytes INTEGER NOT NULL, file_path TEXT NOT NULL, "
                 "generation TEXT NOT NULL, created TEXT NOT NULL, updated TEXT NOT NULL, "
                 "PRIMARY KEY (tenant, document_id))")
    conn.execute("INSERT INTO documents VALUES ('t', 'd', 'ready', NULL, 2, 0, '{}', 'd.pdf', 10, '/x/d.pdf', "
                 "'g', 'c', 'u')")
    conn.commit()
    conn.close()
    store = Store(path)
    row = store.get_document("t", "d")
    assert row.status == "ready" and row.attempts == 0 and row.next_generation is None
    store.close()


def test_a_pending_reupload_survives_a_restart(tmp_path):
    """A re-upload queued when the server stopped is indexed at the next start
    (its file is not swept as an orphan), and the ready version is served meanwhile."""
    v1 = H.real_report(tmp_path / "v1.pdf", pages=2)
    v2 = H.real_report(tmp_path / "v2.pdf", pages=5)
    with TestClient(make_app(tmp_path, **LIMITS)) as c:
        wait_ready(c)
        h = new_tenant(c, "restarted")
        upload(c, h, v1, document_id="report")
        assert wait_indexed(c, h, "report")["pages"] == 2
        store = services_of(c).store
    # as if the server stopped right after accepting the re-upload
    folder = tmp_path / "api-data" / "uploads" / "restarted" / "gen-next"
    folder.mkdir(parents=True)
    path = folder / "report.pdf"
    path.write_bytes(v2.read_bytes())
    store = Store(tmp_path / "api-data" / "api.sqlite3")
    row, superseded = store.put_document("restarted", "report", "v2.pdf", path.stat().st_size, str(path), "gen-next")
    assert row.status == "ready" and row.next_status == "queued" and superseded == []
    store.close()
    with TestClient(make_app(tmp_path, **LIMITS)) as c:
        d = wait_indexed(c, h, "report")
        assert d["pages"] == 5 and d["filename"] == "v2.pdf" and d["reindex_status"] is None


# --------------------------------------------------------------------------- PDFs found by document id


def test_pdfs_by_document_id_names_each_file_as_index_does(tmp_path):
    from evidentia.indexing import pdfs_by_document_id
    from evidentia.store import document_id_for

    names = ["acme-2023.pdf", "Rapport durabilité 2023 (Société Générale des Eaux).pdf", "sub/report.v2.PDF",
             "文档.pdf", "notes.txt"]
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"%PDF-1.4")
    found = pdfs_by_document_id([tmp_path])
    assert found == {document_id_for(name): tmp_path / name for name in names[:4]}
    assert set(found) == {"acme-2023", "Rapport-durabilite-2023-Societe-Generale-des-Eaux", "report.v2",
                          document_id_for("文档.pdf")}


def test_likely_pdf_names_the_file_a_query_means(tmp_path):
    from evidentia.indexing import likely_pdf, missing_pdfs_hint, pdfs_by_document_id

    for name in ("Nachhaltigkeitsbericht_Müller_Größe.pdf", "Rapport durabilité 2023.pdf", "AMCOR_2023Q4_10Q.pdf",
                 "文档.pdf"):
        (tmp_path / name).write_bytes(b"%PDF-1.4")
    pdfs = pdfs_by_document_id([tmp_path])
    # the file's stem, or what its id is made from: surely that file
    assert likely_pdf("Nachhaltigkeitsbericht_Müller_Größe", pdfs) == \
        ("Nachhaltigkeitsbericht_Muller_Grosse", tmp_path / "Nachhaltigkeitsbericht_Müller_Größe.pdf", True)
    assert likely_pdf("Rapport durabilite 2023", pdfs)[0] == "Rapport-durabilite-2023"
    assert likely_pdf("文档", pdfs)[1] == tmp_path / "文档.pdf"
    # another case, a typo: the closest, not surely
    assert likely_pdf("amcor_2023q4_10q", pdfs) == ("AMCOR_2023Q4_10Q", tmp_path / "AMCOR_2023Q4_10Q.pdf", False)
    assert likely_pdf("AMCOR_2023Q4_10K", pdfs)[0] == "AMCOR_2023Q4_10Q"
    assert likely_pdf("tesla-2022", pdfs) is None
    # a name's id from before it got its hash's digits (README, document ids): surely that file
    (tmp_path / "Отчёт_2023.pdf").write_bytes(b"%PDF-1.4")
    assert likely_pdf("2023", pdfs_by_document_id([tmp_path])) == ("2023-9293ec27", tmp_path / "Отчёт_2023.pdf", True)
    assert missing_pdfs_hint(["tesla-2022"], [tmp_path]) == ""
    hint = missing_pdfs_hint(["tesla-2022", "Rapport durabilité 2023"], [tmp_path])
    assert hint == ("; a query names a PDF by its document id, the file name as `evidentia index` makes it: "
                    f"Rapport durabilité 2023 is {tmp_path / 'Rapport durabilité 2023.pdf'}, whose id is "
                    "Rapport-durabilite-2023")


def test_no_hint_names_a_file_by_the_id_it_already_has(tmp_path):
    """A file of that very id is missing because it failed to index (its error is said
    above the hint): 'X is X.pdf, whose id is X' would say nothing."""
    from evidentia.indexing import missing_pdfs_hint

    (tmp_path / "broken.pdf").write_bytes(b"not a pdf")
    assert missing_pdfs_hint(["broken"], [tmp_path]) == ""
