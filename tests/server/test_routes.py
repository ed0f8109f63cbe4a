"""Route table: each documented route has its trailing-slash twin; the document names SPEC §3's routes."""

from __future__ import annotations

from typing import cast

from fastapi.routing import APIRoute

from diffstore.engine.store import Store
from diffstore.server import create_app
from diffstore.server.routes import ROUTERS

SPEC_ROUTES = {
    ("GET", "/collections/"),
    ("POST", "/collections/"),
    ("GET", "/collections/{c}"),
    ("DELETE", "/collections/{c}"),
    ("GET", "/collections/{c}/generationId/stream"),
    ("POST", "/collections/{c}/get"),
    ("POST", "/collections/{c}/getKeysAround"),
    ("POST", "/collections/{c}/put"),
    ("POST", "/collections/{c}/putMany"),
    ("GET", "/collections/{c}/readers/"),
    ("POST", "/collections/{c}/readers/"),
    ("PUT", "/collections/{c}/readers/{name}"),
    ("DELETE", "/collections/{c}/readers/{name}"),
    ("POST", "/collections/{c}/generation/start"),
    ("POST", "/collections/{c}/generation/commit"),
    ("POST", "/collections/{c}/generation/abort"),
    ("POST", "/collections/{c}/phantom/start"),
    ("POST", "/collections/{c}/query/"),
    ("GET", "/collections/{c}/query/{cursor_id}"),
    ("DELETE", "/collections/{c}/query/{cursor_id}"),
    ("POST", "/collections/{c}/diff/"),
    ("GET", "/collections/{c}/diff/{cursor_id}"),
    ("DELETE", "/collections/{c}/diff/{cursor_id}"),
    ("GET", "/collections/{c}/producers/{producer_id}"),
    ("GET", "/collections/{c}/splits"),
    ("POST", "/collections/{c}/lineage"),
    ("GET", "/collections/{c}/leases/"),
    ("POST", "/collections/{c}/leases/{name}/acquire"),
    ("POST", "/collections/{c}/leases/{name}/renew"),
    ("POST", "/collections/{c}/leases/{name}/release"),
    ("GET", "/healthz"),
    ("GET", "/backup"),  # SPEC §8
    ("GET", "/replica"),  # SPEC §8
    ("POST", "/replica/promote"),  # SPEC §8
    ("GET", "/replication"),  # SPEC §9: any server's role and term (docs/replicas.md)
    ("POST", "/replica/stepDown"),  # SPEC §9: fencing the old primary
    ("POST", "/replica/stepUp"),  # an abandoned promotion lifts its fencing
    ("GET", "/ha"),  # SPEC §9: a fail-over member's role (docs/failover.md)
}
BEYOND_SPEC_ROUTES = {
    ("POST", "/collections/{c}/phantom/changes"),  # transform previews (docs/protocol.md)
    ("POST", "/collections/{c}/getMany"),  # many point reads in one request (docs/protocol.md)
    ("POST", "/collections/{c}/generations/records"),  # what replicas follow (docs/replicas.md)
    ("GET", "/collections/{c}/refs"),  # what a ref names (docs/protocol.md, "Refs")
    ("POST", "/collections/{c}/revert"),  # SPEC §8
    ("GET", "/collections/{c}/retention"),  # SPEC §9 (docs/protocol.md, "Retention")
    ("PUT", "/collections/{c}/retention"),  # SPEC §9
    ("GET", "/collections/{c}/digest"),  # SPEC §9 Integrity
    ("GET", "/collections/{c}/digests"),  # every generation's digest, what check --against compares
}


def test_every_route_has_its_slash_twin_and_spec_routes_are_documented() -> None:
    app = create_app(cast(Store, None))
    routes = {
        (method, route.path): route
        for router in ROUTERS
        for route in router.routes
        if isinstance(route, APIRoute)
        for method in route.methods - {"HEAD"}
    }
    documented = {key for key, route in routes.items() if route.include_in_schema}
    assert documented == SPEC_ROUTES | BEYOND_SPEC_ROUTES
    for method, path in documented:
        twin = path[:-1] if path.endswith("/") else path + "/"
        assert (method, twin) in routes, (method, twin)
    paths = app.openapi()["paths"]
    assert {(m.upper(), p) for p, ops in paths.items() for m in ops} >= SPEC_ROUTES


AS_OF_FIELDS = {
    ("POST", "/collections/{c}/get"): {"asOfMs"},
    ("POST", "/collections/{c}/getMany"): {"asOfMs"},
    ("POST", "/collections/{c}/getKeysAround"): {"asOfMs"},
    ("POST", "/collections/{c}/query/"): {"asOfMs"},
    ("POST", "/collections/{c}/diff/"): {"fromAsOfMs", "toAsOfMs"},
}
"""SPEC §8: the routes that read as of an instant, and their fields (wire_requests parses them)."""


def test_as_of_fields_are_documented_where_they_are_taken() -> None:
    document = create_app(cast(Store, None)).openapi()
    components = document["components"]["schemas"]
    found: dict[tuple[str, str], set[str]] = {}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            content = operation.get("requestBody", {}).get("content", {})
            for media in ("application/json", "application/msgpack"):
                ref = content.get(media, {}).get("schema", {}).get("$ref", "")
                schema = components[ref.rsplit("/", 1)[-1]] if ref else {}
                properties = schema.get("properties", {})
                fields = {name for name in properties if name.endswith("sOfMs")}
                for name in fields:
                    # Unix milliseconds: an integer >= 0 (or null: absent)
                    kinds = properties[name].get("anyOf", [properties[name]])
                    assert {"type": "integer", "minimum": 0} in kinds, (path, name, kinds)
                if fields:
                    found.setdefault((method.upper(), path), set()).update(fields)
    assert found == AS_OF_FIELDS
