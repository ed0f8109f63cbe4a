"""Bearer-token authentication as a pure ASGI middleware: every route but ``/healthz``, the console's shell
and the API docs.

What stays open holds no data: the console's static files (it asks for the token itself) and the API's
description (``/docs``, ``/redoc``, ``/openapi.json`` and their assets: the protocol, published in
docs/protocol.md anyway), so that the console's "API docs" link opens them; their "Try it out" calls the
API with the token given to Swagger UI's "Authorize".
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from diffstore.server.negotiation import response_codec
from diffstore.wire import error_to_wire

OPEN_PATHS = frozenset({"/healthz", "/healthz/", "/", "/ui", "/docs", "/redoc", "/openapi.json"})
OPEN_PREFIXES = ("/ui/", "/docs-assets/")  # the console's static shell, the API docs' scripts and styles


class BearerAuth:
    """Answers 401 ``unauthorized`` unless ``Authorization: Bearer <token>`` matches (constant time).

    The scheme is matched in any case (RFC 7235 §2.1: ``bearer`` and ``BEARER`` are ``Bearer``).
    """

    def __init__(self, app: ASGIApp, token: str) -> None:
        if not token:
            raise ValueError("an empty token would let every request in")
        self.app = app
        self.expected = token.encode("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or scope["path"].startswith(OPEN_PREFIXES):
            await self.app(scope, receive, send)
            return
        given = b""
        accept = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                given = value
            elif name == b"accept":
                accept = value.decode("latin-1")
        scheme, _, credentials = given.partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(b" "), self.expected):
            await self.app(scope, receive, send)
            return
        codec = response_codec(accept)
        reason = "missing bearer token" if not given else "wrong bearer token"
        body = codec.dumps(error_to_wire("unauthorized", reason))
        headers = [
            (b"content-type", codec.content_type.encode()),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer"),
        ]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})
