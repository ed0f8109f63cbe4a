"""The published OpenAPI document: FastAPI's generated paths plus the wire models as components."""

from __future__ import annotations

import inspect
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from diffstore.server import schemas


def _wire_models() -> list[type[BaseModel]]:
    return [
        obj
        for name, obj in vars(schemas).items()
        if inspect.isclass(obj)
        and issubclass(obj, BaseModel)
        and not name.startswith("_")
        and obj.__module__ == schemas.__name__
    ]


def build_openapi(app: FastAPI) -> dict[str, Any]:
    """Generates (once) the schema, with every model of :mod:`diffstore.server.schemas` as a component."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    document = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    _, defs = models_json_schema(
        [(model, "validation") for model in _wire_models()], ref_template="#/components/schemas/{model}"
    )
    components = document.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in defs.get("$defs", {}).items():
        components.setdefault(name, schema)
    app.openapi_schema = document
    return document
