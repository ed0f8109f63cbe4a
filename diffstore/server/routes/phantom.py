"""``phantom/start`` allocates a phantom id whose records only reads carrying it can see;
**(beyond diffbelt)** ``phantom/changes`` answers what a phantom changes for reads at a generation."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from diffstore.server import schemas
from diffstore.server.config import Limit
from diffstore.server.exchange import Exchange, handle
from diffstore.server.routing import route
from diffstore.server.scopes import TokenScope
from diffstore.wire import Body, phantom_changes_to_wire
from diffstore.wire_requests import PhantomChangesRequest, StartPhantomRequest

router = APIRouter(tags=["phantoms"])


@route(
    router,
    "POST",
    "/collections/{c}/phantom/start",
    body=schemas.StartPhantom,
    body_required=False,
    answer=schemas.PhantomResponse,
    scope=TokenScope.WRITE,
)
async def start_phantom(request: Request, c: str) -> Response:
    def work(x: Exchange) -> Body:
        req = StartPhantomRequest.from_wire(x.body, x.codec)
        return {"phantomId": x.out.es(x.store.collection(c).start_phantom(ttl_seconds=req.ttl_seconds))}

    return await handle(request, work, Limit.OTHER)


@route(
    router,
    "POST",
    "/collections/{c}/phantom/changes",
    body=schemas.PhantomChangesQuery,
    answer=schemas.PhantomChangesResponse,
    summary="What a phantom changes at a generation (beyond diffbelt)",
    scope=TokenScope.READ,
)
async def phantom_changes(request: Request, c: str) -> Response:
    def work(x: Exchange) -> Body:
        page = PhantomChangesRequest.from_wire(x.body, x.codec).run(x.store.collection(c))
        return phantom_changes_to_wire(page, x.out)

    return await handle(request, work, Limit.OTHER)
