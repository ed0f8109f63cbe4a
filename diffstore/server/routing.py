"""Route registration: every route answers with and without its trailing slash, and documents its shapes.

Routes read raw bodies (see :mod:`diffstore.server.exchange`), so FastAPI cannot infer their schemas;
``route`` attaches the request and response models of :mod:`diffstore.server.schemas` by reference
instead (the components are added by :mod:`diffstore.server.openapi`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter
from pydantic import BaseModel

from diffstore.guides import guide
from diffstore.server import schemas
from diffstore.wire import MSGPACK_CONTENT_TYPE
from diffstore.wire_columns import COLUMNS_CONTENT_TYPE

F = TypeVar("F", bound=Callable[..., Any])

_MEDIA = ("application/json", MSGPACK_CONTENT_TYPE)


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
) -> Callable[[F], F]:
    """Registers ``path`` (shown in the schema) and its slash twin (hidden) for one method.

    Args:
        answer: the model of the 200 response.
        body: the model of the request body, if the route takes one.
        body_required: whether an empty body is refused.
        columns: the model of the 200 response in the columns form (query and diff pages), if any.
    """
    extra: dict[str, Any] = {}
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
