"""Route registration: every route answers with and without its trailing slash, documents its shapes, and
declares the token scope it needs (and whether the audit trail logs it).

Routes read raw bodies (see :mod:`diffstore.server.exchange`), so FastAPI cannot infer their schemas;
``route`` attaches the request and response models of :mod:`diffstore.server.schemas` by reference
instead (the components are added by :mod:`diffstore.server.openapi`).

Every route's scope is declared where the route is, by ``route(..., scope=...)`` (or :func:`declare` for
the few registered otherwise): :mod:`diffstore.server.auth` builds its table from the app's routes, a
route without a declaration needs ``admin`` (refusing is the safe mistake), and a test walks every route
of the app and fails on one without.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import APIRouter
from pydantic import BaseModel

from diffstore.guides import guide
from diffstore.server import schemas
from diffstore.server.scopes import TokenScope
from diffstore.wire import MSGPACK_CONTENT_TYPE
from diffstore.wire_columns import COLUMNS_CONTENT_TYPE

F = TypeVar("F", bound=Callable[..., Any])

_MEDIA = ("application/json", MSGPACK_CONTENT_TYPE)
_ACCESS = "__diffstore_access__"


@dataclass(frozen=True, slots=True)
class Access:
    """What a route needs: ``scope``, and ``audit``, the action the audit trail logs it as (None: not
    logged; see :mod:`diffstore.server.audit`). ``collection_in_body``: the route names its collection in
    its body, so the glob is checked by the route itself (``auth.require``), the scope in front of it."""

    scope: TokenScope
    audit: str | None = None
    collection_in_body: bool = False


def declare(
    scope: TokenScope, audit: str | None = None, collection_in_body: bool = False
) -> Callable[[F], F]:
    """Declares the scope (and audit action) of an endpoint registered without :func:`route`."""

    def mark(endpoint: F) -> F:
        setattr(endpoint, _ACCESS, Access(scope, audit, collection_in_body))
        return endpoint

    return mark


def access_of(endpoint: object) -> Access | None:
    """The declaration of an endpoint, None if it has none."""
    found = getattr(endpoint, _ACCESS, None)
    return found if isinstance(found, Access) else None


def schema_ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _content(model: type[BaseModel]) -> dict[str, Any]:
    return {media: {"schema": schema_ref(model)} for media in _MEDIA}


def route(
    router: APIRouter,
    method: str,
    path: str,
    *,
    answer: type[BaseModel] = schemas.Empty,
    body: type[BaseModel] | None = None,
    body_required: bool = True,
    summary: str | None = None,
    tags: list[str] | None = None,
    columns: type[BaseModel] | None = None,
    scope: TokenScope | None = None,
    audit: str | None = None,
    collection_in_body: bool = False,
) -> Callable[[F], F]:
    """Registers ``path`` (shown in the schema) and its slash twin (hidden) for one method.

    Args:
        answer: the model of the 200 response.
        body: the model of the request body, if the route takes one.
        body_required: whether an empty body is refused.
        columns: the model of the 200 response in the columns form (query and diff pages), if any.
        scope: the token scope the route needs (shown in the schema as ``x-diffstore-scope``).
        audit: the audit trail's name of the action, when the route is one it logs.
        collection_in_body: the collection is named in the body; the route checks the token's glob.
    """
    extra: dict[str, Any] = {}
    if scope is not None:
        extra["x-diffstore-scope"] = scope.label if scope is not TokenScope.OPEN else "none"
    if body is not None:
        extra["requestBody"] = {"required": body_required, "content": _content(body)}
    responses: dict[int | str, dict[str, Any]] = {
        200: {"description": "OK", "content": _content(answer)},
        "default": {
            "description": f"an error (codes: [the protocol]({guide('protocol.md')}))",
            "content": _content(schemas.Error),
        },
    }
    if columns is not None:
        responses[200]["content"][COLUMNS_CONTENT_TYPE] = {"schema": schema_ref(columns)}
    twin = path[:-1] if path.endswith("/") else path + "/"

    def register(endpoint: F) -> F:
        if scope is not None:
            declare(scope, audit, collection_in_body)(endpoint)
        for variant, shown in ((path, True), (twin, False)):
            router.add_api_route(
                variant,
                endpoint,
                methods=[method],
                include_in_schema=shown,
                openapi_extra=extra or None,
                responses=responses,
                summary=summary,
                tags=list(tags or []),
                response_model=None,
            )
        return endpoint

    return register
