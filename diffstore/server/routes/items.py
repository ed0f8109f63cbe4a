"""Point reads and writes: ``get``, ``getKeysAround``, ``put`` and ``putMany``."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from diffstore.server import schemas
from diffstore.server.config import Limit
from diffstore.server.exchange import Exchange, handle
from diffstore.server.routing import route
from diffstore.wire import Body, get_result_to_wire, keys_around_to_wire, put_result_to_wire
from diffstore.wire_requests import GetRequest, KeysAroundRequest, PutManyRequest, PutRequest

router = APIRouter(tags=["items"])


@route(router, "POST", "/collections/{c}/get", body=schemas.GetItem, answer=schemas.GetResponse)
async def get(request: Request, c: str) -> Response:
    def work(x: Exchange) -> Body:
        req = GetRequest.from_wire(x.body, x.codec)
        result = x.store.collection(c).get_result(
            req.key, generation_id=req.at.generation_id, phantom_id=req.at.phantom_id
        )
        return get_result_to_wire(result, x.out)

    return await handle(request, work, Limit.OTHER)


@route(
    router,
    "POST",
    "/collections/{c}/getKeysAround",
    body=schemas.KeysAroundRequest,
    answer=schemas.KeysAroundResponse,
)
async def get_keys_around(request: Request, c: str) -> Response:
    def work(x: Exchange) -> Body:
        req = KeysAroundRequest.from_wire(x.body, x.codec)
        result = x.store.collection(c).keys_around(
            req.key,
            req.limit,
            require_key_existence=req.require_key_existence,
            generation_id=req.at.generation_id,
            phantom_id=req.at.phantom_id,
        )
        return keys_around_to_wire(result, x.out)

    return await handle(request, work, Limit.OTHER)


@route(router, "POST", "/collections/{c}/put", body=schemas.PutRequest, answer=schemas.PutResponse)
async def put(request: Request, c: str) -> Response:
    def work(x: Exchange) -> Body:
        req = PutRequest.from_wire(x.body, x.codec)
        key, value, if_not_present = req.item
        result = x.store.collection(c).put(key, value, if_not_present=if_not_present, **req.options.kwargs())
        return put_result_to_wire(result, x.out)

    return await handle(request, work, Limit.PUT)


@route(router, "POST", "/collections/{c}/putMany", body=schemas.PutManyRequest, answer=schemas.PutResponse)
async def put_many(request: Request, c: str) -> Response:
    def work(x: Exchange) -> Body:
        req = PutManyRequest.from_wire(x.body, x.codec)
        result = x.store.collection(c).put_many(req.items, **req.options.kwargs())
        body = put_result_to_wire(result, x.out)
        del body["wasPut"]  # SPEC §3: putMany answers {generationId, skipped?}
        return body

    return await handle(request, work, Limit.PUT_MANY)
