"""A replica's 409 ``readOnlyReplica`` names the server that takes writes (``leader``), in JSON and msgpack,
and the client's error carries it; a primary's write is not refused and a replica's data is unchanged."""

from __future__ import annotations

import httpx
import msgpack

from diffstore.client import Client
from diffstore.errors import ReadOnlyReplica
from tests.helpers import wait_until

from .compare import caught_up
from .conftest import Server

FOLLOW_S = 180.0


def test_a_replica_refusal_names_its_primary_as_leader(primary: Server, replica: Server) -> None:
    with primary.client() as p, replica.client() as r:
        p.create_collection("c", manual=False).put(b"k", b"v")
        wait_until(lambda: caught_up(p, r), FOLLOW_S, what="the replica to copy")
        before = r.collection("c").generation_id
        answer = httpx.post(
            f"{replica.url}/collections/c/put",
            json={"item": {"key": {"value": "k"}, "value": {"value": "w"}}},
        )
        assert answer.status_code == 409
        assert answer.json()["error"] == "readOnlyReplica"
        assert answer.json()["leader"] == primary.url
        packed = httpx.post(
            f"{replica.url}/collections/c/put",
            content=msgpack.packb({"item": {"key": b"k", "value": b"w"}}),
            headers={"Content-Type": "application/msgpack", "Accept": "application/msgpack"},
        )
        assert packed.status_code == 409
        assert msgpack.unpackb(packed.content)["leader"] == primary.url
        try:
            r.collection("c").put(b"k", b"w")
        except ReadOnlyReplica as refused:
            assert refused.leader == primary.url
        else:
            raise AssertionError("the replica took a write")
        record = r.collection("c").get(b"k")
        assert record is not None and record.value == b"v"
        assert r.collection("c").generation_id == before


def test_a_primary_answers_writes_without_a_leader_hint(primary: Server) -> None:
    with Client(primary.url) as p:
        p.create_collection("c", manual=False)
        answer = httpx.post(
            f"{primary.url}/collections/c/put", json={"item": {"key": {"value": "k"}, "value": None}}
        )
        assert answer.status_code == 200 and "leader" not in answer.json()
