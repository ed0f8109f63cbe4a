"""The follower's decisions without I/O: walking the primary's generation pages back to the replica's
position, and which readers a replica copies."""

from __future__ import annotations

from diffstore.engine.types import Lease, Reader
from diffstore.replica._plan import Pending, copies_differ, reader_copies, reader_name


def test_pending_walks_pages_back_to_the_position() -> None:
    pending = Pending.after(b"2")
    assert not pending.page([b"6", b"5"], more=True)
    assert pending.page([b"4", b"3", b"2", b"1"], more=True)
    assert pending.found and pending.ahead == [b"3", b"4", b"5", b"6"]


def test_pending_without_the_position_is_not_found() -> None:
    gone = Pending.after(b"2")  # the primary's history has no 2: another collection of that name
    assert gone.page([b"3", b"1"], more=False)
    assert not gone.found and gone.ahead == [b"3"]
    short = Pending.after(b"2")
    assert short.page([b"5", b"4"], more=False)
    assert not short.found
    same = Pending.after(b"2")
    assert same.page([b"2"], more=True) and same.found and same.ahead == []


def test_replica_holds_are_never_copied() -> None:
    hold = reader_name("r1")
    readers = [Reader("b", "X", b"1"), Reader(hold, "X", b"2"), Reader("a", "X", None)]
    assert reader_copies(readers) == [Reader("a", "X", None), Reader("b", "X", b"1")]
    lease = Lease("l", "me", 1, 5)
    assert not copies_differ(readers, [lease], [Reader("b", "X", b"1"), Reader("a", "X", None)], [lease])
    assert copies_differ(readers, [lease], [Reader("a", "X", None)], [lease])
    assert copies_differ(readers, [lease], reader_copies(readers), [])
