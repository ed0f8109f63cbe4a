"""``splits``: keys that cut a collection (or the keys a diff changed) into near-equal ranges, for parallel
readers."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Query, Request, Response

from diffstore.server import schemas
from diffstore.server.exchange import Exchange, handle
from diffstore.server.routing import route
from diffstore.server.scopes import TokenScope
from diffstore.wire import Body, decode_es

router = APIRouter(tags=["splits"])


@route(router, "GET", "/collections/{c}/splits", answer=schemas.SplitsResponse, scope=TokenScope.READ)
async def splits(
    request: Request,
    c: str,
    count: int = Query(ge=2, le=1024),
    generationId: str | None = Query(None),  # noqa: N803 -- the wire's name
    fromGenerationId: str | None = Query(None),  # noqa: N803
    generationIdEncoding: Literal["utf8", "base64"] = Query("utf8"),  # noqa: N803
) -> Response:
    generation_id = from_generation_id = None
    if generationId is not None:
        generation_id = decode_es({"value": generationId, "encoding": generationIdEncoding}, "generationId")
    if fromGenerationId is not None:
        from_generation_id = decode_es(
            {"value": fromGenerationId, "encoding": generationIdEncoding}, "fromGenerationId"
        )

    def work(x: Exchange) -> Body:
        keys = x.store.collection(c).splits(count, generation_id, from_generation_id)
        return {"keys": [x.out.es(k) for k in keys]}

    return await handle(request, work)
