"""``GET /collections/{c}/refs?ref=TEXT``: the generation a ref names (``@current``, ``@open``, ``~N``,
``@reader:[OWNER/]NAME``, ``@`` and an ISO time, or an id's text form; see ``diffstore.engine.refs``) and
its commit time. The CLI and the console resolve every ref they are given here."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request, Response

from diffstore.server import schemas
from diffstore.server.exchange import Exchange, handle
from diffstore.server.routing import route
from diffstore.server.scopes import TokenScope
from diffstore.wire import Body

router = APIRouter(tags=["generations"])


@route(
    router,
    "GET",
    "/collections/{c}/refs",
    answer=schemas.RefAnswer,
    summary="The generation a ref names (@current, @open, ~N, @reader:NAME, @TIME or an id) and its time",
    scope=TokenScope.READ,
)
async def resolve_ref(
    request: Request,
    c: str,
    ref: str = Query(
        description="@current, @open, ~N, @reader:NAME, @reader:OWNER/NAME, @2026-11-25T10:00:00Z (or an "
        "offset), or a generation id in its text form (UTF-8, or base64: and its base64)"
    ),
) -> Response:
    def work(x: Exchange) -> Body:
        resolved = x.store.collection(c).resolve_ref(ref)
        return {"generationId": x.out.es(resolved.generation_id), "committedAtMs": resolved.committed_at_ms}

    return await handle(request, work)
