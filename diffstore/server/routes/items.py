"""Point reads and writes: ``get``, ``getMany`` (beyond SPEC), ``getKeysAround``, ``put`` and ``putMany``.

``get`` is served in the fast lane (:mod:`diffstore.server.fastlane`) by :func:`serve_get`, with its
engine call on the event loop: a point read takes microseconds, less than the hop to a worker thread.
Only an answer whose value is over ``INLINE_MAX_BYTES`` is encoded in a worker thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio.to_thread
from fastapi import APIRouter, Request, Response

from diffstore.errors import DiffstoreError
from diffstore.server import schemas
from diffstore.server.config import Limit
from diffstore.server.exchange import Exchange, decode_body, handle
from diffstore.server.fastlane import INLINE_MAX_BYTES, header, read_body, send_body, send_error
from diffstore.server.negotiation import request_codec, response_codec
from diffstore.server.routing import route
from diffstore.server.scopes import TokenScope
from diffstore.server.synchronous import synchronous_of
from diffstore.wire import (
    Body,
    get_many_result_to_wire,
    get_result_to_wire,
    keys_around_to_wire,
    put_result_to_wire,
)
from diffstore.wire_items import decode_put_many
from diffstore.wire_requests import (
    GetManyRequest,
    GetRequest,
    KeysAroundRequest,
    PutManyRequest,
    PutRequest,
)

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

    from diffstore.engine.types import PutResult
    from diffstore.server.fastlane import FastLane

router = APIRouter(tags=["items"])


@route(
    router,
    "POST",
    "/collections/{c}/get",
    body=schemas.GetItem,
    answer=schemas.GetResponse,
    scope=TokenScope.READ,
)
async def get(c: str) -> Response:
    """Documents the endpoint; every POST is answered by :func:`serve_get` in the fast lane."""
    raise RuntimeError("get is served in the fast lane, which create_app installs")


async def serve_get(lane: FastLane, collection: str, scope: Scope, receive: Receive, send: Send) -> None:
    """``get``: parse, one point read, serialize -- on the event loop unless the value is large."""
    out = response_codec(header(scope, b"accept"))
    try:
        codec = request_codec(header(scope, b"content-type"))
        raw = await read_body(scope, receive, lane.config.limit(Limit.OTHER))
        if raw is None:
            return  # the client left
        req = GetRequest.from_wire(decode_body(raw, codec), codec)
        await lane.step_aside()  # while a writer thread of this process changes pages (see fastlane)
        result = req.run(lane.store.collection(collection))
        if result.record is not None and len(result.record.value) > INLINE_MAX_BYTES:
            payload = await anyio.to_thread.run_sync(lambda: out.dumps(get_result_to_wire(result, out)))
        else:
            payload = out.dumps(get_result_to_wire(result, out))
    except DiffstoreError as exc:
        await send_error(send, exc, out, scope)
        return
    await send_body(send, payload, out)


@route(
    router,
    "POST",
    "/collections/{c}/getMany",
    body=schemas.GetMany,
    answer=schemas.GetManyResponse,
    columns=schemas.GetManyColumnsResponse,
    summary="(beyond SPEC) the records of up to 10,000 keys at one generation, in the order asked",
    scope=TokenScope.READ,
)
async def get_many(request: Request, c: str) -> Response:
    # put's body limit (4 MiB), not the 64 KiB of other routes: 10,000 keys must fit
    def work(x: Exchange) -> Body:
        result = GetManyRequest.from_wire(x.body, x.codec).run(x.store.collection(c))
        return get_many_result_to_wire(result, x.out)

    return await handle(request, work, Limit.PUT, columns=True)


@route(
    router,
    "POST",
    "/collections/{c}/getKeysAround",
    body=schemas.GetKeysAround,
    answer=schemas.KeysAroundResponse,
    scope=TokenScope.READ,
)
async def get_keys_around(request: Request, c: str) -> Response:
    def work(x: Exchange) -> Body:
        result = KeysAroundRequest.from_wire(x.body, x.codec).run(x.store.collection(c))
        return keys_around_to_wire(result, x.out)

    return await handle(request, work, Limit.OTHER)


@route(
    router,
    "POST",
    "/collections/{c}/put",
    body=schemas.PutOne,
    answer=schemas.PutResponse,
    scope=TokenScope.WRITE,
)
async def put(request: Request, c: str) -> Response:
    synchronous = synchronous_of(request)
    written: list[bytes] = []

    def work(x: Exchange) -> Body:
        req = PutRequest.from_wire(x.body, x.codec)
        result = req.run(x.store.collection(c))
        if synchronous.enabled:
            written.extend(_automatic_generation(x, c, req.options.phantom_id, result))
        return put_result_to_wire(result, x.out)

    response = await handle(request, work, Limit.PUT)
    for generation_id in written:  # its generation commits by itself; the replicas then apply it
        await synchronous.wait(c, generation_id)
    return response


@route(
    router,
    "POST",
    "/collections/{c}/putMany",
    body=schemas.PutMany,
    answer=schemas.PutResponse,
    scope=TokenScope.WRITE,
)
async def put_many(request: Request, c: str) -> Response:
    synchronous = synchronous_of(request)
    written: list[bytes] = []

    def work(x: Exchange) -> Body:
        req = PutManyRequest.from_wire(x.body, x.codec)
        result = req.run(x.store.collection(c))
        if synchronous.enabled:
            written.extend(_automatic_generation(x, c, req.options.phantom_id, result))
        body = put_result_to_wire(result, x.out)
        del body["wasPut"]  # SPEC §3: putMany answers {generationId, skipped?}
        return body

    response = await handle(request, work, Limit.PUT_MANY, decode_put_many)
    for generation_id in written:
        await synchronous.wait(c, generation_id)
    return response


def _automatic_generation(x: Exchange, c: str, phantom_id: bytes | None, result: PutResult) -> list[bytes]:
    """The generation a write must see replicated before it is acknowledged (``serve --synchronous``): an
    automatic collection's open generation when records went into it; none for a manual collection (its
    commit waits), a phantom (never replicated) or a write that wrote nothing (skipped, if-not-present)."""
    if phantom_id is not None or not result.records or x.store.collection(c).manual:
        return []
    return [result.generation_id]
