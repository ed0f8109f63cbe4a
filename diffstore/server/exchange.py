"""The request/response plumbing every route shares: bounded body reading, negotiation, off-loop work.

A route hands :func:`handle` a ``work`` function; ``handle`` reads the body under the route's limit
(refusing with 413 as soon as the declared or the streamed size passes it, without buffering the rest),
picks the codecs, and runs ``work`` -- parse, one engine call, serialize -- in a worker thread so that
neither LMDB nor the parsing of a 32 MiB body blocks the event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio.to_thread
from fastapi import Request, Response
from starlette.requests import ClientDisconnect

from diffstore.errors import InvalidRequest
from diffstore.server.config import Limit, ServerConfig
from diffstore.server.fastlane import read_body
from diffstore.server.negotiation import request_codec, response_codec
from diffstore.wire import Body, Codec

if TYPE_CHECKING:
    from diffstore.engine.store import Store


Loads = Callable[[bytes, Codec], Any]


@dataclass(frozen=True, slots=True)
class Exchange:
    """What ``work`` sees: the store, the decoded body (``None`` without one) and both codecs."""

    store: Store
    body: Any
    codec: Codec
    out: Codec


def decode_body(raw: bytes | None, codec: Codec, loads: Loads | None = None) -> Any:
    """The decoded body (by ``loads``, default the codec's own), ``None`` without one.

    Raises:
        InvalidJson: the body does not parse.
        InvalidRequest: the body is null (JSON ``null`` or msgpack nil): every body is an object.
    """
    if not raw:
        return None
    body = codec.loads(raw) if loads is None else loads(raw, codec)
    if body is None:
        raise InvalidRequest("body: expected an object, got null")
    return body


def store_of(request: Request) -> Store:
    return request.app.state.store  # type: ignore[no-any-return]


def config_of(request: Request) -> ServerConfig:
    return request.app.state.config  # type: ignore[no-any-return]


def respond(payload: bytes, codec: Codec) -> Response:
    return Response(payload, media_type=codec.content_type)


async def handle(
    request: Request,
    work: Callable[[Exchange], Body],
    limit: Limit | None = None,
    loads: Loads | None = None,
    columns: bool = False,
) -> Response:
    """Runs one route: body (when ``limit`` is given) -> ``work`` in a thread -> serialized response.

    ``loads(raw, codec)`` decodes the body when the codec's own way will not do (see putMany).
    ``columns``: the route answers the columns form when asked (``work`` renders it from ``x.out``).

    An empty body decodes as ``None``: request classes whose fields are all optional accept it, the
    others answer 400. A body that *is* null (JSON ``null``, msgpack nil) is a 400 everywhere (SPEC §2).
    """
    out = response_codec(request.headers.get("accept"), columns)
    store = store_of(request)
    raw: bytes | None = None
    codec = out
    if limit is not None:
        codec = request_codec(request.headers.get("content-type"))
        raw = await read_body(request.scope, request.receive, config_of(request).limit(limit))
        if raw is None:
            raise ClientDisconnect()  # the client left; Starlette sends nothing more

    def run() -> bytes:
        body = decode_body(raw, codec, loads)
        return out.dumps(work(Exchange(store, body, codec, out)))

    if raw is not None and len(raw) > config_of(request).large_body_bytes:
        # one large body at a time (ServerConfig.large_body_bytes): its parsed form is several times its size
        async with request.app.state.large_bodies:
            return respond(await anyio.to_thread.run_sync(run), out)
    return respond(await anyio.to_thread.run_sync(run), out)


async def call(request: Request, work: Callable[[Store], Any]) -> Any:
    """Runs ``work(store)`` in a worker thread (for routes that build their answer themselves)."""
    store = store_of(request)
    return await anyio.to_thread.run_sync(lambda: work(store))
