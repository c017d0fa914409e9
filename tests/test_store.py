"""evidentia/store.py: document ids and tenants."""

from __future__ import annotations

import pytest

from evidentia.store import DOCUMENT_ID_RE, TENANT_RE, document_id_for


@pytest.mark.parametrize("name, expected", [
    ("Annual Report (2023).pdf", "Annual-Report-2023"),
    ("Rapport_développement_durable 2023 (é).pdf", "Rapport_developpement_durable-2023-e"),
    ("reports/acme-2023.PDF", "acme-2023"),
    ("-a-.pdf", "a"),
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


@pytest.mark.parametrize("value", ["evil\n", "acme\n", "a\nb", "a b", "", "-a", "a:b", "é"])
def test_ids_and_tenants_hold_no_newline_or_foreign_character(value):
    assert not DOCUMENT_ID_RE.match(value) and not TENANT_RE.match(value)
