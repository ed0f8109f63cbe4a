"""Never silent (issue 47, items 1-3): a collection whose history was collected is copied from its oldest
readable generation; a lost hold is re-copied by itself and said so; every collection's follower shows
its state (``copying`` | ``following`` | ``stalled`` with why and since when) in ``GET /replica`` and
``/metrics``, and an outage of the primary is one line in the log, not one a request."""

from __future__ import annotations

import httpx

from diffstore.client import Client
from diffstore.errors import GenerationCollected
from diffstore.replica import READER_PREFIX
from tests.faults import paused
from tests.helpers import wait_until

from .compare import converged
from .conftest import Server

FOLLOW_S = 120.0


def _items(replica: Server) -> dict[str, dict[str, object]]:
    body = httpx.get(f"{replica.url}/replica", timeout=30).json()
    return {item["collectionName"]: item for item in body["collections"]}


def _collected_history(p: Client) -> None:
    """The issue's manual M: g1, a reader at g1, g2, the reader moved to g2 ("" and g1 collected)."""
    m = p.create_collection("M", manual=True)
    m.start_generation(b"g1")
    m.put(b"k", b"1", generation_id=b"g1")
    m.commit_generation(b"g1")
    m.create_reader("pipeline", generation_id=b"g1")
    m.start_generation(b"g2")
    m.put_many([(b"k", b"2"), (b"other", b"x")], generation_id=b"g2")
    m.commit_generation(b"g2")
    m.update_reader("pipeline", b"g2")


def test_collected_history_is_copied_from_the_oldest_readable_generation(
    primary: Server, replica: Server
) -> None:
    with primary.client() as p, replica.client() as r:
        assert replica.process is not None
        with paused(replica.process):  # the replica sees M only once its history was collected
            _collected_history(p)
        held = converged(p, r, FOLLOW_S)
        assert held["M"] == [b"g2"]
        assert [(x.key, x.value) for x in r.collection("M").query()] == [(b"k", b"2"), (b"other", b"x")]
        try:
            r.collection("M").query_page(generation_id=b"g1", limit=1)
        except GenerationCollected:
            pass
        else:
            raise AssertionError("g1 answered on the replica")
        item = wait_until(
            lambda: _items(replica).get("M", {}).get("state") == "following" and _items(replica)["M"]
        )
        assert isinstance(item["sinceMs"], int) and "reason" not in item
        metrics = httpx.get(f"{replica.url}/metrics", timeout=30).text
        assert 'diffstore_replica_state{collection="M",state="following"} 1.0' in metrics
        assert 'diffstore_replica_state{collection="M",state="stalled"} 0.0' in metrics
        # the hold stands where the replica is
        holds = [x for x in p.collection("M").readers() if x.name.startswith(READER_PREFIX)]
        assert [x.generation_id for x in holds] == [b"g2"]


def test_a_lost_hold_is_copied_again_and_said_so(primary: Server, replica: Server) -> None:
    with primary.client() as p, replica.client() as r:
        _collected_history(p)
        converged(p, r, FOLLOW_S)
        (hold,) = [x.name for x in p.collection("M").readers() if x.name.startswith(READER_PREFIX)]
        p.collection("M").delete_reader(hold)  # by hand
        m = p.collection("M")
        m.start_generation(b"g3")
        m.put(b"k", b"3", generation_id=b"g3")
        m.commit_generation(b"g3")
        held = converged(p, r, FOLLOW_S)
        assert held["M"][-1] == b"g3"
        wait_until(
            lambda: hold in [x.name for x in p.collection("M").readers()], FOLLOW_S, what="the hold back"
        )
    log = replica.log.read_text()
    assert "M: copying again: our hold on the primary is gone" in log


def test_an_unreachable_primary_stalls_every_collection_in_one_line(primary: Server, replica: Server) -> None:
    with primary.client() as p, replica.client() as r:
        _collected_history(p)
        p.create_collection("N", manual=False).put(b"n", b"1")
        converged(p, r, FOLLOW_S)
    primary.kill9()
    items = wait_until(
        lambda: (found := _items(replica)) and all(i["state"] == "stalled" for i in found.values()) and found,
        FOLLOW_S,
        what="every collection stalled",
    )
    assert set(items) == {"M", "N"}
    for item in items.values():
        assert "cannot reach the primary" in str(item["reason"]) and isinstance(item["sinceMs"], int)
    metrics = httpx.get(f"{replica.url}/metrics", timeout=30).text
    assert 'diffstore_replica_state{collection="N",state="stalled"} 1.0' in metrics
    primary.start()
    wait_until(
        lambda: all(i["state"] == "following" for i in _items(replica).values()),
        FOLLOW_S,
        what="following again",
    )
    log = replica.log.read_text()
    assert log.count("cannot read the primary's collections") == 1, log[-3000:]
    assert log.count("the primary answers again") == 1
