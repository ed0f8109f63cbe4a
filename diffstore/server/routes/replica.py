"""``replica``: a read replica's state (``GET /replica``) and its promotion to a primary, and the guard
that refuses every write on a replica (:class:`ReadOnlyGuard`). See ``docs/replicas.md``.

The guard lets through what reads: every GET (long polls, cursors, metrics, the console), the POSTs
that read (get, getMany, getKeysAround, query, diff, lineage, a generation's records), forgetting a
cursor, and the promotion itself; everything else -- any route added later included -- is a write and
answers 409 ``readOnlyReplica`` while the store follows its primary. It asks the store at each such
request (two point reads), so a promotion through any worker process opens writes in all of them.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request, Response

from diffstore.errors import NotReplica, ReadOnlyReplica
from diffstore.server import schemas
from diffstore.server.exchange import Exchange, handle
from diffstore.server.fastlane import header, route_path, send_error
from diffstore.server.negotiation import response_codec
from diffstore.server.routing import route
from diffstore.wire import Body

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from diffstore.engine.store import Store
    from diffstore.engine.types import ReplicaLag

router = APIRouter(tags=["replica"])

_READS = re.compile(
    r"/collections/[^/]+/(get|getMany|getKeysAround|query|diff|lineage|generations/records)/?"
)
_FORGET_CURSOR = re.compile(r"/collections/[^/]+/(query|diff)/[^/]+/?")
_PROMOTE = re.compile(r"/replica/promote/?")


def is_write(method: str, path: str) -> bool:
    """Whether a request may change the store (what a replica refuses)."""
    if method in ("GET", "HEAD", "OPTIONS"):
        return False
    if method == "POST":
        return not (_READS.fullmatch(path) or _PROMOTE.fullmatch(path))
    if method == "DELETE":
        return not _FORGET_CURSOR.fullmatch(path)
    return True


class ReadOnlyGuard:
    """Refuses writes with 409 ``readOnlyReplica`` while ``store`` follows a primary (see the module)."""

    def __init__(self, app: ASGIApp, store: Store) -> None:
        self.app = app
        self.store = store

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and is_write(scope["method"], route_path(scope))
            and self.store.read_only()
        ):
            codec = response_codec(header(scope, b"accept"))
            error = ReadOnlyReplica(
                "this server is a read replica: send writes to its primary (or promote it)"
            )
            await send_error(send, error, codec, scope)
            return
        await self.app(scope, receive, send)


def replica_to_wire(store: Store, now_ms: int) -> Body:
    """``GET /replica``'s answer (raises :class:`NotReplica` on a primary)."""
    state = store.replica_state()
    if not state.following or state.primary is None:
        raise NotReplica("this server is not a replica")
    return {
        "primary": state.primary,
        "collections": [collection_to_wire(lag, now_ms) for lag in state.lags],
    }


def collection_to_wire(lag: ReplicaLag, now_ms: int) -> Body:
    """One collection of ``GET /replica``: its lag and its follower's state (SPEC §9)."""
    body: Body = {
        "collectionName": lag.collection,
        "lagGenerations": lag.generations,
        "lagSeconds": 0.0
        if lag.unapplied_since_ms is None
        else max(0.0, (now_ms - lag.unapplied_since_ms) / 1000),
        "state": lag.state,
        "sinceMs": lag.state_since_ms,
    }
    if lag.state == "stalled":
        body["reason"] = lag.reason or "unknown"
    return body


@route(router, "GET", "/replica", answer=schemas.ReplicaResponse, summary="A read replica's primary and lag")
async def replica(request: Request) -> Response:
    def work(x: Exchange) -> Body:
        return replica_to_wire(x.store, time.time_ns() // 1_000_000)

    return await handle(request, work)


@route(
    router,
    "POST",
    "/replica/promote",
    answer=schemas.PromoteResponse,
    summary="Stop following and accept writes (on a primary: 409 notReplica)",
)
async def promote(request: Request) -> Response:
    def work(x: Exchange) -> Body:
        x.store.promote_replica()
        return {"promoted": True}

    return await handle(request, work)
