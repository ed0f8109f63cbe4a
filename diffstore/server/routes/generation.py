"""The manual generation lifecycle: ``generation/start``, ``/commit`` (with reader updates), ``/abort``."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from diffstore.server import schemas
from diffstore.server.config import Limit
from diffstore.server.exchange import Exchange, handle
from diffstore.server.routing import route
from diffstore.server.scopes import TokenScope
from diffstore.server.synchronous import synchronous_of
from diffstore.wire import Body
from diffstore.wire_requests import GenerationRequest

router = APIRouter(tags=["generations"])


@route(
    router, "POST", "/collections/{c}/generation/start", body=schemas.StartGeneration, scope=TokenScope.WRITE
)
async def start(request: Request, c: str) -> Response:
    def work(x: Exchange) -> Body:
        req = GenerationRequest.from_wire(x.body, x.codec)
        x.store.collection(c).start_generation(
            req.generation_id, abort_outdated=req.abort_outdated, lease=req.lease
        )
        return {}

    return await handle(request, work, Limit.OTHER)


@route(
    router,
    "POST",
    "/collections/{c}/generation/commit",
    body=schemas.CommitGeneration,
    scope=TokenScope.WRITE,
)
async def commit(request: Request, c: str) -> Response:
    committed: list[bytes] = []

    def work(x: Exchange) -> Body:
        req = GenerationRequest.from_wire(x.body, x.codec)
        x.store.collection(c).commit_generation(
            req.generation_id, update_readers=list(req.update_readers), lease=req.lease, metadata=req.metadata
        )
        committed.append(req.generation_id)
        return {}

    response = await handle(request, work, Limit.OTHER)
    # committed and the write lock let go: wait on the loop for the replicas (serve --synchronous N)
    await synchronous_of(request).wait(c, committed[0])
    return response


@route(
    router, "POST", "/collections/{c}/generation/abort", body=schemas.AbortGeneration, scope=TokenScope.WRITE
)
async def abort(request: Request, c: str) -> Response:
    def work(x: Exchange) -> Body:
        req = GenerationRequest.from_wire(x.body, x.codec)
        x.store.collection(c).abort_generation(req.generation_id, lease=req.lease)
        return {}

    return await handle(request, work, Limit.OTHER)
