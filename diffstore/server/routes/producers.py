"""``producers/{producerId}``: the last sequence number stored for an idempotent producer."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from diffstore.server import schemas
from diffstore.server.exchange import Exchange, handle
from diffstore.server.routing import route
from diffstore.server.scopes import TokenScope
from diffstore.wire import Body

router = APIRouter(tags=["producers"])


@route(
    router,
    "GET",
    "/collections/{c}/producers/{producer_id}",
    answer=schemas.ProducerResponse,
    scope=TokenScope.READ,
)
async def last_seq_no(request: Request, c: str, producer_id: str) -> Response:
    def work(x: Exchange) -> Body:
        return {"lastSeqNo": x.store.collection(c).producer_last_seq_no(producer_id)}

    return await handle(request, work)
