"""``generationId/stream``: long-poll until a collection's current generation differs from a given one.

The waiter is a future of the app's :class:`~diffstore.server.longpoll.CommitHub` (no thread per
waiter). While it waits, a task watches the connection so that a client that goes away frees its
waiter at once instead of at the timeout.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from fastapi import APIRouter, Query, Request, Response

from diffstore.server import schemas
from diffstore.server.exchange import call, config_of, respond
from diffstore.server.longpoll import CommitHub
from diffstore.server.negotiation import response_codec
from diffstore.server.routing import route
from diffstore.wire import decode_es, generation_to_wire

router = APIRouter(tags=["collections"])


def _settle(future: asyncio.Future[bytes | None]) -> None:
    if not future.done():
        future.set_result(None)


async def _settle_on_disconnect(request: Request, future: asyncio.Future[bytes | None]) -> None:
    """Settles ``future`` when the client closes the connection (the request has no body left to read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    _settle(future)


@route(
    router,
    "GET",
    "/collections/{c}/generationId/stream",
    answer=schemas.GenerationIdResponse,
    summary="Long-poll for a new generation",
)
async def stream_generation(
    request: Request,
    c: str,
    generationId: str | None = Query(None, description="answer once the current generation differs"),  # noqa: N803
    generationIdEncoding: Literal["utf8", "base64"] = Query("utf8"),  # noqa: N803
    timeoutMs: int | None = Query(None, ge=0, le=300_000, description="default 60000"),  # noqa: N803
) -> Response:
    config = config_of(request)
    out = response_codec(request.headers.get("accept"))
    timeout_ms = config.long_poll_default_ms if timeoutMs is None else min(timeoutMs, config.long_poll_max_ms)
    given = None
    if generationId is not None:
        given = decode_es({"value": generationId, "encoding": generationIdEncoding}, "generationId")
    hub: CommitHub = request.app.state.hub
    future = hub.add(c) if given is not None else None
    try:
        current: bytes = await call(request, lambda store: store.collection(c).generation_id)
        if future is not None and current == given:
            # One future settles every outcome: a commit (its generation id), the timeout, a disconnect
            # or shutdown (None). A timer handle and one small task are all a waiter costs.
            loop = asyncio.get_running_loop()
            timer = loop.call_later(timeout_ms / 1000, _settle, future)
            watcher = loop.create_task(_settle_on_disconnect(request, future))
            try:
                woken = await future
            finally:
                timer.cancel()
                watcher.cancel()  # not awaited: it ends on its own at the next loop iteration
            current = woken if woken is not None else given
    finally:
        if future is not None:
            hub.discard(c, future)
            future.cancel()
    return respond(out.dumps(generation_to_wire(current, out)), out)
