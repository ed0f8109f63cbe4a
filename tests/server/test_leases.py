"""Leases over HTTP: the routes of ``/collections/{c}/leases/``, fencing of generation/start and /commit
(409 ``leaseLost``), JSON and msgpack, the token, and every bad request (status, code, nothing changed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest

from diffstore.engine.types import Lease
from diffstore.server import ServerConfig
from tests.helpers import ManualClock

from .conftest import Live, es, live_server


def snapshot(live: Live) -> tuple[Any, ...]:
    c = live.store.collection("m")
    return c.leases(), c.generation_state(), c.readers(), list(c.query())


def test_acquire_renew_release_list(served: Live, clock: ManualClock) -> None:
    now = clock.now_ms
    got = served.ok("POST", "/collections/m/leases/ingest/acquire", {"owner": "a", "ttlMs": 1000})
    assert got == {"owner": "a", "version": 1, "expiresAtMs": now + 1000}
    clock.now_ms += 400
    got = served.ok("POST", "/collections/m/leases/ingest/renew", {"owner": "a", "version": 1})
    assert got == {"owner": "a", "version": 1, "expiresAtMs": now + 1400}
    got = served.ok("POST", "/collections/m/leases/ingest/renew/", {"owner": "a", "version": 1, "ttlMs": 50})
    assert got["expiresAtMs"] == now + 450
    assert served.ok("GET", "/collections/m/leases/") == {
        "items": [{"name": "ingest", "owner": "a", "version": 1, "expiresAtMs": now + 450}]
    }
    assert served.ok("GET", "/collections/m/leases")["items"][0]["name"] == "ingest"  # no slash: same
    assert served.ok("POST", "/collections/m/leases/ingest/release", {"owner": "a", "version": 1}) == {}
    assert served.ok("GET", "/collections/m/leases/")["items"] == [
        {"name": "ingest", "owner": None, "version": 1, "expiresAtMs": 0}
    ]
    got = served.ok("POST", "/collections/m/leases/ingest/acquire", {"owner": "b", "ttlMs": 10})
    assert got["version"] == 2


def test_a_held_lease_is_a_409_lease_lost_naming_the_owner(served: Live, clock: ManualClock) -> None:
    served.ok("POST", "/collections/m/leases/l/acquire", {"owner": "alice", "ttlMs": 1000})
    before = snapshot(served)
    answer = served.fail(
        "POST",
        "/collections/m/leases/l/acquire",
        {"owner": "bob", "ttlMs": 1000},
        status=409,
        code="leaseLost",
    )
    assert "'alice'" in answer["reason"]
    served.fail(
        "POST", "/collections/m/leases/l/renew", {"owner": "bob", "version": 1}, status=409, code="leaseLost"
    )
    served.fail(
        "POST",
        "/collections/m/leases/l/release",
        {"owner": "bob", "version": 1},
        status=409,
        code="leaseLost",
    )
    served.fail(
        "POST",
        "/collections/m/leases/l/renew",
        {"owner": "alice", "version": 2},
        status=409,
        code="leaseLost",
    )
    served.fail(
        "POST",
        "/collections/m/leases/nope/renew",
        {"owner": "alice", "version": 1},
        status=409,
        code="leaseLost",
    )
    assert snapshot(served) == before


def test_fencing_refuses_an_old_owners_start_and_commit_and_changes_nothing(
    served: Live, clock: ManualClock
) -> None:
    served.ok("POST", "/collections/m/readers/", {"readerName": "pos", "collectionName": "hstream://s"})
    old = served.ok("POST", "/collections/m/leases/w/acquire", {"owner": "old", "ttlMs": 1000})
    token = {"name": "w", "version": old["version"]}
    served.ok("POST", "/collections/m/generation/start", {"generationId": es("1"), "lease": token})
    served.ok(
        "POST",
        "/collections/m/putMany",
        {"items": [{"key": es("k"), "value": es("v1")}], "generationId": es("1"), "lease": token},
    )
    served.ok("POST", "/collections/m/generation/commit", {"generationId": es("1"), "lease": token})
    served.ok("POST", "/collections/m/generation/start", {"generationId": es("2"), "lease": token})
    served.ok(
        "POST",
        "/collections/m/putMany",
        {"items": [{"key": es("k"), "value": es("v2")}], "generationId": es("2"), "lease": token},
    )
    clock.now_ms += 1000
    served.ok("POST", "/collections/m/leases/w/acquire", {"owner": "new", "ttlMs": 1000})
    before = snapshot(served)
    commit = {
        "generationId": es("2"),
        "updateReaders": [{"readerName": "pos", "generationId": es("2")}],
        "lease": token,
    }
    served.fail("POST", "/collections/m/generation/commit", commit, status=409, code="leaseLost")
    served.fail(
        "POST",
        "/collections/m/generation/start",
        {"generationId": es("3"), "abortOutdated": True, "lease": token},
        status=409,
        code="leaseLost",
    )
    assert snapshot(served) == before
    assert served.store.collection("m").get(b"k").value == b"v1"  # type: ignore[union-attr]
    # readers long-polling the collection still see generation "1"
    assert served.ok("GET", "/collections/m")["generationId"] == {"value": "1"}


def test_msgpack_bodies_and_answers(served: Live, clock: ManualClock) -> None:
    headers = {"content-type": "application/msgpack", "accept": "application/msgpack"}
    response = served.http.post(
        "/collections/m/leases/l/acquire", content=msgpack.packb({"owner": "a", "ttlMs": 10}), headers=headers
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/msgpack")
    assert msgpack.unpackb(response.content) == {"owner": "a", "version": 1, "expiresAtMs": clock.now_ms + 10}
    body = {"generationId": b"\x00\x01", "lease": {"name": "l", "version": 2}}
    response = served.http.post(
        "/collections/m/generation/start", content=msgpack.packb(body), headers=headers
    )
    assert response.status_code == 409
    assert msgpack.unpackb(response.content)["error"] == "leaseLost"
    body["lease"] = {"name": "l", "version": 1}
    response = served.http.post(
        "/collections/m/generation/start", content=msgpack.packb(body), headers=headers
    )
    assert response.status_code == 200
    response = served.http.get("/collections/m/leases/", headers=headers)
    assert msgpack.unpackb(response.content)["items"][0]["owner"] == "a"


BAD = [
    ("/collections/m/leases/l/acquire", {"owner": "a"}, 400, "invalidRequest"),
    ("/collections/m/leases/l/acquire", {"ttlMs": 10}, 400, "invalidRequest"),
    ("/collections/m/leases/l/acquire", {"owner": "", "ttlMs": 10}, 400, "invalidRequest"),
    ("/collections/m/leases/l/acquire", {"owner": "a" * 256, "ttlMs": 10}, 400, "invalidRequest"),
    ("/collections/m/leases/l/acquire", {"owner": 7, "ttlMs": 10}, 400, "invalidRequest"),
    ("/collections/m/leases/l/acquire", {"owner": "a", "ttlMs": 0}, 400, "invalidRequest"),
    ("/collections/m/leases/l/acquire", {"owner": "a", "ttlMs": 86_400_001}, 400, "invalidRequest"),
    ("/collections/m/leases/l/acquire", {"owner": "a", "ttlMs": "10"}, 400, "invalidRequest"),
    ("/collections/m/leases/l/acquire", {"owner": "a", "ttlMs": 1.5}, 400, "invalidRequest"),
    ("/collections/m/leases/l/acquire", None, 400, "invalidRequest"),
    ("/collections/m/leases/l/acquire", [], 400, "invalidRequest"),
    ("/collections/m/leases/" + "x" * 256 + "/acquire", {"owner": "a", "ttlMs": 10}, 400, "invalidRequest"),
    ("/collections/m/leases/l/renew", {"owner": "a"}, 400, "invalidRequest"),
    ("/collections/m/leases/l/renew", {"owner": "a", "version": 0}, 400, "invalidRequest"),
    ("/collections/m/leases/l/renew", {"owner": "a", "version": True}, 400, "invalidRequest"),
    ("/collections/m/leases/l/renew", {"owner": "a", "version": 1, "ttlMs": -1}, 400, "invalidRequest"),
    ("/collections/m/leases/l/release", {"owner": "a"}, 400, "invalidRequest"),
    ("/collections/m/leases/l/release", {"version": 1}, 400, "invalidRequest"),
    ("/collections/nope/leases/l/acquire", {"owner": "a", "ttlMs": 10}, 404, "noSuchCollection"),
    ("/collections/nope/leases/l/renew", {"owner": "a", "version": 1}, 404, "noSuchCollection"),
    ("/collections/nope/leases/l/release", {"owner": "a", "version": 1}, 404, "noSuchCollection"),
    ("/collections/m/leases/l/steal", {"owner": "a", "ttlMs": 10}, 404, "noSuchRoute"),
    (
        "/collections/m/generation/start",
        {"generationId": es("9"), "lease": {"name": "l"}},
        400,
        "invalidRequest",
    ),
    (
        "/collections/m/generation/start",
        {"generationId": es("9"), "lease": {"version": 1}},
        400,
        "invalidRequest",
    ),
    ("/collections/m/generation/start", {"generationId": es("9"), "lease": "l"}, 400, "invalidRequest"),
    (
        "/collections/m/generation/commit",
        {"generationId": es("9"), "lease": {"name": "l", "version": 0}},
        400,
        "invalidRequest",
    ),
    (
        "/collections/m/generation/commit",
        {"generationId": es("9"), "lease": {"name": "l", "version": 99}},
        409,
        "leaseLost",
    ),
]


@pytest.mark.parametrize(("path", "body", "status", "code"), BAD)
def test_bad_requests_are_refused_and_change_nothing(
    served: Live, path: str, body: Any, status: int, code: str
) -> None:
    served.ok("POST", "/collections/m/leases/l/acquire", {"owner": "a", "ttlMs": 60_000})
    served.ok("POST", "/collections/m/generation/start", {"generationId": es("9")})
    before = snapshot(served)
    if body is None:
        response = served.http.post(path, content=b"null", headers={"content-type": "application/json"})
        assert (response.status_code, response.json()["error"]) == (status, code)
    else:
        served.fail("POST", path, body, status=status, code=code)
    assert snapshot(served) == before


def test_the_list_of_a_missing_collection_is_a_404(served: Live) -> None:
    served.fail("GET", "/collections/nope/leases/", status=404, code="noSuchCollection")
    served.fail("GET", "/collections/m/leases/l", status=404, code="noSuchRoute")


def test_leases_are_behind_the_token(tmp_path: Path) -> None:
    with live_server(tmp_path / "data", ServerConfig(token="tok")) as live:
        live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
        anonymous = {"authorization": ""}
        for method, path, body in [
            ("GET", "/collections/m/leases/", None),
            ("POST", "/collections/m/leases/l/acquire", {"owner": "a", "ttlMs": 10}),
            ("POST", "/collections/m/leases/l/renew", {"owner": "a", "version": 1}),
            ("POST", "/collections/m/leases/l/release", {"owner": "a", "version": 1}),
        ]:
            live.fail(method, path, body, status=401, code="unauthorized", headers=anonymous)
        assert live.store.collection("m").leases() == []
        assert live.ok("POST", "/collections/m/leases/l/acquire", {"owner": "a", "ttlMs": 10})["version"] == 1


def test_the_openapi_document_describes_the_lease_routes(served: Live) -> None:
    document = served.call("GET", "/openapi.json").json()
    paths = document["paths"]
    for verb in ("acquire", "renew", "release"):
        assert f"/collections/{{c}}/leases/{{name}}/{verb}" in paths
    assert "/collections/{c}/leases/" in paths
    schemas = document["components"]["schemas"]
    assert {"AcquireLease", "RenewLease", "ReleaseLease", "LeaseResponse", "LeaseList"} <= set(schemas)
    assert "lease" in schemas["CommitGeneration"]["properties"]
    assert "lease" in schemas["StartGeneration"]["properties"]


def test_the_engine_sees_what_http_did(served: Live) -> None:
    served.ok("POST", "/collections/m/leases/l/acquire", {"owner": "a", "ttlMs": 60_000})
    lease = served.store.collection("m").leases()[0]
    assert isinstance(lease, Lease) and lease.owner == "a" and lease.version == 1
