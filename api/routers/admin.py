"""API keys, managed with the admin key (EVIDENTIA_ADMIN_KEY)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path as PathParam, Response
from fastapi.concurrency import run_in_threadpool

from evidentia.api.deps import get_services, require_admin
from evidentia.api.errors import ApiError, errors
from evidentia.api.schemas import KeyCreate, KeyCreated, KeyInfo, KeyList
from evidentia.api.services import Services

router = APIRouter(prefix="/v1/admin", tags=["admin"], dependencies=[Depends(require_admin)])


@router.post("/keys", status_code=201, response_model=KeyCreated, summary="Create an API key for a tenant",
             description="The key is in this answer only; the server keeps a salted hash.",
             responses=errors(400, 401, 403, 415, 422))
async def create_key(body: KeyCreate, services: Services = Depends(get_services)) -> KeyCreated:
    new = await run_in_threadpool(services.store.create_key, body.tenant)
    return KeyCreated(key_id=new.info.key_id, tenant=new.info.tenant, created=new.info.created, key=new.key)


@router.get("/keys", response_model=KeyList, summary="List API keys (never the keys themselves)",
            responses=errors(401, 403))
def list_keys(services: Services = Depends(get_services)) -> KeyList:
    return KeyList(keys=[KeyInfo(key_id=k.key_id, tenant=k.tenant, created=k.created)
                         for k in services.store.list_keys()])


@router.delete("/keys/{key_id}", status_code=204, response_class=Response, summary="Revoke an API key",
               responses=errors(401, 403, 404))
def delete_key(key_id: str = PathParam(..., description="The key_id of the key."),
               services: Services = Depends(get_services)) -> Response:
    if not services.store.delete_key(key_id):
        raise ApiError(404, "key_not_found", f"no API key with id {key_id!r}", {"key_id": key_id})
    return Response(status_code=204)
