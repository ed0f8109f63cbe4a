"""``/collections/{c}/readers/``: list, create, update (with compare-and-set) and delete readers."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from diffstore.engine.readers import HOLD_PREFIX
from diffstore.server import audit, schemas
from diffstore.server.config import Limit
from diffstore.server.exchange import Exchange, handle
from diffstore.server.routing import route
from diffstore.server.scopes import TokenScope
from diffstore.server.synchronous import synchronous_of
from diffstore.wire import Body, readers_to_wire
from diffstore.wire_requests import CreateReaderRequest, UpdateReaderRequest

router = APIRouter(tags=["readers"])


@route(router, "GET", "/collections/{c}/readers/", answer=schemas.ReaderList, scope=TokenScope.READ)
async def list_readers(request: Request, c: str) -> Response:
    def work(x: Exchange) -> Body:
        return readers_to_wire(x.store.collection(c).readers(), x.out)

    return await handle(request, work)


@route(
    router,
    "POST",
    "/collections/{c}/readers/",
    body=schemas.CreateReader,
    scope=TokenScope.WRITE,
    audit="createReader",
)
async def create_reader(request: Request, c: str) -> Response:
    def work(x: Exchange) -> Body:
        req = CreateReaderRequest.from_wire(x.body, x.codec)
        _replication_is_not_audited(request, req.reader_name)
        x.store.collection(c).create_reader(req.reader_name, req.collection_name, req.generation_id)
        created.append(req.reader_name)
        return {}

    created: list[str] = []
    response = await handle(request, work, Limit.OTHER)
    synchronous_of(request).hold_moved(c, created[0])  # a replica's hold: writes may wait for it
    return response


@route(
    router,
    "PUT",
    "/collections/{c}/readers/{name}",
    body=schemas.UpdateReader,
    scope=TokenScope.WRITE,
    audit="moveReader",
)
async def update_reader(request: Request, c: str, name: str) -> Response:
    _replication_is_not_audited(request, name)

    def work(x: Exchange) -> Body:
        req = UpdateReaderRequest.from_wire(x.body, x.codec)
        x.store.collection(c).update_reader(name, req.generation_id, expected=req.expected)
        return {}

    response = await handle(request, work, Limit.OTHER)
    synchronous_of(request).hold_moved(c, name)  # a replica's hold moved: writes may wait for it
    return response


@route(
    router,
    "DELETE",
    "/collections/{c}/readers/{name}",
    summary="Delete a reader (a missing one is OK)",
    scope=TokenScope.WRITE,
    audit="deleteReader",
)
async def delete_reader(request: Request, c: str, name: str) -> Response:
    _replication_is_not_audited(request, name)

    def work(x: Exchange) -> Body:
        x.store.collection(c).delete_reader(name)
        return {}

    return await handle(request, work)


def _replication_is_not_audited(request: Request, name: str) -> None:
    """A replica's holds on its primary move with every generation it copies: replication, not a hand."""
    if name.startswith(HOLD_PREFIX):
        audit.note(request.scope, skip=True)
