"""One module per resource; each exposes ``router``. Routes: parse, call one engine method, serialize."""

from __future__ import annotations

from fastapi import APIRouter

from diffstore.server.fastlane import Handler
from diffstore.server.routes import (
    backup,
    collections,
    diff,
    digest,
    generation,
    generations,
    ha,
    health,
    items,
    leases,
    lineage,
    phantom,
    producers,
    query,
    readers,
    refs,
    replica,
    revert,
    splits,
    stream,
)

ROUTERS: tuple[APIRouter, ...] = (
    health.router,
    collections.router,
    stream.router,
    items.router,
    readers.router,
    generation.router,
    phantom.router,
    query.router,
    diff.router,
    producers.router,
    splits.router,
    leases.router,
    lineage.router,
    backup.router,
    generations.router,
    refs.router,
    revert.router,
    replica.router,
    digest.router,
    ha.router,
)

# served in raw ASGI before the router (see diffstore.server.fastlane); the routers above document them
FAST_LANE: dict[tuple[str, str], Handler] = {
    ("GET", "generationId/stream"): stream.serve_stream,
    ("POST", "get"): items.serve_get,
}
