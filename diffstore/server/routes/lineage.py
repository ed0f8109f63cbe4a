"""``lineage``: the readers a generation's commit moved, and (``depth`` > 1) their sources' own lineage."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from diffstore.server import schemas
from diffstore.server.config import Limit
from diffstore.server.exchange import Exchange, handle
from diffstore.server.routing import route
from diffstore.server.scopes import TokenScope
from diffstore.wire import Body, lineage_to_wire
from diffstore.wire_requests import LineageRequest

router = APIRouter(tags=["lineage"])


@route(
    router,
    "POST",
    "/collections/{c}/lineage",
    body=schemas.LineageQuery,
    answer=schemas.LineageResponse,
    summary="The readers moved by a generation's commit, walked depth levels back",
    scope=TokenScope.READ,
)
async def lineage(request: Request, c: str) -> Response:
    def work(x: Exchange) -> Body:
        req = LineageRequest.from_wire(x.body, x.codec)
        return lineage_to_wire(req.run(x.store.collection(c)), x.out)

    return await handle(request, work, Limit.OTHER)
