"""The server-wide budget of request body bytes in flight (SPEC §2: 503 ``overloaded`` with ``Retry-After``).

Per-route limits (413) bound one body; this bounds them all together, so that many large or slow bodies
at once cannot take the process's memory: a body holds its share from its first byte until its request
is answered (its parsed form lives that long too).

Invariants:
    * A request that declares ``Content-Length`` reserves it whole before the app runs, and is refused
      at once (nothing read, the connection closed) when that would pass the budget: a slow sender
      cannot hold a share it has not sent yet while refusals wait for it.
    * A body without a declared length (chunked) is counted as it is received; the chunk that would pass
      the budget makes ``receive`` raise :class:`~diffstore.errors.Overloaded`, which the routes answer.
    * A request alone in flight is always admitted (within its route's limit), so a budget smaller than
      a route's limit slows that route down to one body at a time but never refuses it forever.
    * A declared length above every route's limit reserves nothing: its route answers 413 before reading
      a byte, which tells the client more than a 503 it would retry in vain.
    * Runs on the event loop only: the counter needs no lock. Each worker process has its own budget.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from diffstore.errors import Overloaded
from diffstore.server.errors import encode_error
from diffstore.server.negotiation import response_codec

RETRY_AFTER_S = 1


class Budget:
    """The counter: body bytes held by requests in flight, and how many requests were refused."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.in_flight = 0
        self.refused = 0

    def fits(self, size: int, held: int) -> bool:
        """Whether a request already holding ``held`` bytes may take ``size`` more."""
        return self.in_flight + size <= self.max_bytes or self.in_flight == held


class BodyBudget:
    """ASGI middleware holding the in-flight body bytes of every request within ``budget``."""

    def __init__(self, app: ASGIApp, budget: Budget, largest_body: int) -> None:
        self.app = app
        self.budget = budget
        self.largest_body = largest_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        budget = self.budget
        declared = _declared_length(scope)
        if declared is not None and declared > self.largest_body:
            await self.app(scope, receive, send)  # refused by its route's limit (413), nothing read
            return
        if declared is not None and not budget.fits(declared, 0):
            budget.refused += 1
            await _refuse(scope, send, budget.max_bytes)
            return
        held = declared or 0
        budget.in_flight += held

        async def counted() -> Message:
            nonlocal held
            message = await receive()
            if declared is None and message["type"] == "http.request":
                size = len(message.get("body", b""))
                if size:
                    if not budget.fits(size, held):
                        budget.refused += 1
                        raise Overloaded(_reason(budget.max_bytes))
                    held += size
                    budget.in_flight += size
            return message

        try:
            await self.app(scope, counted, send)
        finally:
            budget.in_flight -= held


def _declared_length(scope: Scope) -> int | None:
    """``Content-Length`` when it is a plain non-negative number (the routes answer a malformed one)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


def _reason(max_bytes: int) -> str:
    return f"the server's {max_bytes} bytes of request bodies in flight are taken; retry later"


async def _refuse(scope: Scope, send: Send, max_bytes: int) -> None:
    codec = response_codec(_header(scope, b"accept"))
    status, body = encode_error(Overloaded(_reason(max_bytes)), codec, scope["method"], scope["path"])
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", codec.content_type.encode()),
                (b"content-length", b"%d" % len(body)),
                (b"retry-after", b"%d" % RETRY_AFTER_S),
                (b"connection", b"close"),  # the body is left unread
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")  # type: ignore[no-any-return]
    return None
