"""``digest``: the digest of a collection's live records at a committed generation (SPEC §9 Integrity), one
or a page of them, newest first; what ``diffstore check --url R --against P`` compares. See docs/http.md."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel

from diffstore.engine.types import GenerationDigest
from diffstore.server import schemas
from diffstore.server.exchange import Exchange, handle
from diffstore.server.routing import route
from diffstore.server.scopes import TokenScope
from diffstore.wire import Body, Codec, decode_es

router = APIRouter(tags=["integrity"])

MAX_LIMIT = 10_000


class DigestResponse(BaseModel):
    generationId: schemas.ES
    records: int | None = None  # None: committed by a store older than digests (diffstore migrate)
    digest: str | None = None  # 32 hex digits


class DigestList(BaseModel):
    items: list[DigestResponse]
    nextBefore: schemas.ES | None = None


@route(
    router,
    "GET",
    "/collections/{c}/digest",
    answer=DigestResponse,
    summary="The order-independent digest of the live records at a committed generation (default: current)",
    scope=TokenScope.READ,
)
async def digest(
    request: Request,
    c: str,
    generationId: str | None = Query(None),  # noqa: N803 -- the wire's name
    generationIdEncoding: Literal["utf8", "base64"] = Query("utf8"),  # noqa: N803
) -> Response:
    generation_id = None
    if generationId is not None:
        generation_id = decode_es({"value": generationId, "encoding": generationIdEncoding}, "generationId")

    def work(x: Exchange) -> Body:
        return _item(x.store.collection(c).digest(generation_id), x.out)

    return await handle(request, work)


@route(
    router,
    "GET",
    "/collections/{c}/digests",
    answer=DigestList,
    summary="The committed generations, newest first, each with its digest (a page; nextBefore goes on)",
    scope=TokenScope.READ,
)
async def digests(
    request: Request,
    c: str,
    limit: int = Query(1000, ge=1, le=MAX_LIMIT),
    before: str | None = Query(
        None, description="only generations below this one (the last page's nextBefore)"
    ),
    beforeEncoding: Literal["utf8", "base64"] = Query("utf8"),  # noqa: N803
) -> Response:
    before_id = None if before is None else decode_es({"value": before, "encoding": beforeEncoding}, "before")

    def work(x: Exchange) -> Body:
        found, more = x.store.collection(c).digests(before_id, limit)
        body: Body = {"items": [_item(d, x.out) for d in found]}
        if more:
            body["nextBefore"] = x.out.es(found[-1].generation_id)
        return body

    return await handle(request, work)


def _item(found: GenerationDigest, out: Codec) -> Body:
    return {"generationId": out.es(found.generation_id), "records": found.records, "digest": found.hex}
