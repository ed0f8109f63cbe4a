"""The published OpenAPI document: FastAPI's generated paths plus the wire models as components.

Answers in ``application/msgpack`` have the JSON shapes except that every EncodedString is a raw ``bin``, so
each component has a msgpack twin (``<Name>Msgpack``) where ``ES`` is a binary string, and every msgpack
answer refers to the twin. Request bodies keep the JSON shapes under both media types: in msgpack the server
takes an EncodedString as a ``bin`` or as the JSON-shaped map.
"""

from __future__ import annotations

import copy
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
    _add_msgpack_answers(document)
    # a server started with --token wants it on every route (Swagger UI's "Authorize" takes it); one
    # without wants none: both are allowed here, the schema is the same for both
    document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    document["security"] = [{}, {"bearer": []}]
    app.openapi_schema = document
    return document


_REF = "#/components/schemas/"
_MSGPACK = "application/msgpack"
_BIN = {"type": "string", "format": "binary", "description": "an EncodedString, as a raw msgpack bin"}


def _twin(node: Any) -> Any:
    """``node`` with every reference to ``ES`` made a binary string and every other one to its twin."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(_REF):
            return copy.deepcopy(_BIN) if ref == f"{_REF}ES" else {"$ref": f"{ref}Msgpack"}
        return {key: _twin(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_twin(value) for value in node]
    return node


def _add_msgpack_answers(document: dict[str, Any]) -> None:
    components = document["components"]["schemas"]
    for name in [n for n in components if n != "ES"]:
        twin = _twin(components[name])
        twin["title"] = f"{name}Msgpack"
        twin["description"] = f"{name} as msgpack: the same shape, every EncodedString a raw bin."
        components[f"{name}Msgpack"] = twin
    for operations in document["paths"].values():
        for operation in operations.values():
            for answer in operation.get("responses", {}).values():
                media = answer.get("content", {}).get(_MSGPACK)
                if media is not None and "schema" in media:
                    media["schema"] = _twin(media["schema"])
