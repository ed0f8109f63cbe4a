"""``generationId/stream``: long-poll until a collection's current generation differs from a given one.

GET is served in the fast lane (:mod:`diffstore.server.fastlane`): one commit may have to answer
thousands of waiters at once. :func:`serve_stream` parses the query itself, registers a
:class:`~diffstore.server.longpoll.Waiter` with the app's :class:`~diffstore.server.longpoll.CommitHub`,
reads the current generation on the event loop and then awaits ``receive()``, which returns once the hub
has sent the answer or the client has gone -- or, under ``diffstore serve``, parks the request and
returns at once (the hub writes the answer to the held connection; see :mod:`diffstore.server.longpoll`).
No thread and no extra task per waiter; a client that goes away frees its waiter at once. The FastAPI
route below only documents the endpoint.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Literal
from urllib.parse import parse_qsl

from fastapi import APIRouter, Query, Response

from diffstore.errors import DiffstoreError, InvalidRequest
from diffstore.server import schemas
from diffstore.server.fastlane import header, send_error
from diffstore.server.longpoll import (
    PARKED,
    RAW_SEND,
    REQUEST_STARTED,
    Answer,
    CommitHub,
    Waiter,
    encode_answer,
)
from diffstore.server.negotiation import response_codec
from diffstore.server.routing import route
from diffstore.server.scopes import TokenScope
from diffstore.wire import decode_es

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

    from diffstore.server.config import ServerConfig
    from diffstore.server.fastlane import FastLane

router = APIRouter(tags=["collections"])
MAX_TIMEOUT_MS = 300_000


@route(
    router,
    "GET",
    "/collections/{c}/generationId/stream",
    answer=schemas.GenerationIdResponse,
    summary="Long-poll for a new generation",
    scope=TokenScope.READ,
)
async def stream_generation(
    c: str,
    generationId: str | None = Query(None, description="answer once the current generation differs"),  # noqa: N803
    generationIdEncoding: Literal["utf8", "base64"] = Query("utf8"),  # noqa: N803
    timeoutMs: int | None = Query(None, ge=0, le=MAX_TIMEOUT_MS, description="default 60000"),  # noqa: N803
) -> Response:
    """Documents the endpoint; every GET is answered by :func:`serve_stream` in the fast lane."""
    raise RuntimeError("generationId/stream is served in the fast lane, which create_app installs")


def parse_query(query_string: bytes, config: ServerConfig) -> tuple[bytes | None, int]:
    """The given generation id (``None`` without one) and the timeout in ms, as the route documents them.

    Raises:
        InvalidRequest: a malformed or out-of-range ``timeoutMs``, or an unknown ``generationIdEncoding``.
        InvalidEncoding: a ``generationId`` that is not valid in its encoding.
    """
    params = dict(parse_qsl(query_string.decode("latin-1"), keep_blank_values=True))  # the last one wins
    raw_timeout = params.get("timeoutMs")
    if raw_timeout is None:
        timeout_ms = config.long_poll_default_ms
    else:
        try:
            timeout_ms = int(raw_timeout)
        except ValueError:
            raise InvalidRequest(f"timeoutMs: expected an integer, got {raw_timeout!r}") from None
        if not 0 <= timeout_ms <= MAX_TIMEOUT_MS:
            raise InvalidRequest(f"timeoutMs: must be within 0..{MAX_TIMEOUT_MS}, got {timeout_ms}")
        timeout_ms = min(timeout_ms, config.long_poll_max_ms)
    encoding = params.get("generationIdEncoding", "utf8")
    if encoding not in ("utf8", "base64"):
        raise InvalidRequest(f"generationIdEncoding: expected 'utf8' or 'base64', got {encoding!r}")
    value = params.get("generationId")
    given = None if value is None else decode_es({"value": value, "encoding": encoding}, "generationId")
    return given, timeout_ms


async def send_answer(send: Send, answer: Answer) -> None:
    await send(answer[0])
    await send(answer[1])


async def serve_stream(lane: FastLane, collection: str, scope: Scope, receive: Receive, send: Send) -> None:
    """The long poll of ``collection``: answers at once, or registers a waiter and waits."""
    out = response_codec(header(scope, b"accept"))
    hub = lane.hub
    waiter = None
    try:
        given, timeout_ms = parse_query(scope["query_string"], lane.config)
        if given is not None:
            waiter = Waiter(collection, given, out, send, scope.get(RAW_SEND), scope.get(REQUEST_STARTED))
            if not hub.add(waiter):  # shutting down: answer with what is current now
                waiter = None
        # after registering (see the hub's invariants); a point read, done on the event loop
        current = lane.store.collection(collection).generation_id
    except BaseException as exc:
        if waiter is not None:
            hub.discard(waiter)
        if not isinstance(exc, DiffstoreError):
            raise
        await send_error(send, exc, out, scope)
        return
    if waiter is None or current != given:
        if waiter is not None:
            waiter.answered = True
            hub.discard(waiter)
        await send_answer(send, encode_answer(current, out))
        return
    waiter.timer = asyncio.get_running_loop().call_later(timeout_ms / 1000, hub.expire, waiter)
    if waiter.park(hub):
        scope[PARKED] = True
        return
    await wait(hub, waiter, receive)


async def wait(hub: CommitHub, waiter: Waiter, receive: Receive) -> None:
    """Returns once ``waiter`` (its timer armed) is answered (its response complete) or its client is gone."""
    waiter.task = asyncio.current_task()
    assert waiter.timer is not None
    try:
        # the first receive() hands over the (empty) request body; the next one returns
        # http.disconnect once the response is complete or the connection is closed
        while (await receive())["type"] != "http.disconnect":
            pass
    except asyncio.CancelledError:
        if waiter.error is None:
            raise
        raise waiter.error from None  # sending the answer failed: the server logs it
    finally:
        waiter.timer.cancel()
        if not waiter.answered:  # the client went away first
            waiter.answered = True
            hub.discard(waiter)
