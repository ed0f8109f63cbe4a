"""The server-wide budget of request body bytes in flight (SPEC §2: 503 ``overloaded`` with ``Retry-After``).

Per-route limits (413) bound one body; this bounds them all together, so that many large bodies at once
cannot take the process's memory: a body holds its share from its first byte until its request is
answered (its parsed form lives that long too). Only bytes received count: a request that declares a
large body and sends it slowly holds what it sent, not what it promised, so a few idle sockets cannot
spend the budget of every other write. How long a body may take to arrive is bounded in the protocol
(``ServerConfig.body_min_rate_bytes_s``, see :mod:`diffstore.server.uvicorn_adapter`), so bytes held by a
slow body are held for a bounded time.

Invariants:
    * A request holds exactly the body bytes the app has received from it, from the chunk that brought
      them until its request is answered; then all are given back, whatever the outcome.
    * The chunk that would take the budget past ``max_bytes``, or its request past
      ``connection_max_bytes``, makes ``receive`` raise :class:`~diffstore.errors.Overloaded`, which the
      routes answer (503, ``Retry-After``, the connection closed: the rest of the body is left unread).
    * A request whose declared ``Content-Length`` could not be taken now is refused at once, before a byte
      is read; the declared length is never reserved (a slow sender holds nothing it has not sent).
    * A request alone in flight is always admitted (within its route's limit), so a budget smaller than
      a route's limit slows that route down to one body at a time but never refuses it forever.
    * A declared length above every route's limit is left to its route, which answers 413 before
      reading a byte: that tells the client more than a 503 it would retry in vain.
    * Runs on the event loop only: the counter needs no lock. Each worker process has its own budget.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from diffstore.errors import Overloaded
from diffstore.server.errors import encode_error
from diffstore.server.negotiation import response_codec

RETRY_AFTER_S = 1


class Budget:
    """The counter: body bytes held by requests in flight, and how many requests were refused.

    Args:
        max_bytes: what all requests together may hold.
        connection_max_bytes: what one request may hold while others hold bytes too.
    """

    def __init__(self, max_bytes: int, connection_max_bytes: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.connection_max_bytes = max_bytes if connection_max_bytes is None else connection_max_bytes
        self.in_flight = 0
        self.refused = 0

    def fits(self, size: int, held: int) -> bool:
        """Whether a request already holding ``held`` bytes may take ``size`` more."""
        if self.in_flight == held:  # alone
            return True
        return held + size <= self.connection_max_bytes and self.in_flight + size <= self.max_bytes

    def reason(self) -> str:
        return (
            f"the server's {self.max_bytes} bytes of request bodies in flight (at most "
            f"{self.connection_max_bytes} per request) are taken; retry later"
        )


class BodyBudget:
    """ASGI middleware holding the received body bytes of every request within ``budget``."""

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
        if declared and not budget.fits(declared, 0):
            budget.refused += 1
            await _refuse(scope, send, budget)
            return
        held = 0

        async def counted() -> Message:
            nonlocal held
            message = await receive()
            if message["type"] == "http.request":
                size = len(message.get("body", b""))
                if size:
                    if not budget.fits(size, held):
                        budget.refused += 1
                        raise Overloaded(budget.reason())
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


async def _refuse(scope: Scope, send: Send, budget: Budget) -> None:
    codec = response_codec(_header(scope, b"accept"))
    status, body = encode_error(Overloaded(budget.reason()), codec, scope["method"], scope["path"])
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
