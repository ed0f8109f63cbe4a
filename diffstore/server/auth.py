"""Bearer tokens with scopes, as a pure ASGI middleware in front of every route (and of the fast lane).

Each request is matched to the route that will serve it (:class:`RouteTable`, built from the app's routes
and their declarations, see :mod:`diffstore.server.routing`); the route's scope decides:

- ``open`` (``/healthz``, the console's static shell, the API docs and ``/openapi.json``: they hold no
  data; the console asks for the token itself) passes without a token;
- anything else needs ``Authorization: Bearer <secret>`` of a known token (401 ``unauthorized``), whose
  scope covers the route on its collection (403 ``forbidden``, naming the scope needed); a path no route
  serves needs a known token too, then answers 404 as it would.

The check happens before the request reaches any route, so a refused request changes nothing. Creating a
collection names it in its body: that route asks :func:`require` itself before it creates anything.

Requests refused here, and those to routes declared with an audit action, go to the audit trail
(:mod:`diffstore.server.audit`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from diffstore.errors import Forbidden, Unauthorized
from diffstore.server.audit import DENIED, AuditTrail, outcome_of
from diffstore.server.fastlane import route_path, send_error
from diffstore.server.negotiation import response_codec
from diffstore.server.routing import Access, access_of
from diffstore.server.scopes import Token, TokenScope

if TYPE_CHECKING:
    from starlette.routing import BaseRoute
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from diffstore.server.tokens import Tokens

TOKEN = "diffstore.token"  # the request scope's key of the token that was let in (None: no auth)
UNDECLARED = Access(TokenScope.ADMIN)  # a route without a declaration: refusing is the safe mistake
UNROUTED = Access(TokenScope.READ)  # a path no route serves: 404/405 for a known token
_COLLECTION = "/collections/"
SEEN_MAX = 4096


class Matched:
    """A request's route: its declaration, template (for messages and the audit trail) and collection."""

    __slots__ = ("access", "collection", "template")

    def __init__(self, access: Access, template: str | None, collection: str | None) -> None:
        self.access = access
        self.template = template
        self.collection = collection


