"""``revert`` (SPEC §8): write into the open generation the changes that restore an earlier state."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from diffstore.server import schemas
from diffstore.server.config import Limit
from diffstore.server.exchange import Exchange, handle
from diffstore.server.routing import route
from diffstore.server.scopes import TokenScope
from diffstore.wire import Body
from diffstore.wire_revert import RevertRequest, revert_result_to_wire

router = APIRouter(tags=["generations"])


@route(
    router,
    "POST",
    "/collections/{c}/revert",
    body=schemas.Revert,
    answer=schemas.RevertResponse,
    summary="Write into the open generation the changes that make the collection equal to an earlier one",
    scope=TokenScope.ADMIN,
    audit="revert",
)
async def revert(request: Request, c: str) -> Response:
    def work(x: Exchange) -> Body:
        result = RevertRequest.from_wire(x.body, x.codec).run(x.store.collection(c))
        return revert_result_to_wire(result, x.out)

    return await handle(request, work, Limit.OTHER)
