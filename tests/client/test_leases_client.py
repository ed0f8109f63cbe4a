"""Leases and fencing through the sync and the async client (JSON and msgpack), against a real server."""

from __future__ import annotations

import asyncio

import pytest

from diffstore.client import AsyncClient, Client
from diffstore.engine.types import Lease, LeaseToken
from diffstore.errors import InvalidRequest, LeaseLost
from tests.helpers import LiveServer


def test_the_sync_client_acquires_renews_releases_and_is_fenced(client: Client) -> None:
    c = client.create_collection("m", manual=True)
    lease = c.acquire_lease("l", "a", 60_000)
    assert (lease.name, lease.owner, lease.version) == ("l", "a", 1)
    with pytest.raises(LeaseLost, match="'a'"):
        c.acquire_lease("l", "b", 60_000)
    renewed = c.renew_lease("l", "a", 1, ttl_ms=120_000)
    assert renewed.expires_at_ms >= lease.expires_at_ms
    assert c.leases() == [renewed]
    c.start_generation(b"1", lease=lease.token)
    c.put_many([(b"k", b"v")], generation_id=b"1", lease=lease.token)
    with pytest.raises(LeaseLost, match="carries none"):
        c.put(b"k", b"x", generation_id=b"1")
    c.release_lease("l", "a", 1)
    with pytest.raises(LeaseLost):
        c.commit_generation(b"1", lease=lease.token)
    assert c.generation_state() == (b"", b"1")
    again = c.acquire_lease("l", "b", 60_000)
    with pytest.raises(LeaseLost, match="started under lease 'l' version 1"):
        c.commit_generation(b"1", lease=again.token)  # the new owner cannot adopt the old one's records
    c.start_generation(b"1", lease=again.token)  # it starts the generation afresh instead
    assert c.get(b"k", generation_id=b"1") is None
    c.commit_generation(b"1", lease=again.token)
    assert c.generation_id == b"1"
    assert c.leases() == [Lease("l", "b", 2, again.expires_at_ms)]
    with pytest.raises(InvalidRequest):
        c.acquire_lease("l", "", 10)


def test_the_async_client_does_the_same(server: LiveServer) -> None:
    async def scenario() -> None:
        async with AsyncClient(server.url) as client:
            c = await client.create_collection("m", manual=True)
            lease = await c.acquire_lease("l", "a", 60_000)
            with pytest.raises(LeaseLost):
                await c.acquire_lease("l", "b", 60_000)
            assert (await c.renew_lease("l", "a", 1)).version == 1
            await c.start_generation(b"1", lease=lease.token)
            with pytest.raises(LeaseLost):
                await c.put(b"k", b"v", generation_id=b"1")
            await c.put_many([(b"k", b"v")], generation_id=b"1", lease=lease.token)
            with pytest.raises(LeaseLost):
                await c.commit_generation(b"1", lease=LeaseToken("l", 2))
            with pytest.raises(LeaseLost):
                await c.abort_generation(b"1")
            await c.commit_generation(b"1", lease=lease.token)
            assert (await c.get(b"k")).value == b"v"  # type: ignore[union-attr]
            await c.release_lease("l", "a", 1)
            assert await c.leases() == [Lease("l", None, 1, 0)]

    asyncio.run(scenario())
