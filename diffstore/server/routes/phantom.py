"""``phantom/start``: allocates a phantom id whose records only reads carrying it can see."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from diffstore.server import schemas
from diffstore.server.config import Limit
from diffstore.server.exchange import Exchange, handle
from diffstore.server.routing import route
from diffstore.wire import Body
from diffstore.wire_requests import StartPhantomRequest

router = APIRouter(tags=["phantoms"])


@route(
    router,
    "POST",
    "/collections/{c}/phantom/start",
    body=schemas.StartPhantom,
    body_required=False,
    answer=schemas.PhantomResponse,
)
async def start_phantom(request: Request, c: str) -> Response:
    def work(x: Exchange) -> Body:
        req = StartPhantomRequest.from_wire(x.body, x.codec)
        return {"phantomId": x.out.es(x.store.collection(c).start_phantom(ttl_seconds=req.ttl_seconds))}

    return await handle(request, work, Limit.OTHER)
