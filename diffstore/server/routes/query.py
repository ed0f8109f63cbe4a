"""``query/``: pages of the records visible at a generation, resumed by self-contained cursor tokens."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from diffstore.server import schemas
from diffstore.server.config import Limit
from diffstore.server.exchange import Exchange, handle
from diffstore.server.routing import route
from diffstore.server.scopes import TokenScope
from diffstore.wire import Body, query_page_to_wire
from diffstore.wire_requests import QueryRequest

router = APIRouter(tags=["query"])


@route(
    router,
    "POST",
    "/collections/{c}/query/",
    body=schemas.StartQuery,
    body_required=False,
    answer=schemas.QueryResponse,
    columns=schemas.QueryColumnsResponse,
    scope=TokenScope.READ,
)
async def start_query(request: Request, c: str) -> Response:
    def work(x: Exchange) -> Body:
        page = QueryRequest.from_wire(x.body, x.codec).run(x.store.collection(c))
        return query_page_to_wire(page, x.out)

    return await handle(request, work, Limit.OTHER, columns=True)


@route(
    router,
    "GET",
    "/collections/{c}/query/{cursor_id}",
    answer=schemas.QueryResponse,
    columns=schemas.QueryColumnsResponse,
    scope=TokenScope.READ,
)
async def next_query_page(request: Request, c: str, cursor_id: str) -> Response:
    def work(x: Exchange) -> Body:
        return query_page_to_wire(x.store.collection(c).query_page(cursor=cursor_id), x.out)

    return await handle(request, work, columns=True)


@route(
    router,
    "DELETE",
    "/collections/{c}/query/{cursor_id}",
    summary="Forget a cursor (tokens hold no state)",
    scope=TokenScope.READ,
)
async def delete_query(request: Request, c: str, cursor_id: str) -> Response:
    def work(x: Exchange) -> Body:
        x.store.collection(c)  # 404 for a missing collection; the token itself needs no cleanup
        return {}

    return await handle(request, work)
