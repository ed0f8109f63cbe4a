"""``GET /healthz``: liveness, without authentication; says why when the store is degraded."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from diffstore.server import schemas
from diffstore.server.exchange import respond
from diffstore.server.negotiation import response_codec
from diffstore.server.routing import route
from diffstore.server.scopes import TokenScope

router = APIRouter(tags=["health"])


@route(
    router,
    "GET",
    "/healthz",
    answer=schemas.Health,
    summary="Liveness (no token needed)",
    scope=TokenScope.OPEN,
)
async def healthz(request: Request) -> Response:
    codec = response_codec(request.headers.get("accept"))
    health = request.app.state.store.health()
    if health.ok:
        return respond(codec.dumps({"ok": True}), codec)
    # still alive and serving reads; writes may not become visible (automatic commits are failing)
    return respond(codec.dumps({"ok": True, "degraded": True, "reason": health.reason}), codec)
