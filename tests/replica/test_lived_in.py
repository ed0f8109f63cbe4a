"""A replica of a store with a life behind it (tests/lived_in.py): collected history, readers of other
collections and of streams, leases, a collection created again, an open generation, phantoms, 1 MiB keys,
empty collections. It copies every collection from the oldest generation readers may still read, and
after each fault of the nemesis (kill -9 of either side, SIGSTOP, the link stalled then cut) converges to
the primary generation by generation, with the same ids."""

from __future__ import annotations

from pathlib import Path

import httpx

from diffstore.errors import GenerationCollected
from tests.faults import TcpProxy, paused
from tests.helpers import wait_until
from tests.lived_in import LivedIn, live

from .compare import converged
from .conftest import Server

FOLLOW_S = 180.0


def _states(replica: Server) -> dict[str, str]:
    body = httpx.get(f"{replica.url}/replica", timeout=30).json()
    return {item["collectionName"]: item["state"] for item in body["collections"]}


def test_a_lived_in_store_is_copied_whole(primary: Server, servers: list[Server], tmp_path: Path) -> None:
    with primary.client() as p:
        life = live(p)
        replica = Server(tmp_path / "replica", "--replica-of", primary.url)
        servers.append(replica)
        replica.start()
        with replica.client() as r:
            held = converged(p, r, FOLLOW_S)
            assert sorted(held, key=str.encode) == life.names
            # SOURCE starts at the oldest generation readers may read: the ones below answer 410 on both
            source = held[LivedIn.SOURCE]
            assert source[0] == b"g%04d" % life.rounds
            for client in (p, r):
                try:
                    client.collection(LivedIn.SOURCE).query_page(generation_id=b"g0001", limit=1)
                except GenerationCollected:
                    pass
                else:
                    raise AssertionError("a collected generation answered")
            assert wait_until(
                lambda: set(_states(replica).values()) == {"following"}, FOLLOW_S, what="all following"
            )
            assert sorted(_states(replica), key=str.encode) == life.names
            # the pipeline goes on: new generations of every shape follow
            life.more(p, 2)
            converged(p, r, FOLLOW_S)


def test_a_lived_in_store_converges_after_kill9_of_either_side(primary: Server, replica: Server) -> None:
    with primary.client() as p:
        life = live(p)
        replica.kill9()  # in the middle of its first copy, or just after
        life.more(p)
        replica.start()
        with replica.client() as r:
            converged(p, r, FOLLOW_S)
    primary.kill9()
    primary.start()
    with primary.client() as p, replica.client() as r:
        life.more(p, 2)
        converged(p, r, FOLLOW_S)


def test_a_lived_in_store_converges_after_pauses(primary: Server, replica: Server) -> None:
    assert replica.process is not None and primary.process is not None
    with primary.client() as p:
        with paused(replica.process):
            life = live(p)
        with replica.client() as r:
            converged(p, r, FOLLOW_S)
        with paused(primary.process):
            wait_until(lambda: _states(replica), 30, what="the replica answering while its primary is frozen")
        life.more(p, 2)
        with replica.client() as r:
            converged(p, r, FOLLOW_S)


def test_a_replica_behind_a_stalled_then_cut_link_catches_up(
    tmp_path: Path, primary: Server, servers: list[Server]
) -> None:
    """The issue's case: the replica fell behind while its link stalled, then the link was cut; once
    writes stop it must not stay at a fixed generation."""
    with TcpProxy(primary.url.removeprefix("http://")) as proxy, primary.client() as p:
        life = live(p)
        replica = Server(tmp_path / "replica", "--replica-of", f"http://{proxy.address}")
        servers.append(replica)
        replica.start()
        with replica.client() as r:
            converged(p, r, FOLLOW_S)
            proxy.stall()
            life.more(p, 3)
            proxy.cut(refuse=True)
            life.more(p, 1)
            proxy.accept()
            proxy.passing()
            converged(p, r, FOLLOW_S)
