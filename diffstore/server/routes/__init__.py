"""One module per resource; each exposes ``router``. Routes: parse, call one engine method, serialize."""

from __future__ import annotations

from fastapi import APIRouter

from diffstore.server.routes import (
    collections,
    diff,
    generation,
    health,
    items,
    phantom,
    producers,
    query,
    readers,
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
)
