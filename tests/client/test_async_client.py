"""The asyncio client against a real server: the same calls and plans as the sync one, awaited."""

from __future__ import annotations

import asyncio

import pytest

from diffstore.client import AsyncClient
from diffstore.engine.types import CollectionInfo, DiffItem, GetManyResult, Reader, ReaderUpdate, Record
from diffstore.errors import BadVersion, CollectionExists, NoSuchCollection
from tests.helpers import LiveServer

from .conftest import DEADLINE_S


@pytest.mark.parametrize("wire_format", ["msgpack", "json"])
def test_async_client_round_trip(server: LiveServer, wire_format: str) -> None:
    async def scenario() -> None:
        async with AsyncClient(server.url, format=wire_format) as client:  # type: ignore[arg-type]
            c = await client.create_collection("A")
            await client.create_collection("B")
            with pytest.raises(CollectionExists):
                await client.create_collection("A")
            with pytest.raises(NoSuchCollection):
                await client.collection("missing")
            assert await client.collections() == [CollectionInfo("A", True), CollectionInfo("B", True)]
            await c.create_reader("r")
            await c.start_generation(b"1")
            await c.put_many([(b"k%d" % i, b"v") for i in range(5)], generation_id=b"1")
            await c.put(b"k9", b"\x00", generation_id=b"1")
            await c.commit_generation(b"1", update_readers=[ReaderUpdate("r", b"1", expected=None)])
            with pytest.raises(BadVersion):
                await c.update_reader("r", b"1", expected=b"")
            assert await c.readers() == [Reader("r", "A", b"1")]
            assert await c.get(b"k9") == Record(b"k9", b"\x00", b"1")
            many = await c.get_many([b"k9", b"nope", b"k0"])
            assert many == GetManyResult(
                b"1", [Record(b"k9", b"\x00", b"1"), None, Record(b"k0", b"v", b"1")]
            )
            assert (await c.state()).generation_id == b"1"
            assert [r.key async for r in c.query(limit=2)] == [b"k0", b"k1", b"k2", b"k3", b"k4", b"k9"]
            items = [item async for item in c.diff(from_generation_id=b"", limit=4)]
            assert len(items) == 6 and items[-1] == DiffItem(b"k9", None, b"\x00")
            assert (await c.keys_around(b"k2", 1)).right == [b"k3"]

            async def first_new_generation() -> bytes:
                async for generation_id in c.watch(since=b"1", timeout_ms=2_000):
                    return generation_id
                raise AssertionError("watch ended")

            watcher = asyncio.create_task(first_new_generation())
            waiter = asyncio.create_task(client.wait_for_change({"A": b"1", "B": b""}, timeout_ms=5_000))
            await c.start_generation(b"2")
            await c.put(b"k0", None, generation_id=b"2")
            await c.commit_generation(b"2")
            assert await asyncio.wait_for(watcher, DEADLINE_S) == b"2"
            assert await asyncio.wait_for(waiter, DEADLINE_S) is True
            assert [item async for item in c.diff(from_reader="r")] == [DiffItem(b"k0", b"v", None)]

    asyncio.run(scenario())
