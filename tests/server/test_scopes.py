"""Scoped tokens over a real server: every route declares its scope, and the scope matrix -- every route x
every scope x a collection inside and outside the token's glob -- with nothing changed by a refusal."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from diffstore.server import ServerConfig, create_app
from diffstore.server.auth import walk_routes
from diffstore.server.routing import access_of
from diffstore.server.scopes import TokenScope
from tests.server.conftest import Live, live_server

TOKENS = {
    "viewer": ("viewer-secret-0123456789", "read", None),
    "writer": ("writer-secret-0123456789", "write", "in-*"),
    "ops": ("ops-secret-0123456789", "admin", None),
    "teamadmin": ("teamadmin-secret-0123456789", "admin", "in-*"),
}
INSIDE, OUTSIDE = "in-a", "out-b"


def token_file_text(tokens: dict[str, tuple[str, str, str | None]]) -> str:
    lines = ["# the test's tokens", ""]
    for name, (secret, scope, glob) in tokens.items():
        lines.append(f"{name} {secret} {scope}" + (f" {glob}" if glob else "") + "  # a comment")
    return "\n".join(lines) + "\n"


def bearer(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {TOKENS[name][0]}"}


def test_every_route_of_the_app_declares_its_scope() -> None:
    app = create_app(None)  # type: ignore[arg-type]
    undeclared = []
    seen = 0
    for route in walk_routes(app.routes):
        endpoint = getattr(route, "endpoint", None)
        if endpoint is None:
            continue
        seen += 1
        if access_of(endpoint) is None:
            undeclared.append(f"{sorted(getattr(route, 'methods', ()))} {getattr(route, 'path', route)}")
    assert seen > 90  # every route, slash twins, the console's shell, the docs, /metrics, /backup
    assert undeclared == []


def test_the_openapi_document_shows_each_routes_scope() -> None:
    document = create_app(None).openapi()  # type: ignore[arg-type]
    scopes = {
        (method.upper(), path): operation.get("x-diffstore-scope")
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
    }
    assert scopes[("POST", "/collections/{c}/get")] == "read"
    assert scopes[("POST", "/collections/{c}/put")] == "write"
    assert scopes[("DELETE", "/collections/{c}")] == "admin"
    assert scopes[("GET", "/healthz")] == "none"
    assert None not in scopes.values(), [k for k, v in scopes.items() if v is None]


# --- the matrix -----------------------------------------------------------------------------------------

# What each non-GET route needs (every GET but /backup is a read); a route missing here fails the matrix.
NEEDS: dict[tuple[str, str], TokenScope] = {
    ("POST", "/collections/"): TokenScope.ADMIN,
    ("DELETE", "/collections/{c}"): TokenScope.ADMIN,
    ("PUT", "/collections/{c}/retention"): TokenScope.ADMIN,
    ("POST", "/collections/{c}/revert"): TokenScope.ADMIN,
    ("POST", "/replica/promote"): TokenScope.ADMIN,
    ("POST", "/replica/stepDown"): TokenScope.ADMIN,
    ("POST", "/replica/stepUp"): TokenScope.ADMIN,
    ("GET", "/backup"): TokenScope.ADMIN,
    ("POST", "/collections/{c}/put"): TokenScope.WRITE,
    ("POST", "/collections/{c}/putMany"): TokenScope.WRITE,
    ("POST", "/collections/{c}/generation/start"): TokenScope.WRITE,
    ("POST", "/collections/{c}/generation/commit"): TokenScope.WRITE,
    ("POST", "/collections/{c}/generation/abort"): TokenScope.WRITE,
    ("POST", "/collections/{c}/phantom/start"): TokenScope.WRITE,
    ("POST", "/collections/{c}/readers/"): TokenScope.WRITE,
    ("PUT", "/collections/{c}/readers/{name}"): TokenScope.WRITE,
    ("DELETE", "/collections/{c}/readers/{name}"): TokenScope.WRITE,
    ("POST", "/collections/{c}/leases/{name}/acquire"): TokenScope.WRITE,
    ("POST", "/collections/{c}/leases/{name}/renew"): TokenScope.WRITE,
    ("POST", "/collections/{c}/leases/{name}/release"): TokenScope.WRITE,
    ("POST", "/collections/{c}/get"): TokenScope.READ,
    ("POST", "/collections/{c}/getMany"): TokenScope.READ,
    ("POST", "/collections/{c}/getKeysAround"): TokenScope.READ,
    ("POST", "/collections/{c}/query/"): TokenScope.READ,
    ("DELETE", "/collections/{c}/query/{cursor_id}"): TokenScope.READ,
    ("POST", "/collections/{c}/diff/"): TokenScope.READ,
    ("DELETE", "/collections/{c}/diff/{cursor_id}"): TokenScope.READ,
    ("POST", "/collections/{c}/lineage"): TokenScope.READ,
    ("POST", "/collections/{c}/generations/records"): TokenScope.READ,
    ("POST", "/collections/{c}/phantom/changes"): TokenScope.READ,
}

ES = {"value": "k1"}
BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/collections/"): {"collectionName": "{c}-new", "isManual": True},
    ("PUT", "/collections/{c}/retention"): {"keepGenerations": 5},
    ("POST", "/collections/{c}/revert"): {"toGenerationId": {"value": "g2"}, "generationId": {"value": "g3"}},
    ("POST", "/replica/promote"): {},
    ("POST", "/replica/stepDown"): {"term": 7, "primary": "http://127.0.0.1:9"},
    ("POST", "/replica/stepUp"): {"term": 7},
    ("POST", "/collections/{c}/put"): {
        "item": {"key": ES, "value": {"value": "x"}},
        "generationId": {"value": "g3"},
    },
    ("POST", "/collections/{c}/putMany"): {
        "items": [{"key": ES, "value": None}],
        "generationId": {"value": "g3"},
    },
    ("POST", "/collections/{c}/generation/start"): {"generationId": {"value": "g4"}, "abortOutdated": True},
    ("POST", "/collections/{c}/generation/commit"): {"generationId": {"value": "g3"}},
    ("POST", "/collections/{c}/generation/abort"): {"generationId": {"value": "g3"}},
    ("POST", "/collections/{c}/phantom/start"): {},
    ("POST", "/collections/{c}/readers/"): {"readerName": "r9", "generationId": None},
    ("PUT", "/collections/{c}/readers/{name}"): {"generationId": {"value": "g2"}},
    ("POST", "/collections/{c}/leases/{name}/acquire"): {"owner": "thief", "ttlMs": 60_000},
    ("POST", "/collections/{c}/leases/{name}/renew"): {"owner": "holder", "version": 1},
    ("POST", "/collections/{c}/leases/{name}/release"): {"owner": "holder", "version": 1},
    ("POST", "/collections/{c}/get"): {"key": ES},
    ("POST", "/collections/{c}/getMany"): {"keys": [ES]},
    ("POST", "/collections/{c}/getKeysAround"): {"key": ES, "requireKeyExistance": False, "limit": 2},
    ("POST", "/collections/{c}/query/"): {"limit": 1},
    ("POST", "/collections/{c}/diff/"): {"fromGenerationId": None},
    ("POST", "/collections/{c}/lineage"): {"generationId": {"value": "g2"}},
    ("POST", "/collections/{c}/generations/records"): {"generationId": {"value": "g2"}},
    ("POST", "/collections/{c}/phantom/changes"): {"phantomId": {"value": "nope"}},
}
# run last among the allowed: they end the collection or the server's writes
DESTRUCTIVE = {("DELETE", "/collections/{c}"), ("POST", "/replica/stepDown"), ("POST", "/replica/promote")}


def needed(method: str, template: str) -> TokenScope:
    if (method, template) in NEEDS:
        return NEEDS[(method, template)]
    assert method == "GET", f"{method} {template}: add it to NEEDS"
    return TokenScope.READ


def allowed(token: str, scope: TokenScope, collection: str | None) -> bool:
    """The expectation, written out: read reads all; the glob bounds writes and admin actions."""
    _, has, glob = TOKENS[token]
    rank = {"read": TokenScope.READ, "write": TokenScope.WRITE, "admin": TokenScope.ADMIN}[has]
    if scope > rank:
        return False
    if scope == TokenScope.READ or glob is None:
        return True
    return collection is not None and collection.startswith("in-")


def fill(store: Any) -> None:
    """Two manual collections with history: committed generations, a moved reader, an open generation,
    a lease; and a collection created and deleted."""
    for name in (INSIDE, OUTSIDE):
        c = store.create_collection(name, manual=True)
        for gen in (b"g1", b"g2"):
            c.write_generation(gen, [(b"k1", gen), (b"k2", b"v" + gen)])
        c.create_reader("r1", None, b"g1")
        c.update_reader("r1", b"g2")
        c.start_generation(b"g3")
        c.put(b"k3", b"open", generation_id=b"g3")
        c.acquire_lease("l", "holder", 60_000)
    store.collection(INSIDE).create_reader("to-out", OUTSIDE, b"g2")
    store.create_collection("gone", manual=True)
    store.delete_collection("gone")


def snapshot(store: Any) -> Any:
    state: dict[str, Any] = {"replication": (store.replica_state().role, store.replica_state().term)}
    for info in store.collections():
        c = store.collection(info.name)
        current, next_id = c.generation_state()
        state[info.name] = {
            "generations": (current, next_id),
            "readers": sorted((r.name, r.collection, r.generation_id) for r in c.readers()),
            "leases": sorted((lease.name, lease.owner, lease.version) for lease in c.leases()),
            "records": [(r.key, r.value) for r in c.query()],
            "open": [(r.key, r.value) for r in c.query(generation_id=next_id)] if next_id else None,
            "retention": c.retention(),
            "history": [g.generation_id for g in c.history(limit=100)[0]],
        }
    return state


def concrete(template: str, collection: str | None) -> str:
    path = template.replace("{cursor_id}", "bm90LWEtY3Vyc29y").replace("{producer_id}", "p")
    path = path.replace("{name}", "r1" if "/readers/" in template else "l")
    return path.replace("{c}", collection or "")


@pytest.fixture
def scoped(tmp_path: Path) -> Iterator[Live]:
    path = tmp_path / "tokens"
    path.write_text(token_file_text(TOKENS))
    with live_server(tmp_path / "data", ServerConfig(token_file=str(path))) as running:
        fill(running.store)
        yield running


def cases(live: Live) -> list[tuple[str, str, str | None]]:
    found = []
    for route in walk_routes(live.app.routes):
        access = access_of(getattr(route, "endpoint", None))
        path = getattr(route, "path", "")
        if access is None or access.scope is TokenScope.OPEN or not getattr(route, "include_in_schema", True):
            if path != "/backup":  # the one route shown with another registration
                continue
        for method in sorted(set(getattr(route, "methods", ())) - {"HEAD"}):
            collections: list[str | None] = (
                [INSIDE, OUTSIDE] if ("{c}" in path or path == "/collections/") else [None]
            )
            for collection in collections:
                found.append((method, path, collection))
    return found


def request(live: Live, method: str, template: str, collection: str | None, token: str) -> httpx.Response:
    body = BODIES.get((method, template))
    if body is not None and collection is not None and template == "/collections/":
        body = {**body, "collectionName": f"{collection}-new"}
    url = concrete(template, None if template == "/collections/" else collection)
    return live.call(method, url, body, headers=bearer(token))


def test_the_scope_matrix(scoped: Live) -> None:
    live = scoped
    every = cases(live)
    assert len(every) > 70
    refused = [(c, t) for c in every for t in TOKENS if not allowed(t, needed(c[0], c[1]), c[2])]
    permitted = [(c, t) for c in every for t in TOKENS if allowed(t, needed(c[0], c[1]), c[2])]
    assert refused and permitted
    for (method, template, collection), token in refused:
        before = snapshot(live.store)
        answer = request(live, method, template, collection, token)
        what = f"{token}: {method} {template} on {collection}"
        assert answer.status_code == 403, (what, answer.status_code, answer.text)
        body = answer.json()
        assert body["error"] == "forbidden" and body["scope"] == needed(method, template).label, (what, body)
        assert token in body["reason"] and TOKENS[token][0] not in answer.text
        assert snapshot(live.store) == before, what
    permitted.sort(key=lambda case: (case[0][0], case[0][1]) in DESTRUCTIVE)
    for (method, template, collection), token in permitted:
        answer = request(live, method, template, collection, token)
        what = f"{token}: {method} {template} on {collection}"
        assert answer.status_code not in (401, 403) and answer.status_code < 500, (what, answer.text[:300])


def test_writes_inside_the_glob_work_and_outside_change_nothing(scoped: Live) -> None:
    live = scoped
    put = {"item": {"key": {"value": "w"}, "value": {"value": "1"}}, "generationId": {"value": "g3"}}
    assert live.call("POST", f"/collections/{INSIDE}/put", put, headers=bearer("writer")).status_code == 200
    assert live.store.collection(INSIDE).get(b"w", generation_id=b"g3").value == b"1"
    before = snapshot(live.store)
    answer = live.call("POST", f"/collections/{OUTSIDE}/put", put, headers=bearer("writer"))
    assert answer.status_code == 403
    assert answer.json()["reason"] == (
        "POST /collections/{c}/put needs scope write on collection 'out-b'; token 'writer' has write on in-*"
    )
    assert snapshot(live.store) == before
    # reads everywhere, whatever the glob
    assert (
        live.call("POST", f"/collections/{OUTSIDE}/get", {"key": ES}, headers=bearer("writer")).status_code
        == 200
    )


def test_creating_a_collection_checks_the_name_in_the_body(scoped: Live) -> None:
    live = scoped
    create = {"collectionName": "out-new", "isManual": True}
    before = snapshot(live.store)
    answer = live.call("POST", "/collections/", create, headers=bearer("teamadmin"))
    assert answer.status_code == 403 and answer.json()["scope"] == "admin", answer.text
    assert "on collection 'out-new'" in answer.json()["reason"]
    assert snapshot(live.store) == before
    create["collectionName"] = "in-new"
    assert live.call("POST", "/collections/", create, headers=bearer("teamadmin")).status_code == 200
    assert "in-new" in [c.name for c in live.store.collections()]


def test_server_wide_admin_actions_need_admin_on_every_collection(scoped: Live) -> None:
    live = scoped
    before = snapshot(live.store)
    answer = live.call(
        "POST", "/replica/stepDown", BODIES[("POST", "/replica/stepDown")], headers=bearer("teamadmin")
    )
    assert answer.status_code == 403
    assert "needs scope admin on every collection" in answer.json()["reason"]
    assert live.call("GET", "/backup", headers=bearer("writer")).status_code == 403
    assert snapshot(live.store) == before


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({}, "missing bearer token"),
        ({"authorization": "Bearer nope"}, "wrong bearer token"),
        ({"authorization": "Basic " + TOKENS["ops"][0]}, "wrong bearer token"),
        ({"authorization": "Bearer " + TOKENS["ops"][0][:-1]}, "wrong bearer token"),
    ],
)
def test_unknown_tokens_are_401_and_change_nothing(
    scoped: Live, headers: dict[str, str], reason: str
) -> None:
    live = scoped
    before = snapshot(live.store)
    answer = live.http.request("DELETE", f"/collections/{INSIDE}", headers=headers)
    assert answer.status_code == 401 and answer.json() == {"error": "unauthorized", "reason": reason}
    assert answer.headers["www-authenticate"] == "Bearer"
    assert snapshot(live.store) == before


def test_open_routes_need_no_token_and_unknown_routes_need_one(scoped: Live) -> None:
    live = scoped
    for path in ("/healthz", "/ui/", "/docs", "/openapi.json"):
        assert live.http.get(path).status_code == 200, path
    assert live.http.get("/no/such/route").status_code == 401
    assert live.http.get("/no/such/route", headers=bearer("viewer")).json()["error"] == "noSuchRoute"


def test_the_scheme_is_matched_in_any_case_and_the_old_token_is_admin(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(token_file_text(TOKENS))
    config = ServerConfig(token="the-old-one", token_file=str(path))
    with live_server(tmp_path / "data", config) as live:
        create = {"collectionName": "x", "isManual": True}
        assert (
            live.http.post(
                "/collections/", json=create, headers={"authorization": "bearer the-old-one"}
            ).status_code
            == 200
        )
        answer = live.http.post(
            "/collections/", json={**create, "collectionName": "y"}, headers=bearer("viewer")
        )
        assert answer.status_code == 403


def test_a_replica_token_without_admin_cannot_fence_its_primary(scoped: Live, tmp_path: Path) -> None:
    """Promotion tells the old primary to step down: with a ``write`` token there it is refused, the
    replica says which token to change, and neither store changed."""
    from diffstore.engine.store import Store
    from diffstore.errors import Forbidden
    from diffstore.replica.promotion import Promotion, promote

    primary = scoped
    before = snapshot(primary.store)
    with Store.open(tmp_path / "replica") as replica:
        replica.become_replica(primary.url, "replica-1")
        with pytest.raises(Forbidden) as caught:
            promote(replica, TOKENS["writer"][0], Promotion("http://127.0.0.1:9", force=True, wait_ms=0))
        assert replica.replica_state().following  # still a replica
    assert caught.value.scope == "admin"
    assert "needs scope admin there" in caught.value.reason and TOKENS["writer"][0] not in caught.value.reason
    assert snapshot(primary.store) == before


def test_the_route_table_answers_as_the_router_and_stays_bounded() -> None:
    from diffstore.server.auth import SEEN_MAX, RouteTable

    table = RouteTable(create_app(None).routes)  # type: ignore[arg-type]
    assert table.find("POST", "/collections/x/put").access.scope is TokenScope.WRITE
    assert table.find("POST", "/collections/x/put/").collection == "x"
    assert table.find("GET", "/collections/x/query/abc").access.scope is TokenScope.READ
    assert table.find("DELETE", "/collections/x/readers/r").access.audit == "deleteReader"
    assert table.find("DELETE", "/collections/x").template == "/collections/{c}"
    assert table.find("GET", "/healthz").access.scope is TokenScope.OPEN
    assert table.find("GET", "/nowhere").template is None
    for n in range(3 * SEEN_MAX):  # every cursor a new path
        assert table.find("GET", f"/collections/x/diff/cursor{n}").collection == "x"
    assert len(table.seen) <= len(table.exact) + SEEN_MAX
    assert table.find("POST", "/collections/").access.collection_in_body
