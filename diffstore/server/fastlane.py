"""The fast lane: the two hottest routes served in raw ASGI, in front of FastAPI's router.

``GET /collections/{c}/generationId/stream`` (one commit may answer thousands of waiters at once) and
``POST /collections/{c}/get`` (point reads, the most frequent call) skip FastAPI's per-request machinery:
nested router matching, dependency solving, Request/Response objects and the threadpool hop cost several
times what the work itself does. :class:`FastLane` matches ``/collections/{c}/<route>`` (with and without
the trailing slash) and hands the pairs ``(method, route)`` it was given to their handlers (in
:mod:`diffstore.server.routes.stream` and :mod:`diffstore.server.routes.items`); every other request, and
any other method on these paths (405), goes to FastAPI, where the two routes are still registered so
that ``/openapi.json`` documents them.

The lane sits inside the bearer-token check and inside Starlette's last-resort error handler, so
authentication and unexpected exceptions are handled as for every route. Handlers answer domain errors
themselves, with the SPEC §2 body (:func:`send_error`).

Handlers here run their engine calls on the event loop: a point read is one or two LMDB lookups in a
read transaction (microseconds), less than the hop to a worker thread would cost. The loop never blocks
on a writer: LMDB readers take no lock, and the app marks the loop's thread so that its reads do not
wait for a writer thread as other threads' reads do (``Store.never_wait_for_writers_here``). A point get
that arrives while a write transaction of *this* process is changing pages steps aside without blocking
(:meth:`FastLane.step_aside`): it is parked until the writer is done, at most ``read_yield_ms``, while the
loop serves everything else. Without it a busy loop starves the writer thread of the GIL (py-lmdb gives
it up around every put; see :mod:`diffstore.engine.priority`). Writers in other worker processes do not
touch this process at all. Anything that may be large (a value over :data:`INLINE_MAX_BYTES` to encode)
still goes to a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from diffstore.errors import DiffstoreError, InvalidRequest, PayloadTooLarge
from diffstore.server.errors import count_error, encode_error, error_headers

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from diffstore.engine.store import Store
    from diffstore.server.config import ServerConfig
    from diffstore.server.longpoll import CommitHub
    from diffstore.wire import Codec

INLINE_MAX_BYTES = 64 * 1024
PATH = re.compile(r"/collections/([^/]+)/(.+?)/?")
Handler = Callable[["FastLane", str, "Scope", "Receive", "Send"], Awaitable[None]]


class FastLane:
    """Serves ``handlers[(method, route)]`` for ``/collections/{c}/<route>[/]``; passes the rest to ``app``.

    A handler is called as ``handler(lane, c, scope, receive, send)`` and must answer.
    """

    def __init__(
        self,
        app: ASGIApp,
        store: Store,
        config: ServerConfig,
        hub: CommitHub,
        handlers: dict[tuple[str, str], Handler],
    ) -> None:
        self.app = app
        self.store = store
        self.config = config
        self.hub = hub
        self.handlers = handlers
        self._aside: asyncio.Future[None] | None = None  # what parked requests wait for (step_aside)

    async def step_aside(self) -> None:
        """Returns at once, unless a write transaction of another thread of this process is changing pages:
        then when it is done or after ``read_yield_ms``, whichever comes first. The event loop is free
        meanwhile; every request parked during one write waits on one future."""
        aside = self._aside
        if aside is None or aside.done():
            loop = asyncio.get_running_loop()
            aside = loop.create_future()

            def done() -> None:  # in the writer's thread
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                    loop.call_soon_threadsafe(_finish, aside)

            bound = self.store.call_when_writes_done(done)
            if bound is None:
                return
            self._aside = aside
            loop.call_later(bound, _finish, aside)
        await asyncio.shield(aside)  # a cancelled request must not cancel the others' wait

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            match = PATH.fullmatch(route_path(scope))
            if match is not None:
                handler = self.handlers.get((scope["method"], match.group(2)))
                if handler is not None:
                    await handler(self, match.group(1), scope, receive, send)
                    return
        await self.app(scope, receive, send)


def _finish(aside: asyncio.Future[None]) -> None:
    if not aside.done():
        aside.set_result(None)


def route_path(scope: Scope) -> str:
    """The path without the app's ``root_path`` (as Starlette's router matches it)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] == "/":
        return path[len(root) :]
    return path


def header(scope: Scope, name: bytes) -> str | None:
    """The value of request header ``name`` (lower case), or ``None``."""
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")  # type: ignore[no-any-return]
    return None


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes | None:
    """The whole request body, or ``None`` if the client left first.

    Raises:
        PayloadTooLarge: the declared or the streamed size passes ``limit`` (nothing more is read).
        InvalidRequest: a malformed ``Content-Length``.
    """
    declared = header(scope, b"content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise InvalidRequest("malformed Content-Length") from None
        if size > limit:
            raise PayloadTooLarge(f"body of {size} bytes exceeds {limit}", bytes_max=limit)
    chunks: list[bytes] = []
    received = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        received += len(chunk)
        if received > limit:
            raise PayloadTooLarge(f"body exceeds {limit} bytes", bytes_max=limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def send_body(
    send: Send,
    body: bytes,
    codec: Codec,
    status: int = 200,
    close: bool = False,
    extra: dict[str, str] | None = None,
) -> None:
    """A complete response: ``body`` in ``codec``'s media type (``close``: the connection ends after it)."""
    headers = [(b"content-type", codec.content_type.encode()), (b"content-length", b"%d" % len(body))]
    if close:
        headers.append((b"connection", b"close"))
    for name, value in (extra or {}).items():
        headers.append((name.encode(), value.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, exc: DiffstoreError, codec: Codec, scope: Scope) -> None:
    """The SPEC §2 error answer, with the headers it needs (a 413 or 503 closes the connection: the rest
    of the body is unread)."""
    count_error(scope.get("app"), exc)
    status, body = encode_error(exc, codec, scope["method"], scope["path"])
    await send_body(send, body, codec, status, extra=error_headers(exc))
