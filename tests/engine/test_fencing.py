"""The replication term and fencing in the engine: promotion raises the term; a primary told of a higher
term (by the new primary, or by a request) steps down and refuses writes in every process that opens the
store, across restarts; a stale new primary is refused; an operator can lift the fencing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

from diffstore import Store
from diffstore.engine import check, layout
from diffstore.engine.types import ReplicaGeneration
from diffstore.errors import Fenced, NotReplica, ReadOnlyReplica
from tests.engine.conftest import StoreFactory

_OTHER_PROCESS = """
import sys
from diffstore import Store
from diffstore.errors import DiffstoreError
with Store.open(sys.argv[1]) as store:
    try:
        store.check_writable()
        print("writable")
    except DiffstoreError as exc:
        print(exc.code, type(exc).__name__, exc.term)
    print(store.collection("A").get(b"k").value.decode())
"""


def _primary(open_store: StoreFactory, path: Path) -> Store:
    store = open_store(path)
    a = store.create_collection("A", manual=True)
    a.write_generation(b"1", [(b"k", b"v")])
    return store


def test_a_primary_told_to_step_down_refuses_writes_everywhere(
    open_store: StoreFactory, tmp_path: Path
) -> None:
    store = _primary(open_store, tmp_path / "p")
    state = store.replica_state()
    assert (state.term, state.role, state.fenced) == (0, "primary", None)
    store.check_writable()  # a primary writes
    fenced = store.step_down(3, "http://new:1", "r9")
    assert fenced is not None and (fenced.term, fenced.primary, fenced.replica_id) == (
        3,
        "http://new:1",
        "r9",
    )
    with pytest.raises(Fenced) as refused:
        store.check_writable()
    assert (refused.value.term, refused.value.primary) == (3, "http://new:1")
    assert refused.value.details() == {"term": 3, "primary": "http://new:1"}
    # the same new primary asking again answers the same; a stale or another one at that term is refused
    assert store.step_down(3, "http://new:1", "r9") == fenced
    for told, replica_id in ((3, "other"), (2, "r9")):
        with pytest.raises(Fenced) as stale:
            store.step_down(told, "http://other:2", replica_id)
        assert stale.value.term == 3
    # another process sees it, and so does the store reopened; the data stayed; check passes
    seen = subprocess.run(
        [sys.executable, "-c", _OTHER_PROCESS, str(tmp_path / "p")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert seen.stdout.split() == ["fenced", "Fenced", "3", "v"], seen.stderr
    store.close()
    report = check.check_directory(tmp_path / "p")
    assert report.ok, report.problems
    again = open_store(tmp_path / "p")
    assert again.replica_state().fenced == fenced
    # an operator lifts it: one term above, writable again
    assert again.unfence() == 4
    again.check_writable()
    assert again.replica_state().role == "primary" and again.replication_term() == 4
    with pytest.raises(NotReplica):
        again.unfence()


def test_a_request_carrying_a_higher_term_fences_a_primary(open_store: StoreFactory, tmp_path: Path) -> None:
    store = _primary(open_store, tmp_path / "p")
    assert not store.learn_term(0)
    assert store.learn_term(5)
    assert not store.learn_term(5) and not store.learn_term(4)
    with pytest.raises(Fenced) as refused:
        store.check_writable()
    assert (refused.value.term, refused.value.primary) == (5, None)


def test_promotion_raises_the_term_above_what_the_replica_learnt(
    open_store: StoreFactory, tmp_path: Path
) -> None:
    replica = open_store(tmp_path / "r")
    replica.become_replica("http://primary", "r1")
    assert replica.apply_replica_generation(ReplicaGeneration("A", True, None, b"", []))
    with pytest.raises(ReadOnlyReplica):
        replica.check_writable()
    # a replica takes a higher term (told or carried) but is not fenced: it refuses writes anyway
    assert replica.step_down(2, "http://someone", "x") is None
    assert replica.learn_term(3)
    state = replica.replica_state()
    assert (state.term, state.role, state.fenced) == (3, "replica", None)
    assert replica.promote_replica(2) == 4  # never below one above its own
    state = replica.replica_state()
    assert (state.term, state.role) == (4, "primary")
    replica.check_writable()
    other = open_store(tmp_path / "p2")
    other.become_replica("http://primary", "r2")
    assert other.promote_replica(7) == 7


def test_a_stepped_down_store_takes_no_user_write_and_commits_what_it_acknowledged(
    open_store: StoreFactory, tmp_path: Path
) -> None:
    store = _primary(open_store, tmp_path / "p")
    auto = store.create_collection("B", manual=False)
    pending = auto.put(b"acked", b"1")  # acknowledged, waiting for its automatic commit
    assert auto.generation_id != pending.generation_id
    a = store.collection("A")
    a.create_reader("diffstore-replica:r9", generation_id=b"1")  # a replica's hold
    before = (a.generation_state(), auto.generation_state(), [c.name for c in store.collections()])
    assert store.step_down(1, "http://new:1", "r9") is not None
    # the pending write is committed by the step-down itself: the store's state is final
    assert auto.generation_id == pending.generation_id
    assert auto.get(b"acked").value == b"1"  # type: ignore[union-attr]
    refused = [
        lambda: a.start_generation(b"2"),
        lambda: auto.put(b"late", b"x"),
        lambda: auto.put_many([(b"late", b"x")]),
        lambda: a.create_reader("other", generation_id=None),
        lambda: a.delete_reader("r"),
        lambda: a.start_phantom(),
        lambda: a.acquire_lease("l", "me", 10_000),
        lambda: store.create_collection("C", manual=True),
        lambda: store.delete_collection("A"),
    ]
    for write in refused:
        with pytest.raises(Fenced):
            write()
    after = (a.generation_state(), auto.generation_state(), [c.name for c in store.collections()])
    assert after == (before[0], (pending.generation_id, auto.next_generation_id), before[2])
    a.delete_reader("diffstore-replica:r9")  # the new primary lets its hold go
    assert [r.name for r in a.readers()] == []


@pytest.mark.parametrize(
    ("row", "raw", "expected"),
    [
        (layout.REPLICA_FENCED, msgpack.packb([9, None, None, 1]), "the fencing is not [term at most"),
        (layout.REPLICA_FENCED, b"\xc1", "the fencing is not [term at most"),
        (layout.REPLICA_TERM, b"\x01", "the replication term is not 8 bytes"),
        (layout.REPLICA_SELF, b"nowhere", "is not a URL"),
    ],
    ids=["above-the-term", "not-msgpack", "short-term", "address"],
)
def test_check_finds_damaged_fencing_rows(
    open_store: StoreFactory, tmp_path: Path, row: bytes, raw: bytes, expected: str
) -> None:
    store = _primary(open_store, tmp_path / "p")
    store.step_down(2, "http://new:1", "r9")
    with store.write() as scope:
        scope.txn.put(row, raw, db=store.tables.replica)
    store.close()
    found = [str(problem) for problem in check.check_directory(tmp_path / "p").problems]
    assert any(expected in line for line in found), found
