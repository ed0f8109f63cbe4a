"""``/docs`` (Swagger UI) and ``/redoc`` with their scripts and styles served from the package, not a CDN.

The assets are those shipped by the ``fastapi-offline`` package (Swagger UI and ReDoc, under their own
licenses, which that package carries); nothing is loaded from another host, so the pages work offline.
So is the API's description, ``/openapi.json``. They are open when a token is set, as the console's
shell is (they hold no data, see :mod:`diffstore.server.auth`): the console links to them.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse

from diffstore.server.routing import declare
from diffstore.server.scopes import TokenScope

router = APIRouter(include_in_schema=False)

ASSETS = Path(str(resources.files("fastapi_offline") / "static"))
_PREFIX = "/docs-assets"
_FILES = frozenset({"swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png"})


@router.get("/openapi.json")
@declare(TokenScope.OPEN)
async def openapi_document(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get("/docs")
@declare(TokenScope.OPEN)
async def swagger_ui() -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="diffstore API",
        swagger_js_url=f"{_PREFIX}/swagger-ui-bundle.js",
        swagger_css_url=f"{_PREFIX}/swagger-ui.css",
        swagger_favicon_url=f"{_PREFIX}/favicon.png",
    )


@router.get("/redoc")
@declare(TokenScope.OPEN)
async def redoc() -> HTMLResponse:
    return get_redoc_html(
        openapi_url="/openapi.json",
        title="diffstore API",
        redoc_js_url=f"{_PREFIX}/redoc.standalone.js",
        redoc_favicon_url=f"{_PREFIX}/favicon.png",
        with_google_fonts=False,
    )


@router.get(_PREFIX + "/{name}")
@declare(TokenScope.OPEN)
async def asset(name: str) -> FileResponse:
    if name not in _FILES:
        raise HTTPException(404)
    return FileResponse(ASSETS / name, headers={"cache-control": "max-age=86400"})
