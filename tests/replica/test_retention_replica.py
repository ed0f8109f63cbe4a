"""A replica copies its primary's retention policy (SPEC §9), so its GC keeps what the primary keeps and
the same generations stay readable on both."""

from __future__ import annotations

from diffstore.client import Client
from diffstore.engine.types import RetentionPolicy
from diffstore.errors import GenerationCollected
from tests.helpers import wait_until

from .compare import caught_up
from .conftest import Server

GENS = [b"1", b"2", b"3", b"4", b"5"]


def _readable(client: Client) -> list[bytes]:
    c = client.collection("R")
    found = []
    for gen in GENS:
        try:
            c.get(b"k", generation_id=gen)
        except GenerationCollected:
            continue
        found.append(gen)
    return found


def test_the_replica_keeps_what_the_primarys_policy_keeps(primary: Server, replica: Server) -> None:
    with primary.client() as p, replica.client() as r:
        c = p.create_collection("R", manual=True, retention=RetentionPolicy(keep_generations=3))
        for gen in GENS:
            c.start_generation(gen)
            c.put(b"k", gen, generation_id=gen)
            c.commit_generation(gen)
        wait_until(lambda: caught_up(p, r), 60, what="the replica to catch up")
        wait_until(
            lambda: r.collection("R").retention() == RetentionPolicy(keep_generations=3),
            60,
            what="the policy on the replica",
        )
        c.create_reader("reader", generation_id=b"5")  # the primary's GC may now collect below 3
        assert _readable(p) == [b"3", b"4", b"5"]
        wait_until(lambda: _readable(r) == [b"3", b"4", b"5"], 60, what="the replica to keep 3, 4 and 5")
        assert r.collection("R").get(b"k", generation_id=b"3")[:2] == (b"k", b"3")  # type: ignore[index]
        c.set_retention(None)  # a change outside commits reaches the replica too
        wait_until(
            lambda: r.collection("R").retention() is None, 60, what="the policy removed on the replica"
        )
        wait_until(lambda: _readable(r) == [b"5"], 60, what="the replica to let 3 and 4 go")
        assert _readable(p) == [b"5"]
