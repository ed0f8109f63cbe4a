"""``generations``: a collection's committed generations, newest first, and the records one of them wrote.

What a read replica follows its primary with (see ``docs/replicas.md``); anyone may read them.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Query, Request, Response

from diffstore.server import schemas
from diffstore.server.config import Limit
from diffstore.server.exchange import Exchange, handle
from diffstore.server.routing import route
from diffstore.wire import Body, Fields, decode_es

router = APIRouter(tags=["generations"])

MAX_LIMIT = 10_000
DEFAULT_GENERATIONS = 100
DEFAULT_RECORDS = 1_000


@route(router, "GET", "/collections/{c}/generations", answer=schemas.GenerationsResponse)
async def generations(
    request: Request,
    c: str,
    limit: int = Query(DEFAULT_GENERATIONS, ge=1, le=MAX_LIMIT),
    before: str | None = Query(None),
    beforeEncoding: Literal["utf8", "base64"] = Query("utf8"),  # noqa: N803 -- the wire's name
) -> Response:
    before_id = None if before is None else decode_es({"value": before, "encoding": beforeEncoding}, "before")

    def work(x: Exchange) -> Body:
        ids, more = x.store.collection(c).generations(before_id, limit)
        # commit times, changed keys and metadata are not recorded yet (SPEC §8): null until they are
        items = [
            {"generationId": x.out.es(g), "committedAtMs": None, "changedKeys": None, "metadata": None}
            for g in ids
        ]
        body: Body = {"items": items}
        if more and ids:
            body["nextBefore"] = x.out.es(ids[-1])
        return body

    return await handle(request, work)


@route(
    router,
    "POST",
    "/collections/{c}/generations/records",
    body=schemas.GenerationRecordsQuery,
    answer=schemas.GenerationRecordsResponse,
    summary="The records a committed generation wrote (a page; nextKey goes on)",
)
async def generation_records(request: Request, c: str) -> Response:
    def work(x: Exchange) -> Body:
        f = Fields(x.body, x.codec)
        limit = f.integer_opt("limit", 1, MAX_LIMIT)
        items, next_key = x.store.collection(c).generation_records(
            f.es("generationId"), f.es_opt("fromKey"), DEFAULT_RECORDS if limit is None else limit
        )
        body: Body = {"items": [{"key": x.out.es(k), "value": x.out.es_opt(v)} for k, v in items]}
        if next_key is not None:
            body["nextKey"] = x.out.es(next_key)
        return body

    return await handle(request, work, Limit.OTHER)
