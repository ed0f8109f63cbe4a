"""The operator console (``GET /ui/``) and the two API routes it needs beyond SPEC §3.

The console is plain HTML, CSS and JavaScript in ``static/`` (package data: a wheel carries it), with no
build step and nothing loaded from another host; it talks to the JSON API with ``fetch``. Its static shell
(``/``, ``/ui``, ``/ui/*``) is served without the token -- it holds no data -- and the page asks for the
token, which it then sends as a bearer header on every API call.

Routes added for it (documented in ``docs/console.md``):

- ``GET /overview``: every collection with its current and next generation and its readers, each with its
  lag -- the number of committed generations of its target after the reader's generation (generation
  ids are opaque bytes, so the distance is counted) -- in one call, so the first page needs one request
  whatever the number of collections.
- ``GET /overview/changes?since=V&timeoutMs=T``: a long poll answering ``{"version": V'}`` as soon as the
  overview's version (a digest of the collections and readers) differs from ``since``, or ``since`` at the
  timeout. Waiting costs no work per waiter: commits of any process, and any other write, start one shared
  check (:mod:`diffstore.server.overview_watch`).
- ``GET /collections/{c}/generations?limit=N[&before=G]``: the committed generations, newest first, with
  their commit time, changed keys and metadata (the console's History view and the commit time next to
  every generation id it shows; read replicas and ``diffstore log`` page back with ``before``).
"""

from __future__ import annotations

import time
from importlib import resources
from pathlib import Path
from typing import Literal

from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.responses import FileResponse, RedirectResponse

from diffstore.engine import overview
from diffstore.server import schemas
from diffstore.server.exchange import Exchange, handle, respond
from diffstore.server.negotiation import response_codec
from diffstore.server.routes.ha import ha_to_wire
from diffstore.server.routes.replica import replica_to_wire
from diffstore.server.routing import declare, route
from diffstore.server.scopes import TokenScope
from diffstore.wire import Body, decode_es

CHANGES_TIMEOUT_MAX_MS = 60_000
STATIC = Path(str(resources.files(__name__) / "static"))
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css"}

router = APIRouter(tags=["console"])
shell = APIRouter(include_in_schema=False)


@shell.get("/")
@shell.get("/ui")
@declare(TokenScope.OPEN)
async def to_console() -> RedirectResponse:
    return RedirectResponse("/ui/", status_code=307)


@shell.get("/ui/")
@shell.get("/ui/{name}")
@declare(TokenScope.OPEN)
async def static_file(name: str = "index.html") -> FileResponse:
    path = STATIC / name
    if "/" in name or name.startswith(".") or path.suffix not in _TYPES or not path.is_file():
        raise HTTPException(404)
    # no-cache: a newer diffstore's console replaces the old one at once (revalidation is cheap)
    return FileResponse(path, media_type=_TYPES[path.suffix], headers={"cache-control": "no-cache"})


def overview_to_wire(x: Exchange) -> Body:
    es, es_opt = x.out.es, x.out.es_opt
    room = overview.space_of(x.store)
    return {
        "collections": [
            {
                "name": state.name,
                "isManual": state.manual,
                "generationId": es(state.generation_id),
                "nextGenerationId": es_opt(state.next_generation_id),
                "readers": [
                    {
                        "readerName": reader.name,
                        "target": reader.target,
                        "targetIsCollection": reader.target_is_collection,
                        "generationId": es_opt(reader.generation_id),
                        "lagGenerations": reader.lag,
                    }
                    for reader in state.readers
                ],
            }
            for state in overview.overview(x.store)
        ],
        "storeSizeBytes": overview.size_bytes(x.store),
        "storeFileBytes": room.file_bytes,
        "storeFreePages": room.free_pages,
        "storePageBytes": room.page_bytes,
        "replica": replica_to_wire(x.store, time.time_ns() // 1_000_000) if x.store.read_only() else None,
        "ha": ha_to_wire(x.store) if x.store.ha_record() is not None else None,
    }


@route(
    router,
    "GET",
    "/overview",
    answer=schemas.Overview,
    summary="Collections, readers and reader lag",
    scope=TokenScope.READ,
)
async def get_overview(request: Request) -> Response:
    return await handle(request, overview_to_wire)


@route(
    router,
    "GET",
    "/collections/{c}/generations",
    answer=schemas.GenerationList,
    summary="The committed generations, newest first, with commit time, changed keys and metadata",
    scope=TokenScope.READ,
)
async def list_generations(
    request: Request,
    c: str,
    limit: int = Query(50, ge=1, le=1000, description="how many (1..1000)"),
    before: str | None = Query(
        None, description="only generations below this one (the last page's nextBefore)"
    ),
    beforeEncoding: Literal["utf8", "base64"] = Query("utf8"),  # noqa: N803 (the wire's spelling)
) -> Response:
    before_id = None if before is None else decode_es({"value": before, "encoding": beforeEncoding}, "before")

    def work(x: Exchange) -> Body:
        infos, more = x.store.collection(c).history(before_id, limit)
        items: list[Body] = []
        for info in infos:
            item: Body = {
                "generationId": x.out.es(info.generation_id),
                "committedAtMs": info.committed_at_ms,
                "changedKeys": info.changed_keys,
                "metadata": info.metadata,
            }
            if info.collected:  # reads, diffs and lineage there answer 410: offer none of them
                item["collected"] = True
            items.append(item)
        body: Body = {"items": items}
        if more:  # read replicas and `diffstore log` page back through a long history
            body["nextBefore"] = x.out.es(infos[-1].generation_id)
        return body

    return await handle(request, work)


@route(
    router,
    "GET",
    "/overview/changes",
    answer=schemas.OverviewVersion,
    summary="Long poll: the overview's version, as soon as it differs from since",
    scope=TokenScope.READ,
)
async def overview_changes(
    request: Request,
    since: str | None = Query(None, description="the version the caller has (absent: answer at once)"),
    timeoutMs: int = Query(30_000, ge=0, le=CHANGES_TIMEOUT_MAX_MS),  # noqa: N803 (the wire's spelling)
) -> Response:
    watch = request.app.state.overview_watch
    codec = response_codec(request.headers.get("accept"))
    if since is None:
        current = await watch.current()
    else:
        current = await watch.wait(since, timeoutMs / 1000)
    return respond(codec.dumps({"version": current}), codec)
