"""The exactly-once round (diffstore.rounds) over both Collection implementations: the engine's and the
HTTP client's, with real LMDB and a real server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diffstore import Collection, ReaderUpdate, Store, StoreConfig
from diffstore.errors import BadVersion, InvalidRequest
from diffstore.rounds import (
    Round,
    checkpoint_reader,
    ensure_readers,
    next_generation_id,
    shard_reader,
    shard_reader_target,
    source_reader,
)
from tests.helpers import running_server

IDS = st.binary(max_size=20).filter(lambda b: b[:8] != b"\xff" * 8)


@given(IDS, st.none() | IDS, st.binary(max_size=8))
def test_the_next_id_sorts_above_current_and_open(current: bytes, opened: bytes | None, nonce: bytes) -> None:
    g = next_generation_id(current, opened, nonce)
    assert g > current and (opened is None or g > opened)
    assert len(g) == 8 + len(nonce) and g.endswith(nonce)


def test_generation_ids_are_an_8_byte_counter_then_the_nonce() -> None:
    assert next_generation_id(b"") == b"\x00" * 7 + b"\x01"
    assert next_generation_id(b"\x00" * 7 + b"\xff") == b"\x00" * 6 + b"\x01\x00"
    assert next_generation_id(b"\x00" * 7 + b"\x05", b"\x00" * 7 + b"\x09xyz", b"N") == b"\x00" * 7 + b"\x0aN"
    assert next_generation_id(b"v1") == b"v1" + b"\x00" * 5 + b"\x01"  # foreign ids: zero-padded counter
    with pytest.raises(OverflowError):
        next_generation_id(b"\xff" * 8)


def test_reader_names_follow_the_spec() -> None:
    assert shard_reader("sub", 42) == "hstream/sub/42"  # SPEC §5
    assert shard_reader_target("orders") == "hstream://orders"
    assert source_reader("a") == "from_a"  # SPEC §6
    assert checkpoint_reader("users") == "users"


@pytest.fixture(params=["engine", "client"])
def collection(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Collection]:
    """A manual collection ``C`` (initial generation ``00..00``) and a source ``A``, through either front."""
    if request.param == "engine":
        with Store.open(tmp_path / "engine", StoreConfig(commit_delay_ms=10)) as store:
            store.create_collection("A", manual=True)
            yield store.create_collection("C", manual=True, initial_generation_id=bytes(8))
        return
    with running_server(tmp_path / "data") as live, live.client() as client:
        client.create_collection("A", manual=True)
        yield client.create_collection("C", manual=True, initial_generation_id=bytes(8))


def test_a_round_commits_its_writes_and_readers_together(collection: Collection) -> None:
    readers = ensure_readers(collection, {"from_a": "A"})
    assert readers["from_a"].generation_id in (None, b"")
    round_ = Round.next(collection)
    assert (round_.generation_id, round_.base_generation_id) == ((1).to_bytes(8, "big"), bytes(8))

    round_.run(
        [ReaderUpdate("from_a", b"a1", expected=None)],
        lambda g: collection.put_many([(b"k", b"v")], generation_id=g),
    )

    assert collection.generation_state() == ((1).to_bytes(8, "big"), None)
    assert collection.get(b"k") is not None
    assert ensure_readers(collection, {"from_a": "A"})["from_a"].generation_id == b"a1"


def test_a_failed_round_leaves_the_collection_unchanged(collection: Collection) -> None:
    ensure_readers(collection, {"from_a": "A"})
    round_ = Round.next(collection)
    stale = [ReaderUpdate("from_a", b"a1", expected=b"not-there")]

    with pytest.raises(BadVersion):
        round_.run(stale, lambda g: collection.put_many([(b"k", b"v")], generation_id=g))

    assert collection.generation_state() == (bytes(8), None)  # aborted: nothing of the round is left
    assert collection.get(b"k") is None
    assert ensure_readers(collection, {"from_a": "A"})["from_a"].generation_id in (None, b"")

    def failing_write(generation_id: bytes) -> None:
        collection.put(b"half", b"written", generation_id=generation_id)
        raise RuntimeError("the job died")

    with pytest.raises(RuntimeError):
        Round.next(collection).run([], failing_write)
    assert collection.generation_state() == (bytes(8), None) and collection.get(b"half") is None


def test_a_round_written_in_one_call_commits_or_leaves_nothing(collection: Collection) -> None:
    ensure_readers(collection, {"from_a": "A"})
    stale = [ReaderUpdate("from_a", b"a1", expected=b"not-there")]
    with pytest.raises(BadVersion):
        Round.next(collection).write([(b"k", b"v")], stale)
    assert collection.generation_state() == (bytes(8), None)  # over HTTP the open generation was aborted
    assert collection.get(b"k") is None

    leftover = Round.next(collection)
    leftover.start()  # a crashed writer's open generation: the next round's abortOutdated discards it
    collection.put(b"left", b"over", generation_id=leftover.generation_id)
    round_ = Round.next(collection)
    round_.write([(b"k", b"v")], [ReaderUpdate("from_a", b"a1", expected=None)], {"window": "1"})
    assert collection.generation_state() == (round_.generation_id, None)
    assert collection.get(b"left") is None and collection.get(b"k") is not None
    assert ensure_readers(collection, {"from_a": "A"})["from_a"].generation_id == b"a1"
    assert collection.history(limit=1)[0][0].metadata == {"window": "1"}


def test_abort_leaves_another_writers_generation_alone(collection: Collection) -> None:
    mine = Round.next(collection, b"me")
    mine.start()
    theirs = Round.next(collection, b"them")
    theirs.start()  # abortOutdated: it discards mine
    assert mine.abort() is False
    assert collection.generation_state()[1] == theirs.generation_id
    assert theirs.abort() is True
    assert collection.generation_state() == (bytes(8), None)


def test_readers_with_another_target_are_refused(collection: Collection) -> None:
    collection.create_reader("from_a", "C", None)
    with pytest.raises(InvalidRequest):
        ensure_readers(collection, {"from_a": "A"})
    assert [(r.name, r.collection) for r in collection.readers()] == [("from_a", "C")]
