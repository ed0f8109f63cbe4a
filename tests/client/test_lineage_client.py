"""The clients' ``lineage``: the same answers as the engine's, sync and async, JSON and msgpack."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from diffstore.client import AsyncClient, Client
from diffstore.engine.store import Store
from diffstore.engine.types import Lineage, LineageSource, StoreConfig
from diffstore.errors import GenerationCollected, InvalidRequest
from tests.helpers import LiveServer

STREAM = "hstream://events"
SHARD = "hstream/sub/0"


def _position(n: int) -> bytes:
    return n.to_bytes(8, "big") + b"\xff\x00\x00\x01"  # not printable: travels as base64 in JSON


def build(store: Any) -> None:
    """A (ingested from a stream, by hand) → C (through a reader), on a Store or a Client."""
    a = store.create_collection("A", manual=True)
    c = store.create_collection("C", manual=True)
    a.create_reader(SHARD, collection=STREAM)
    a.create_reader("keep")  # a null self-reader: every generation of A stays live
    c.create_reader("from_a", collection="A")
    c.create_reader("self")  # null: every generation of C stays live
    for n in (1, 2, 3):
        g = b"a%d" % n
        a.start_generation(g)
        a.put_many([(b"k", g)], generation_id=g)
        a.commit_generation(g, [(SHARD, _position(n))])
        c.start_generation(b"c%d" % n)
        c.commit_generation(b"c%d" % n, [("from_a", g)])


def answers(store: Any) -> list[Any]:
    c = store.collection("C")
    return [c.lineage(b"c1"), c.lineage(b"c3", depth=2), c.lineage(b"c3", depth=10), c.lineage(b"c2", 3)]


def test_sync_client_answers_like_the_engine(tmp_path: Path, server: LiveServer) -> None:
    with Store.open(tmp_path / "engine", StoreConfig(commit_delay_ms=10)) as store:
        build(store)
        expected = answers(store)
    assert expected[1].sources[0] == LineageSource(
        "from_a", "A", "A", b"a2", b"a3", (LineageSource(SHARD, STREAM, None, _position(2), _position(3)),)
    )
    with Client(server.url, format="json") as json_client:
        build(json_client)
        assert answers(json_client) == expected
    with Client(server.url, format="msgpack") as msgpack_client:
        assert answers(msgpack_client) == expected
        c = msgpack_client.collection("C")
        with pytest.raises(InvalidRequest):
            c.lineage(b"c9")
        with pytest.raises(InvalidRequest):
            c.lineage(b"c1", depth=11)
        c.update_reader("self", b"c3")  # C's minimum is now c3: c1 and c2 are collected
        with pytest.raises(GenerationCollected):
            c.lineage(b"c1")


@pytest.mark.parametrize("wire_format", ["msgpack", "json"])
def test_async_client_answers_like_the_sync_one(server: LiveServer, wire_format: str) -> None:
    with Client(server.url) as client:
        build(client)
        expected = answers(client)

    async def scenario() -> list[Lineage]:
        async with AsyncClient(server.url, format=wire_format) as client:  # type: ignore[arg-type]
            c = await client.collection("C")
            return [
                await c.lineage(b"c1"),
                await c.lineage(b"c3", depth=2),
                await c.lineage(b"c3", depth=10),
                await c.lineage(b"c2", 3),
            ]

    assert asyncio.run(scenario()) == expected
