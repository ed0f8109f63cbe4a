"""A replica (its own process) follows a primary (its own process): several collections, manual and
automatic, readers moved by commits and outside them, leases, creations and deletions; every read of every
generation answers on the replica what it answers on the primary."""

from __future__ import annotations

from diffstore.client import Client
from diffstore.engine.types import ReaderUpdate
from diffstore.errors import DiffstoreError
from tests.faults import paused
from tests.helpers import wait_until

from .compare import caught_up, every_read, generations, histories, state
from .conftest import Server

LONG = b"L" * 300


def _round(client: Client, n: int) -> None:
    """One round of changes on the primary (n = 1, 2, 3...)."""
    a = client.collection("A")
    g = b"%04d" % n
    a.start_generation(g)
    a.put_many(
        [(b"k%d" % i, b"v%d-%d" % (i, n)) for i in range(n, n + 4)]
        + [(b"k0", None), (b"same", b"s"), (LONG + bytes([n]), b"long"), (b"\x00\xff", bytes([n]))],
        generation_id=g,
    )
    a.commit_generation(g, metadata={"round": str(n)})
    b = client.collection("B")
    b.put_many([(b"b%d" % n, b"x"), (b"b1", b"y%d" % n)])
    wait_until(lambda: b.generation_state()[0] != b"\x00" * 8 and b.next_generation_id is not None)
    c = client.collection("C")
    gc = b"c%d" % n
    c.start_generation(gc)
    c.put(b"sum", b"%d" % n, generation_id=gc)
    c.commit_generation(
        gc, [ReaderUpdate("from_a", a.generation_id), ReaderUpdate("from_b", b.generation_id)]
    )


def keys(client: Client, name: str) -> list[bytes] | None:
    try:
        return [item.key for item in client.collection(name).query()]
    except DiffstoreError:  # dropped, not copied again yet
        return None


def test_replica_answers_every_read_as_the_primary(primary: Server, replica: Server) -> None:
    with primary.client() as p, replica.client() as r:
        p.create_collection("A", manual=True)
        p.create_collection("B", manual=False)
        c = p.create_collection("C", manual=True, initial_generation_id=b"c0")
        c.create_reader("from_a", "A", None)
        c.create_reader("from_b", "B", None)
        p.collection("A").create_reader("keep", generation_id=None)  # readers of A: GC on, nothing collected
        for n in range(1, 4):
            _round(p, n)
            wait_until(lambda: caught_up(p, r), 60, what="the replica to catch up")
        # readers and leases changed outside commits, collections created and deleted
        p.collection("A").update_reader("keep", b"0001")
        c.create_reader("idle", "C", b"c1")
        c.acquire_lease("transform", "worker-1", 60_000)
        d = p.create_collection("D", manual=False)
        d.put(b"d", b"1")
        wait_until(lambda: "D" in state(r), 60, what="D on the replica")
        p.delete_collection("D")
        e = p.create_collection("E", manual=True)
        e.start_generation(b"1")
        e.put(b"old", b"1", generation_id=b"1")
        e.commit_generation(b"1")
        wait_until(lambda: caught_up(p, r), 60, what="E on the replica")
        p.delete_collection("E")
        e = p.create_collection("E", manual=True)  # the same name again: another collection
        e.start_generation(b"1")
        e.put(b"new", b"2", generation_id=b"1")
        e.commit_generation(b"1")
        _round(p, 4)
        # the new E is at the generation the old one was at: the replica sees it is another collection
        # when it finds its hold gone (at the latest after one idle beat) and copies it again
        wait_until(lambda: keys(r, "E") == [b"new"], 60, what="the new E")
        wait_until(lambda: caught_up(p, r), 60, what="the replica to catch up at last")
        assert "D" not in state(r)
        held = generations(p)
        assert generations(r) == held
        assert histories(r) == histories(p)
        mine, theirs = every_read(r, held), every_read(p, held)
        differ = [
            (name, g, kind, mine[name][g][kind], answer)
            for name, reads in theirs.items()
            for g, kinds in reads.items()
            for kind, answer in kinds.items()
            if mine[name][g][kind] != answer
        ]
        assert not differ, differ[:3]  # (collection, generation, read, replica's answer, primary's answer)


def test_the_replica_lists_the_primarys_history(primary: Server, replica: Server) -> None:
    """SPEC §8: a replica keeps the primary's commit times, changed keys and metadata, whether it applies
    one new generation (one request) or catches up on several (after a pause)."""
    with primary.client() as p, replica.client() as r:
        h = p.create_collection("H", manual=True, initial_generation_id=b"0")
        n = p.create_collection("N", manual=False)

        def commit(g: bytes) -> None:
            h.start_generation(g)
            h.put_many([(b"k", g), (b"k" + g, b"v")], generation_id=g)
            h.commit_generation(g, metadata={"job": "history", "round": g.decode()})

        commit(b"1")
        wait_until(lambda: caught_up(p, r), 60, what="the first copy")
        commit(b"2")  # the replica stands at 1: it applies 2 with one request
        n.put(b"x", b"1")
        wait_until(
            lambda: caught_up(p, r) and r.collection("N").generation_id != b"\0" * 8,
            60,
            what="2 and N's first commit on the replica",
        )
        assert histories(r) == histories(p)
        assert r.collection("H").history(limit=1)[0][0].metadata == {"job": "history", "round": "2"}
        assert replica.process is not None
        with paused(replica.process):  # then it finds 3, 4 and 5 at once: the catch-up path
            for g in (b"3", b"4", b"5"):
                commit(g)
            n.put(b"y", b"2")
            wait_until(lambda: n.generation_state()[0] != b"\0" * 7 + b"\1", 60, what="N's second commit")
        wait_until(lambda: caught_up(p, r), 60, what="the replica to catch up")
        mine, theirs = histories(r), histories(p)
        assert mine == theirs
        assert [(i.generation_id, i.changed_keys) for i in theirs["H"]] == [
            (b"5", 2),
            (b"4", 2),
            (b"3", 2),
            (b"2", 2),
            (b"1", 2),
            (b"0", None),
        ]
        assert all(i.committed_at_ms is not None for i in theirs["H"][:-1])
