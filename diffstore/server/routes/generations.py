"""``generations/records``: the records one committed generation wrote, what a read replica copies (with
the list of generations, ``GET /collections/{c}/generations`` of :mod:`diffstore.server.console`). See
``docs/replicas.md``; anyone may read them.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from diffstore.engine.types import Reader
from diffstore.server import schemas
from diffstore.server.config import Limit
from diffstore.server.exchange import Exchange, handle
from diffstore.server.routing import route
from diffstore.server.scopes import TokenScope
from diffstore.wire import Body, Codec, Fields

router = APIRouter(tags=["generations"])

MAX_LIMIT = 10_000
DEFAULT_RECORDS = 1_000


@route(
    router,
    "POST",
    "/collections/{c}/generations/records",
    body=schemas.GenerationRecordsQuery,
    answer=schemas.GenerationRecordsResponse,
    summary="The records a committed generation wrote (a page; nextKey goes on)",
    scope=TokenScope.READ,
)
async def generation_records(request: Request, c: str) -> Response:
    def work(x: Exchange) -> Body:
        f = Fields(x.body, x.codec)
        limit = f.integer_opt("limit", 1, MAX_LIMIT)
        page = x.store.collection(c).generation_records(
            f.es("generationId"),
            f.es_opt("fromKey"),
            DEFAULT_RECORDS if limit is None else limit,
            f.text_opt("hold"),
            visible=f.flag("visible", False),
        )
        out = x.out
        items: list[Any]
        if not f.flag("pairs", False):
            items = [{"key": out.es(k), "value": out.es_opt(v)} for k, v in page.records]
        elif out.binary:
            items = page.records  # msgpack packs its (key, value) tuples as they are: pairs of bin
        else:
            items = [[out.es(k), out.es_opt(v)] for k, v in page.records]
        body: Body = {"items": items}
        if page.next_key is not None:
            body["nextKey"] = out.es(page.next_key)
        if not f.has("fromKey") and not f.flag("visible", False):
            body["previousGenerationId"] = out.es_opt(page.previous)
            body["moves"] = [_reader(r, out) for r in page.moves]
            body["readers"] = [_reader(r, out) for r in page.readers]
            if page.info is not None:  # the commit as its history lists it (a replica keeps it)
                body["committedAtMs"] = page.info.committed_at_ms
                body["changedKeys"] = page.info.changed_keys
                body["metadata"] = page.info.metadata
        return body

    return await handle(request, work, Limit.OTHER)


def _reader(reader: Reader, out: Codec) -> Body:
    return {
        "readerName": reader.name,
        "target": reader.collection,
        "generationId": out.es_opt(reader.generation_id),
    }
