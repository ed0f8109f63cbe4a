"""What a promotion answers for each collection (``promotion.Standing``): the follower's own state, so a
collection that cannot go on shows ``stalled`` with why, on a real store."""

from __future__ import annotations

from pathlib import Path

from diffstore.engine.store import Store
from diffstore.engine.types import ReplicaGeneration
from diffstore.replica import promotion


def test_a_promotions_standings_carry_the_followers_stalled_state(tmp_path: Path) -> None:
    store = Store(tmp_path / "data")
    try:
        store.become_replica("http://primary", "r1")
        store.apply_replica_generation(ReplicaGeneration("A", True, None, b"g1", [(b"k", b"v")]))
        store.apply_replica_generation(ReplicaGeneration("B", True, None, b"g1", [(b"k", b"v")]))
        store.set_replica_status("A", "stalled", "waiting for T (a reader's target) to be copied", 1)
        store.set_replica_status("C", "stalled", "forbidden (forbidden)", 1)  # not copied yet
        found = promotion._standings(store, {"A": b"g1", "B": b"g2", "C": b"g1"}, client=None)
        assert [s.to_wire() for s in found] == [
            {
                "collectionName": "A",
                "state": "stalled",
                "lagGenerations": 0,
                "reason": "waiting for T (a reader's target) to be copied",
            },
            {"collectionName": "B", "state": "following", "lagGenerations": 1},
            {
                "collectionName": "C",
                "state": "stalled",
                "lagGenerations": 1,
                "reason": "forbidden (forbidden)",
            },
        ]
        assert promotion._behind(found)  # B is behind and C not copied, whatever their state says
        assert not promotion._behind(found[:1])
    finally:
        store.close()
