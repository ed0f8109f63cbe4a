"""``replica``: a read replica's state (``GET /replica``), any server's role and term (``GET
/replication``), promotion (``POST /replica/promote``), fencing (``POST /replica/stepDown`` and
``/stepUp``, the ``Diffstore-Term`` header), and the gate that refuses writes (:class:`WriteGate`). See
``docs/replicas.md``.

The gate lets through what reads: every GET (long polls, cursors, metrics, the console), the POSTs
that read (get, getMany, getKeysAround, query, diff, lineage, a generation's records), forgetting a
cursor, and the replica routes themselves; everything else -- any route added later included -- is a
write and answers 409 ``readOnlyReplica`` while the store follows its primary, or 409 ``fenced`` once it
stepped down (a replica may still delete its hold on a stepped-down primary). It asks the store at each
such request (three point reads), so a promotion or a step-down through any worker process holds in all
of them. A request whose ``Diffstore-Term`` header carries a term above the store's makes it step down
first (see :mod:`diffstore.engine.fencing`).
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request, Response

from diffstore.engine.readers import HOLD_PREFIX
from diffstore.errors import DiffstoreError, Fenced, InvalidRequest, NotReplica
from diffstore.replica.promotion import DEFAULT_WAIT_MS, MAX_WAIT_MS, Promotion
from diffstore.replica.promotion import promote as promote_store
from diffstore.server import schemas
from diffstore.server.config import Limit
from diffstore.server.exchange import Exchange, config_of, handle
from diffstore.server.fastlane import header, route_path, send_error
from diffstore.server.negotiation import response_codec
from diffstore.server.routing import route
from diffstore.wire import Body, Fields

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from diffstore.engine.store import Store
    from diffstore.engine.types import ReplicaLag

router = APIRouter(tags=["replica"])

_READS = re.compile(
    r"/collections/[^/]+/(get|getMany|getKeysAround|query|diff|lineage|generations/records)/?"
)
_FORGET_CURSOR = re.compile(r"/collections/[^/]+/(query|diff)/[^/]+/?")
_REPLICA_ROUTES = re.compile(r"/replica/(promote|stepDown|stepUp)/?")
_HOLD_RELEASE = re.compile(r"/collections/[^/]+/readers/" + re.escape(HOLD_PREFIX) + r"[^/]+/?")
TERM_HEADER = b"diffstore-term"
_TERM_MAX = (1 << 63) - 1


def is_write(method: str, path: str) -> bool:
    """Whether a request may change the store (what a replica, or a stepped-down primary, refuses)."""
    if method in ("GET", "HEAD", "OPTIONS"):
        return False
    if method == "POST":
        return not (_READS.fullmatch(path) or _REPLICA_ROUTES.fullmatch(path))
    if method == "DELETE":
        return not _FORGET_CURSOR.fullmatch(path)
    return True


def term_of(text: str) -> int:
    """The term a ``Diffstore-Term`` header carries (400 ``invalidRequest`` when it is no term)."""
    value = text.strip()
    if not value.isascii() or not value.isdigit() or int(value) > _TERM_MAX:
        raise InvalidRequest(f"the Diffstore-Term header: expected an integer 0..{_TERM_MAX}, not {text!r}")
    return int(value)


class WriteGate:
    """Refuses writes with 409 ``readOnlyReplica`` while ``store`` follows a primary, and with 409
    ``fenced`` once it stepped down; takes the term a request carries (see the module)."""

    def __init__(self, app: ASGIApp, store: Store) -> None:
        self.app = app
        self.store = store

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                told = header(scope, TERM_HEADER)
                if told is not None:
                    term = term_of(told)
                    if term > self.store.replication_term():  # rare: a write transaction, off the loop
                        await asyncio.to_thread(self.store.learn_term, term)
                method, path = scope["method"], route_path(scope)
                if is_write(method, path):
                    self._check(method, path)
            except DiffstoreError as error:
                await send_error(send, error, response_codec(header(scope, b"accept")), scope)
                return
        await self.app(scope, receive, send)

    def _check(self, method: str, path: str) -> None:
        try:
            self.store.check_writable()
        except Fenced:
            # a stepped-down primary still lets its replicas' holds go (the new primary deletes them)
            if not (method == "DELETE" and _HOLD_RELEASE.fullmatch(path)):
                raise


def replica_to_wire(store: Store, now_ms: int) -> Body:
    """``GET /replica``'s answer (raises :class:`NotReplica` on a primary)."""
    state = store.replica_state()
    if not state.following or state.primary is None:
        raise NotReplica("this server is not a replica")
    return {
        "primary": state.primary,
        "term": state.term,
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


def replication_to_wire(store: Store) -> Body:
    """``GET /replication``'s answer: any server's role, term, and whom it follows or stepped down for."""
    state = store.replica_state()
    body: Body = {"role": state.role, "term": state.term, "primary": None}
    if state.following:
        body["primary"] = state.primary
        body["replicaId"] = state.replica_id
    if state.fenced is not None:
        body["primary"] = state.fenced.primary
        body["fencedBy"] = {
            "primary": state.fenced.primary,
            "replicaId": state.fenced.replica_id,
            "term": state.fenced.term,
            "atMs": state.fenced.at_ms,
        }
    if state.promoted_at_ms is not None:
        body["promotedFrom"] = state.primary
        body["promotedAtMs"] = state.promoted_at_ms
    return body


@route(
    router,
    "GET",
    "/replication",
    answer=schemas.ReplicationResponse,
    summary="This server's role (primary, replica, fenced) and replication term",
)
async def replication(request: Request) -> Response:
    def work(x: Exchange) -> Body:
        return replication_to_wire(x.store)

    return await handle(request, work)


@route(
    router,
    "POST",
    "/replica/promote",
    body=schemas.PromoteRequest,
    body_required=False,
    answer=schemas.PromoteResponse,
    summary="Stop following and accept writes, fencing the old primary (on a primary: 409 notReplica)",
)
async def promote(request: Request) -> Response:
    address = str(request.base_url).rstrip("/")
    config = config_of(request)
    token = config.replica_token

    def work(x: Exchange) -> Body:
        f = Fields(x.body if x.body is not None else {}, x.codec)
        wait_ms = f.integer_opt("waitMs", 0, MAX_WAIT_MS)
        asked = Promotion(address, f.flag("force", False), DEFAULT_WAIT_MS if wait_ms is None else wait_ms)
        return promote_store(x.store, token, asked, config.replica_ca_file, config.replica_cert)

    return await handle(request, work, Limit.OTHER)


@route(
    router,
    "POST",
    "/replica/stepDown",
    body=schemas.StepDownRequest,
    answer=schemas.ReplicationResponse,
    summary="A new primary, promoted at term, tells this one to step down (then it refuses writes: fenced)",
)
async def step_down(request: Request) -> Response:
    def work(x: Exchange) -> Body:
        f = Fields(x.body, x.codec)
        x.store.step_down(f.integer("term", 1, _TERM_MAX), f.text("primary"), f.text_opt("replicaId"))
        return replication_to_wire(x.store)

    return await handle(request, work, Limit.OTHER)


@route(
    router,
    "POST",
    "/replica/stepUp",
    body=schemas.StepUpRequest,
    answer=schemas.ReplicationResponse,
    summary="The promotion that stepped this primary down at term was abandoned: it takes writes again",
)
async def step_up(request: Request) -> Response:
    def work(x: Exchange) -> Body:
        f = Fields(x.body, x.codec)
        x.store.step_up(f.integer("term", 1, _TERM_MAX), f.text_opt("replicaId"))
        return replication_to_wire(x.store)

    return await handle(request, work, Limit.OTHER)
