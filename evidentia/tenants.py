"""Tenants share one search index: a tenant's document lives there under
``"{tenant}:{document_id}"``. The API, the CLI (``--tenant``) and training all
name documents this way, so each sees exactly the documents the others wrote."""

from __future__ import annotations


def internal_id(tenant: str, document_id: str) -> str:
    """The id under which a tenant's document lives in the search backend. Neither
    part may contain ':' (see store.TENANT_RE / DOCUMENT_ID_RE), so it is unambiguous."""
    return f"{tenant}:{document_id}"


def split_internal_id(doc_id: str) -> tuple[str, str] | None:
    tenant, sep, document_id = doc_id.partition(":")
    return (tenant, document_id) if sep and tenant and document_id else None
