"""``generationId/stream``: long-poll until a collection's current generation differs from a given one.

GET is served by :class:`StreamEndpoint`, a raw ASGI layer in front of FastAPI's router (inside the
authentication), because one commit may have to answer thousands of waiters at once and FastAPI's
per-request machinery (Request and Response objects, parameter validation, exception handling) costs
tens of microseconds per answer. The layer parses the query itself, registers a
:class:`~diffstore.server.longpoll.Waiter` with the app's :class:`~diffstore.server.longpoll.CommitHub`,
reads the current generation on the event loop (one LMDB point read: microseconds, never waits on a lock)
and then awaits ``receive()``, which returns once the hub has sent the answer or the client has gone.
No thread and no extra task per waiter; a client that goes away frees its waiter at once.

The FastAPI route below documents the endpoint in ``/openapi.json``; other methods reach the router,
which answers 405.
"""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING, Literal
from urllib.parse import parse_qsl

from fastapi import APIRouter, Query, Response

from diffstore.errors import DiffstoreError, InvalidRequest
from diffstore.server import schemas
from diffstore.server.errors import encode_error
from diffstore.server.longpoll import Answer, CommitHub, Waiter, encode_answer
from diffstore.server.negotiation import response_codec
from diffstore.server.routing import route
from diffstore.wire import Codec, decode_es

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from diffstore.engine.store import Store
    from diffstore.server.config import ServerConfig

router = APIRouter(tags=["collections"])
PATH = re.compile(r"/collections/([^/]+)/generationId/stream/?")
MAX_TIMEOUT_MS = 300_000


@route(
    router,
    "GET",
    "/collections/{c}/generationId/stream",
    answer=schemas.GenerationIdResponse,
    summary="Long-poll for a new generation",
)
async def stream_generation(
    c: str,
    generationId: str | None = Query(None, description="answer once the current generation differs"),  # noqa: N803
    generationIdEncoding: Literal["utf8", "base64"] = Query("utf8"),  # noqa: N803
    timeoutMs: int | None = Query(None, ge=0, le=MAX_TIMEOUT_MS, description="default 60000"),  # noqa: N803
) -> Response:
    """Documents the endpoint; every GET is answered by :class:`StreamEndpoint` before the router."""
    raise RuntimeError("generationId/stream is served by StreamEndpoint, which create_app installs")


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


async def send_error(send: Send, exc: DiffstoreError, codec: Codec, path: str) -> None:
    status, body = encode_error(exc, codec, "GET", path)
    headers = [(b"content-type", codec.content_type.encode()), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def route_path(scope: Scope) -> str:
    """The path without the app's ``root_path`` (as Starlette's router matches it)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] == "/":
        return path[len(root) :]
    return path


class StreamEndpoint:
    """Answers ``GET /collections/{c}/generationId/stream[/]``; passes every other request to ``app``."""

    def __init__(self, app: ASGIApp, store: Store, config: ServerConfig, hub: CommitHub) -> None:
        self.app = app
        self.store = store
        self.config = config
        self.hub = hub

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET":
            match = PATH.fullmatch(route_path(scope))
            if match is not None:
                await self.serve(match.group(1), scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def serve(self, collection: str, scope: Scope, receive: Receive, send: Send) -> None:
        accept = None
        for name, value in scope["headers"]:
            if name == b"accept":
                accept = value.decode("latin-1")
        out = response_codec(accept)
        waiter = None
        try:
            given, timeout_ms = parse_query(scope["query_string"], self.config)
            if given is not None:
                waiter = Waiter(collection, given, out, send)
                if not self.hub.add(waiter):  # shutting down: answer with what is current now
                    waiter = None
            # after registering (see the hub's invariants); a point read, done on the event loop
            current = self.store.collection(collection).generation_id
        except DiffstoreError as exc:
            if waiter is not None:
                self.hub.discard(waiter)
            await send_error(send, exc, out, scope["path"])
            return
        if waiter is None or current != given:
            if waiter is not None:
                waiter.answered = True
                self.hub.discard(waiter)
            await send_answer(send, encode_answer(current, out))
            return
        await self.wait(waiter, timeout_ms, receive)

    async def wait(self, waiter: Waiter, timeout_ms: int, receive: Receive) -> None:
        """Returns once ``waiter`` is answered (its response complete) or its client is gone."""
        waiter.task = asyncio.current_task()
        waiter.timer = asyncio.get_running_loop().call_later(timeout_ms / 1000, self.hub.expire, waiter)
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
                self.hub.discard(waiter)
