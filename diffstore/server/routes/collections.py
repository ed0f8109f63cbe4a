"""``/collections/``: list, create, describe and delete collections."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request, Response

from diffstore.server import audit, schemas
from diffstore.server.auth import require
from diffstore.server.config import Limit
from diffstore.server.exchange import Exchange, handle
from diffstore.server.routing import route
from diffstore.server.scopes import TokenScope
from diffstore.wire import Body, CollectionState, retention_from_wire, retention_to_wire
from diffstore.wire_requests import CreateCollectionRequest

router = APIRouter(tags=["collections"])
_FIELDS = ("generationId", "nextGenerationId", "retention")


@route(
    router,
    "GET",
    "/collections/",
    answer=schemas.CollectionList,
    summary="List collections by name",
    scope=TokenScope.READ,
)
async def list_collections(request: Request) -> Response:
    def work(x: Exchange) -> Body:
        return {"items": [{"name": c.name, "isManual": c.manual} for c in x.store.collections()]}

    return await handle(request, work)


@route(
    router,
    "POST",
    "/collections/",
    body=schemas.CreateCollection,
    answer=schemas.GenerationIdResponse,
    scope=TokenScope.ADMIN,
    audit="createCollection",
    collection_in_body=True,
)
async def create_collection(request: Request) -> Response:
    def work(x: Exchange) -> Body:
        req = CreateCollectionRequest.from_wire(x.body, x.codec)
        audit.note(request.scope, collection=req.collection_name)
        # the name is in the body: an admin token of a narrower glob is checked here, before anything
        require(request.scope, TokenScope.ADMIN, req.collection_name, "creating a collection")
        c = x.store.create_collection(
            req.collection_name,
            manual=req.manual,
            initial_generation_id=req.initial_generation_id if req.manual else None,
            retention=req.retention,
        )
        return {"generationId": x.out.es(c.generation_id)}

    return await handle(request, work, Limit.CREATE_COLLECTION)


@route(
    router,
    "GET",
    "/collections/{c}",
    answer=schemas.CollectionStateResponse,
    summary="Current and next generation",
    scope=TokenScope.READ,
)
async def get_collection(
    request: Request,
    c: str,
    fields: str | None = Query(None, description="comma-separated: generationId,nextGenerationId,retention"),
) -> Response:
    wanted = _FIELDS if fields is None else tuple(f for f in _FIELDS if f in fields.split(","))

    def work(x: Exchange) -> Body:
        collection = x.store.collection(c)
        state = CollectionState(
            collection.manual,
            collection.generation_id,
            collection.next_generation_id,
            wanted,
            collection.retention(),
        )
        return state.to_wire(x.out)

    return await handle(request, work)


@route(
    router,
    "PUT",
    "/collections/{c}/retention",
    body=schemas.Retention,
    answer=schemas.RetentionResponse,
    summary="Replace the retention policy ({} removes it)",
    scope=TokenScope.ADMIN,
    audit="setRetention",
)
async def put_retention(request: Request, c: str) -> Response:
    def work(x: Exchange) -> Body:
        policy = retention_from_wire(x.body, x.codec, "")
        return {"retention": retention_to_wire(x.store.collection(c).set_retention(policy))}

    return await handle(request, work, Limit.OTHER)


@route(
    router,
    "GET",
    "/collections/{c}/retention",
    answer=schemas.RetentionResponse,
    summary="The retention policy",
    scope=TokenScope.READ,
)
async def get_retention(request: Request, c: str) -> Response:
    def work(x: Exchange) -> Body:
        return {"retention": retention_to_wire(x.store.collection(c).retention())}

    return await handle(request, work)


@route(
    router,
    "DELETE",
    "/collections/{c}",
    summary="Delete a collection and every reader targeting it",
    scope=TokenScope.ADMIN,
    audit="deleteCollection",
)
async def delete_collection(request: Request, c: str) -> Response:
    def work(x: Exchange) -> Body:
        x.store.delete_collection(c)
        return {}

    return await handle(request, work)
