"""``get_many`` of the sync and async clients: both wire formats answer alike; refusals are typed."""

from __future__ import annotations

import asyncio

import pytest

from diffstore.client import AsyncClient
from diffstore.engine.types import MAX_GET_MANY_KEYS, GetManyResult, Record
from diffstore.errors import InvalidRequest, NoSuchCollection
from tests.helpers import LiveServer


def _fill(server: LiveServer) -> None:
    c = server.store.create_collection("m", manual=True)
    c.start_generation(b"1")
    c.put_many([(b"a", b"1"), (b"\x00", b""), (b"b", b"2")], generation_id=b"1")
    c.commit_generation(b"1")


def test_both_formats_answer_alike_and_refusals_change_nothing(server: LiveServer) -> None:
    _fill(server)
    expected = GetManyResult(b"1", [Record(b"\x00", b"", b"1"), None, Record(b"a", b"1", b"1"), None])
    for wire_format in ("msgpack", "json"):
        with server.client(wire_format) as client:  # type: ignore[arg-type]
            c = client.collection("m")
            assert c.get_many([b"\x00", b"zz", b"a", b"zz"]) == expected
            assert c.get_many([]) == GetManyResult(b"1", [])
            with pytest.raises(InvalidRequest, match=str(MAX_GET_MANY_KEYS)):
                c.get_many([b"k"] * (MAX_GET_MANY_KEYS + 1))
            with pytest.raises(InvalidRequest):
                c.get_many([b"a"], generation_id=b"g" * 256)
    with server.client() as client:
        gone = client.create_collection("gone")
        client.delete_collection("gone")
        with pytest.raises(NoSuchCollection):
            gone.get_many([b"a"])
    assert [(r.key, r.value) for r in server.store.collection("m").query()] == [
        (b"\x00", b""),
        (b"a", b"1"),
        (b"b", b"2"),
    ]


def test_async_get_many(server: LiveServer) -> None:
    _fill(server)

    async def scenario() -> GetManyResult:
        async with AsyncClient(server.url) as client:
            c = await client.collection("m")
            return await c.get_many([b"b", b"a"], generation_id=b"1")

    assert asyncio.run(scenario()) == GetManyResult(
        b"1", [Record(b"b", b"2", b"1"), Record(b"a", b"1", b"1")]
    )
