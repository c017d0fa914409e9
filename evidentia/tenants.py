"""Tenants share one search index. A tenant's document lives there under
``"{tenant}:{document_id}"``; the default tenant's under its plain id, so the
documents the CLI indexes without ``--tenant`` (and those `eval` or `dataset`
index) are the default tenant's, which an API key can be given
(`evidentia keys create --tenant default`). The API, the CLI and training all
name documents this way, so each sees exactly the documents the others wrote."""

from __future__ import annotations

DEFAULT_TENANT = "default"


def internal_id(tenant: str, document_id: str) -> str:
    """The id under which a tenant's document lives in the search backend. Neither
    part may contain ':' (see store.TENANT_RE / DOCUMENT_ID_RE), so it is unambiguous."""
    return document_id if tenant == DEFAULT_TENANT else f"{tenant}:{document_id}"


def split_internal_id(doc_id: str) -> tuple[str, str]:
    """(tenant, document id) of an index id; a plain id is the default tenant's."""
    tenant, sep, document_id = doc_id.partition(":")
    return (tenant, document_id) if sep and tenant and document_id else (DEFAULT_TENANT, doc_id)


def is_default_tenants(doc_id: str) -> bool:
    return ":" not in doc_id
