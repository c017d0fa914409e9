"""evidentia/store.py: document ids and tenants."""

from __future__ import annotations

import pytest

from evidentia.store import DOCUMENT_ID_RE, TENANT_RE, closest_document_id, document_id_for


@pytest.mark.parametrize("name, expected", [
    ("Annual Report (2023).pdf", "Annual-Report-2023"),
    ("Rapport_développement_durable 2023 (é).pdf", "Rapport_developpement_durable-2023-e"),
    ("reports/acme-2023.PDF", "acme-2023"),
    ("-a-.pdf", "a"),
    ("Nachhaltigkeitsbericht_Müller_Größe.pdf", "Nachhaltigkeitsbericht_Muller_Grosse"),
    ("Œuvre_cœur.pdf", "OEuvre_coeur"),
    ("Łódź_raport.pdf", "Lodz_raport"),
])
def test_a_files_document_id_keeps_its_readable_name(name, expected):
    assert document_id_for(name) == expected and DOCUMENT_ID_RE.match(expected)


def test_names_without_a_usable_character_get_distinct_ids():
    """Two Chinese file names both became `document`, and the second file replaced the first."""
    first, second = document_id_for("文档.pdf"), document_id_for("报告.pdf")
    assert first != second and first.startswith("document-") and second.startswith("document-")
    assert document_id_for("文档.pdf") == first  # the same name, the same id (indexing it again replaces it)
    assert all(DOCUMENT_ID_RE.match(i) for i in (first, second))
    assert len(document_id_for("a" * 300 + ".pdf")) == 128


def test_long_names_that_differ_past_an_ids_length_get_distinct_ids():
    """Two 130-character names differing in their last letters both became the same
    126-character id: the second upload silently replaced the first."""
    prefix = "Group_Sustainability_Report_2023_Consolidated_Non_Financial_Statement_and_Annex_" * 2
    part_a, part_b = document_id_for(prefix + "_Part_A.pdf"), document_id_for(prefix + "_Part_B.pdf")
    assert part_a != part_b and len(part_a) == len(part_b) == 128
    assert part_a.startswith(prefix[:100]) and DOCUMENT_ID_RE.match(part_a) and DOCUMENT_ID_RE.match(part_b)
    assert document_id_for(prefix + "_Part_A.pdf") == part_a
    assert len({document_id_for("b" * n + ".pdf") for n in (200, 255, 300)}) == 3
    assert document_id_for("c" * 128 + ".pdf") == "c" * 128  # a name that fits stays as it is


@pytest.mark.parametrize("value", ["evil\n", "acme\n", "a\nb", "a b", "", "-a", "a:b", "é"])
def test_ids_and_tenants_hold_no_newline_or_foreign_character(value):
    assert not DOCUMENT_ID_RE.match(value) and not TENANT_RE.match(value)


def test_names_that_lose_letters_without_an_ascii_form_get_distinct_ids():
    """`Отчёт_2023.pdf` and `Έκθεση_2023.pdf` both became `2023`, and `Søren_Ørsted.pdf` and
    `Sren_rsted.pdf` shared an id: the second upload silently replaced the first."""
    russian, greek = document_id_for("Отчёт_2023.pdf"), document_id_for("Έκθεση_2023.pdf")
    chinese_a, chinese_b = document_id_for("文档 2023.pdf"), document_id_for("报告 2023.pdf")
    assert len({russian, greek, chinese_a, chinese_b}) == 4
    assert all(i.startswith("2023-") and len(i) == 13 and DOCUMENT_ID_RE.match(i)
               for i in (russian, greek, chinese_a, chinese_b))
    assert document_id_for("Отчёт_2023.pdf") == russian  # the same name, the same id
    assert document_id_for("Søren_Ørsted.pdf") == "Soren_Orsted" != document_id_for("Sren_rsted.pdf")
    # symbols too: "report 🌱" and "report 🌍" were both "report"
    assert len({document_id_for("report 🌱.pdf"), document_id_for("report 🌍.pdf"), document_id_for("report.pdf")}) == 3
    assert len(document_id_for("Отчёт" + "a" * 300 + ".pdf")) == 128


def test_an_uploads_file_is_found_in_the_data_dir_the_store_is_opened_in(tmp_path):
    """Absolute paths tied a data dir to where it was written: its copy served the
    original's files, swept its own away and deleted the original's."""
    import shutil
    import sqlite3

    from evidentia.store import Store, store_path, uploads_dir

    original = tmp_path / "a"
    pdf = uploads_dir(original) / "acme" / "g1" / "report.pdf"
    pdf.parent.mkdir(parents=True)
    pdf.write_bytes(b"%PDF-1.7")
    store = Store(store_path(original))
    store.add_tenant("acme")
    store.put_document("acme", "report", "report.pdf", 8, str(pdf), "g1")
    assert store.get_document("acme", "report").file_path == str(pdf)
    raw = sqlite3.connect(store_path(original)).execute("SELECT file_path FROM documents").fetchone()[0]
    assert raw == "uploads/acme/g1/report.pdf"  # relative to the data dir

    copy = tmp_path / "b"
    shutil.copytree(original, copy)
    assert Store(store_path(copy)).get_document("acme", "report").file_path == str(
        uploads_dir(copy) / "acme" / "g1" / "report.pdf")

    # a row written before, with the absolute path of the dir it was written in
    with sqlite3.connect(store_path(copy)) as conn:
        conn.execute("UPDATE documents SET file_path = ?", (str(pdf),))
    assert Store(store_path(copy)).get_document("acme", "report").file_path == str(
        uploads_dir(copy) / "acme" / "g1" / "report.pdf")


def test_a_tenant_named_uploads_keeps_its_files(tmp_path):
    """Rebased after the last "uploads" folder, an old row of tenant "uploads" lost its
    tenant, and the start-up sweep removed the real folder."""
    import sqlite3

    from evidentia.store import Store, store_path, uploads_dir

    data = tmp_path / "d"
    pdf = uploads_dir(data) / "uploads" / "g1" / "x.pdf"
    store = Store(store_path(data))
    store.add_tenant("uploads")
    store.put_document("uploads", "x", "x.pdf", 8, str(pdf), "g1")
    with sqlite3.connect(store_path(data)) as conn:  # as written before: absolute
        conn.execute("UPDATE documents SET file_path = ?", (str(pdf),))
    assert Store(store_path(data)).get_document("uploads", "x").file_path == str(pdf)


def test_the_closest_document_id_is_one_rule_for_every_command():
    """`eval` named the closest file of a mistyped id; `search` and `page` named none
    (`3M_2018_10k` for `3M_2018_10K`): one function now says it for all."""
    ids = ["3M_2018_10K", "AMCOR_2023Q4_10Q", "Rapport-durabilite-2023"]
    assert closest_document_id("3M_2018_10k", ids) == "3M_2018_10K"
    assert closest_document_id("AMCOR_2023Q4_10K", ids) == "AMCOR_2023Q4_10Q"
    assert closest_document_id("Rapport durabilité 2023", ids) == "Rapport-durabilite-2023"  # read as its id
    assert closest_document_id("tesla-2022", ids) is None and closest_document_id("3M_2018_10k", []) is None
