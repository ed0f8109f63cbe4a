"""kill -9 of the replica, and of the primary, while generations flow: after restarts the replica converges
to exactly the primary's state (every generation once, with its records and reader moves)."""

from __future__ import annotations

from diffstore.client import Client
from diffstore.engine.types import ReaderUpdate
from tests.helpers import wait_until

from .compare import caught_up, every_read, generations
from .conftest import Server


class Writer:
    """Commits generations on the primary: A (manual, 2,000 records each, so that applies take a while),
    B (automatic), and C's readers moved by C's commits."""

    def __init__(self) -> None:
        self.n = 0

    def setup(self, p: Client) -> None:
        p.create_collection("A", manual=True)
        p.create_collection("B", manual=False)
        c = p.create_collection("C", manual=True)
        c.create_reader("from_a", "A", None)
        p.collection("A").create_reader("keep", generation_id=None)

    def commit(self, p: Client, count: int) -> None:
        a, b, c = p.collection("A"), p.collection("B"), p.collection("C")
        for _ in range(count):
            self.n += 1
            g = b"%06d" % self.n
            a.start_generation(g)
            a.put_many([(b"k%05d" % i, b"%d" % (i * self.n)) for i in range(2_000)], generation_id=g)
            a.commit_generation(g)
            b.put(b"b%d" % (self.n % 7), g)
            c.start_generation(g)
            c.put(b"seen", g, generation_id=g)
            c.commit_generation(g, [ReaderUpdate("from_a", g)])


def _applied(replica: Server) -> int:
    with replica.client() as r:
        try:
            return int(r.collection("A").generation_id or b"0")
        except Exception:  # noqa: BLE001 -- not copied yet, or the replica is starting
            return 0


def test_kill9_of_replica_and_primary_converges(primary: Server, replica: Server) -> None:
    writer = Writer()
    with primary.client() as p:
        writer.setup(p)
        # the replica dies at several points while it applies (after 1, 3 and 6 generations of A)
        for seen in (1, 3, 6):
            writer.commit(p, 3)
            wait_until(lambda seen=seen: _applied(replica) >= seen, 120, what=f"{seen} generations applied")
            replica.kill9()
            writer.commit(p, 1)
            replica.start()
        # the primary dies too, with the replica behind it and then in the middle of a burst
        writer.commit(p, 2)
    primary.kill9()
    primary.start()
    with primary.client() as p:
        writer.commit(p, 4)
    wait_until(
        lambda: _applied(replica) > writer.n - 4, 120, what="the replica following the restarted primary"
    )
    primary.kill9()
    primary.start()
    with primary.client() as p, replica.client() as r:
        writer.commit(p, 2)
        wait_until(lambda: caught_up(p, r), 120, what="the replica to converge")
        held = generations(p)
        assert generations(r) == held
        assert held["A"][-1] == b"%06d" % writer.n
        assert every_read(r, {"A": held["A"][-3:], "C": held["C"]}) == every_read(
            p, {"A": held["A"][-3:], "C": held["C"]}
        )
        assert every_read(r, {"B": held["B"]}) == every_read(p, {"B": held["B"]})
        # every generation of A holds its 2,000 records, once
        for g in held["A"][-3:]:
            mine = r.collection("A").generation_records(g, limit=10_000)
            theirs = p.collection("A").generation_records(g, limit=10_000)
            assert (mine.records, mine.previous, mine.moves) == (
                theirs.records,
                theirs.previous,
                theirs.moves,
            )
