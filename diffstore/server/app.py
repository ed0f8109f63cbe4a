"""The app factory: routes, fast lane, error handlers, authentication, long-poll hub, OpenAPI document."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI

from diffstore.guides import guide
from diffstore.server import console, docs, metrics
from diffstore.server.audit import AuditTrail
from diffstore.server.auth import RouteTable, ScopedAuth
from diffstore.server.budget import BodyBudget, Budget
from diffstore.server.config import Limit, ServerConfig
from diffstore.server.errors import install_error_handlers
from diffstore.server.fastlane import FastLane
from diffstore.server.longpoll import RAW_SEND, CommitHub
from diffstore.server.openapi import build_openapi
from diffstore.server.overview_watch import OverviewWatch
from diffstore.server.routes import FAST_LANE, ROUTERS
from diffstore.server.routes.replica import WriteGate, leader_url
from diffstore.server.synchronous import SynchronousReplication
from diffstore.server.tokens import Tokens

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

    from diffstore.engine.store import Store

DESCRIPTION = f"""\
The diffstore collection API, wire-compatible with diffbelt.

The protocol (semantics of generations, readers, diffs and phantoms; error codes; limits) is described in
[the protocol guide]({guide("protocol.md")}); lineage in [the lineage guide]({guide("lineage.md")}), read
replicas in [the replicas guide]({guide("replicas.md")}).

Bodies are JSON (`application/json`) or msgpack (`application/msgpack`, every EncodedString a raw `bin`);
answers are msgpack when `Accept` asks for it. Errors are `{{"error": code, "reason": text}}` with a 4xx
status.
"""


class _App(FastAPI):
    """FastAPI, keeping the server's own ``send`` in the scope for the long-poll fan-out (see longpoll)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[RAW_SEND] = send
        await super().__call__(scope, receive, send)


def create_app(store: Store, config: ServerConfig | None = None) -> FastAPI:
    """Builds the ASGI app over an open store; the caller owns the store (and closes it after the server).

    Args:
        store: the open store every route works on.
        config: limits, token and long-poll settings (defaults when omitted).
    """
    config = config or ServerConfig()
    hub = CommitHub()
    watch = OverviewWatch(store)
    hub.on_close.append(watch.close)  # the overview's long polls answer at shutdown too
    server_metrics = metrics.ServerMetrics(store, hub)
    tokens = Tokens(config.token, config.token_file, config.token_poll_s)
    synchronous = SynchronousReplication(
        store,
        config.synchronous,
        config.synchronous_timeout_s or None,  # 0: wait for ever
        server_metrics.synchronous_wait_seconds.observe,
    )
    server_metrics.watch_synchronous(synchronous)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # reads on the event loop (the fast lane's point reads) never wait for a writer thread
        store.never_wait_for_writers_here()
        hub.attach(store, asyncio.get_running_loop())
        watch.attach(asyncio.get_running_loop())
        server_metrics.attach()
        app.state.large_bodies = asyncio.Semaphore(1)  # bound to this loop
        tokens.start()
        try:
            yield
        finally:
            tokens.stop()
            synchronous.close()
            server_metrics.detach()
            hub.close()
            hub.detach()

    app = _App(
        title="diffstore",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        redirect_slashes=False,
        docs_url=None,  # served by diffstore.server.docs, with assets from the package
        redoc_url=None,
        openapi_url=None,  # ... and so is /openapi.json, declared open like them
    )
    app.state.store = store
    app.state.config = config
    app.state.hub = hub
    app.state.overview_watch = watch
    app.state.budget = Budget(config.inflight_body_max_bytes, config.inflight_connection_max_bytes)
    app.state.large_bodies = asyncio.Semaphore(1)  # see exchange.handle
    app.state.metrics = server_metrics
    app.state.tokens = tokens
    app.state.synchronous = synchronous
    # whom a replica's readOnlyReplica answer names as the leader (replaceable: an elected leader)
    app.state.leader_url = lambda: leader_url(store)
    routers = (*ROUTERS, docs.router, console.router, console.shell, metrics.router)
    for router in routers:
        app.include_router(router)
    install_error_handlers(app)
    # in front of the router, inside the authentication: the hottest routes skip FastAPI's per-request work
    app.add_middleware(FastLane, store=store, config=config, hub=hub, handlers=FAST_LANE)
    # any store may follow a primary or step down (the gate asks the store); no store: only the schema
    if store is not None:
        app.add_middleware(WriteGate, store=store, leader=lambda: app.state.leader_url())
    # outside the fast lane, so that its bodies count too; inside the authentication, so that a refused
    # client holds nothing
    largest = max(config.limit(kind) for kind in Limit)
    app.add_middleware(BodyBudget, budget=app.state.budget, largest_body=largest)
    # always there: without tokens every request is let in, but the audit trail still logs admin actions
    routes = RouteTable(route for router in routers for route in router.routes)
    audit = AuditTrail(server_metrics if config.metrics else None)
    app.add_middleware(ScopedAuth, tokens=tokens, routes=routes, audit=audit)
    if config.metrics:  # outermost: requests the authentication refuses count too
        app.add_middleware(
            metrics.HttpMetrics,
            metrics=server_metrics,
            routes=[route for router in routers for route in router.routes],
            fast_lane=frozenset(FAST_LANE),
        )
    app.openapi = lambda: build_openapi(app)  # type: ignore[method-assign]
    return app