def walk_routes(routes: Iterable[BaseRoute]) -> Iterator[BaseRoute]:
    """Every route of ``routes``, the routes of included routers included."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from walk_routes(inner.routes)
        else:
            yield route


class RouteTable:
    """Finds the declaration of the route a request goes to, as the router would, without its cost.

    A path met before is found in one dict (at most :data:`SEEN_MAX` are kept); otherwise fixed paths and
    ``/collections/{c}<fixed suffix>`` are found in dicts, the few templates with more parameters
    (cursors, reader and lease names) by their regex, in the router's order.
    """

    def __init__(self, routes: Iterable[BaseRoute]) -> None:
        self.exact: dict[tuple[str, str], Matched] = {}
        self.suffixes: dict[tuple[str, str], tuple[Access, str]] = {}
        self.patterns: list[tuple[frozenset[str], re.Pattern[str], Access, str]] = []
        self.seen: dict[tuple[str, str], Matched] = {}  # paths met, with their answer
        for route in walk_routes(routes):
            path: str | None = getattr(route, "path", None)
            regex: re.Pattern[str] | None = getattr(route, "path_regex", None)
            methods = frozenset(getattr(route, "methods", None) or ())
            if path is None or regex is None or not methods:
                continue
            access = access_of(getattr(route, "endpoint", None)) or UNDECLARED
            template = path.rstrip("/") or "/"
            if "{" not in path:
                for method in methods:
                    self.exact.setdefault((method, path), Matched(access, template, None))
            elif path.startswith(_COLLECTION + "{c}") and "{" not in path[len(_COLLECTION) + 3 :]:
                for method in methods:
                    self.suffixes.setdefault((method, path[len(_COLLECTION) + 3 :]), (access, template))
            else:
                self.patterns.append((methods, regex, access, template))
        self.seen.update(self.exact)

    def find(self, method: str, path: str) -> Matched:
        key = (method, path)
        found = self.seen.get(key)
        if found is not None:
            return found
        found = self._find(method, path)
        if len(self.seen) >= len(self.exact) + SEEN_MAX:  # cursors make every path new: bound the memory
            self.seen = dict(self.exact)
        self.seen[key] = found
        return found

    def _find(self, method: str, path: str) -> Matched:
        if path.startswith(_COLLECTION):
            end = path.find("/", len(_COLLECTION))
            name = path[len(_COLLECTION) :] if end < 0 else path[len(_COLLECTION) : end]
            if name:
                hit = self.suffixes.get((method, "" if end < 0 else path[end:]))
                if hit is not None:
                    access, template = hit
                    return Matched(access, template, name)
        for methods, regex, access, template in self.patterns:
            match = regex.match(path)
            if match is not None and method in methods:
                return Matched(access, template, match.groupdict().get("c"))
        return Matched(UNROUTED, None, None)


def refusal(token: Token, needed: TokenScope, collection: str | None, what: str) -> Forbidden:
    """The 403 of ``token`` asking for ``what`` (a route, an action), which needs ``needed``."""
    if needed <= TokenScope.READ or token.glob == "*" and needed <= token.scope:
        where = ""
    elif collection is None:
        where = " on every collection"
    else:
        where = f" on collection {collection!r}"
    return Forbidden(
        f"{what} needs scope {needed.label}{where}; token {token.name!r} has {token.has()}", needed.label
    )


def require(scope: Scope, needed: TokenScope, collection: str, what: str) -> None:
    """Raises :class:`Forbidden` unless the request's token may do ``what`` (needing ``needed``) on
    ``collection``: for routes that learn their collection from the body.

    Raises:
        Forbidden: the token's scope or glob does not cover it (nothing was changed).
    """
    token: Token | None = scope.get(TOKEN)
    if token is not None and not token.may(needed, collection):
        raise refusal(token, needed, collection, what)


class ScopedAuth:
    """Lets a request in only with a token whose scope covers its route (see the module)."""

    def __init__(self, app: ASGIApp, tokens: Tokens, routes: RouteTable, audit: AuditTrail) -> None:
        self.app = app
        self.tokens = tokens
        self.routes = routes
        self.audit = audit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        matched = self.routes.find(method, route_path(scope) if scope.get("root_path") else scope["path"])
        access = matched.access
        if access.scope is TokenScope.OPEN:
            await self.app(scope, receive, send)
            return
        token: Token | None = None
        if self.tokens.enabled:
            given = b""
            for name, value in scope["headers"]:
                if name == b"authorization":
                    given = value
                    break
            scheme, _, secret = given.partition(b" ")
            # the scheme in any case (RFC 7235 §2.1: bearer and BEARER are Bearer)
            if scheme.lower() == b"bearer":
                token = self.tokens.table.find(secret.strip(b" "))
            if token is None:
                reason = "missing bearer token" if not given else "wrong bearer token"
                await self._refuse(scope, send, Unauthorized(reason), matched, None)
                return
            if access.collection_in_body:
                allowed = token.scope >= access.scope  # the route checks the glob (see require)
            else:
                allowed = token.may(access.scope, matched.collection)
            if not allowed:
                what = f"{method} {matched.template}"
                error = refusal(token, access.scope, matched.collection, what)
                await self._refuse(scope, send, error, matched, token.name)
                return
        scope[TOKEN] = token
        if access.audit is None:
            await self.app(scope, receive, send)
            return
        await self._audited(scope, receive, send, matched, access.audit, token)

    async def _refuse(
        self, scope: Scope, send: Send, error: Unauthorized | Forbidden, matched: Matched, name: str | None
    ) -> None:
        accept = None
        for key, value in scope["headers"]:
            if key == b"accept":
                accept = value.decode("latin-1")
        codec = response_codec(accept)
        sent = send
        if isinstance(error, Unauthorized):

            async def sent(message: Message) -> None:
                if message["type"] == "http.response.start":
                    message["headers"].append((b"www-authenticate", b"Bearer"))
                await send(message)

        await send_error(sent, error, codec, scope)
        action = matched.access.audit or DENIED
        route = None if matched.access.audit else f"{scope['method']} {matched.template or '-'}"
        status = 401 if isinstance(error, Unauthorized) else 403
        self.audit.record(scope, action, name, matched.collection, error.code, status, route)

    async def _audited(
        self, scope: Scope, receive: Receive, send: Send, matched: Matched, action: str, token: Token | None
    ) -> None:
        status = 500
        body = b""

        async def watching(message: Message) -> None:
            nonlocal status, body
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and status >= 400 and not body:
                body = message.get("body", b"")
            await send(message)

        try:
            await self.app(scope, receive, watching)
        finally:
            name = None if token is None else token.name
            self.audit.record(scope, action, name, matched.collection, outcome_of(status, body), status)
