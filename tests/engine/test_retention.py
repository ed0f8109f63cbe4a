"""SPEC §9 Retention: a collection keeps the generations its policy names, whatever its readers do."""

from __future__ import annotations

import msgpack
import pytest

from diffstore import Store
from diffstore.engine import layout
from diffstore.engine.types import RetentionPolicy
from diffstore.errors import GenerationCollected, InvalidRequest

from .util import as_dict, commit, raw_state, run_background

GENS = [b"1", b"2", b"3", b"4", b"5"]


class Clock:
    """A hand-moved wall clock (the store's: commits, reads and GC all read it)."""

    def __init__(self) -> None:
        from diffstore.engine.types import wall_clock_ms

        self.now = wall_clock_ms()

    def __call__(self) -> int:
        return self.now


def _five(store: Store, name: str = "c", **policy: int) -> dict[bytes, dict[bytes, bytes]]:
    c = store.create_collection(name, manual=True, retention=RetentionPolicy(**policy) if policy else None)
    seen = {}
    for number, gen in enumerate(GENS, start=1):
        commit(c, gen, [(b"k", b"v%d" % number), (b"g%d" % number, b"x")])
        seen[gen] = as_dict(c, generation_id=gen)
    return seen


def _readable(store: Store, name: str = "c") -> list[bytes]:
    c = store.collection(name)
    found = []
    for gen in GENS:
        try:
            as_dict(c, generation_id=gen)
        except GenerationCollected:
            continue
        found.append(gen)
    return found


def test_without_a_policy_moving_the_reader_collects_all_older_history(store: Store) -> None:
    _five(store)
    store.collection("c").create_reader("r", generation_id=b"5")
    run_background(store)
    assert _readable(store) == [b"5"]


def test_keep_generations_keeps_the_newest_n_readable_and_intact(store: Store) -> None:
    seen = _five(store, keep_generations=3)
    c = store.collection("c")
    c.create_reader("r", generation_id=b"5")
    run_background(store)
    assert _readable(store) == [b"3", b"4", b"5"]
    for gen in (b"3", b"4", b"5"):
        assert as_dict(c, generation_id=gen) == seen[gen]
    assert [(i.key, i.from_value, i.to_value) for i in c.diff(b"3", b"5")] == [
        (b"g4", None, b"x"),
        (b"g5", None, b"x"),
        (b"k", b"v3", b"v5"),
    ]
    # one more generation: the window slides, the oldest kept one goes
    commit(c, b"6", [(b"k", b"v6")], update_readers=[("r", b"6")])
    run_background(store)
    assert _readable(store) == [b"4", b"5"]


def test_reads_below_the_policy_answer_collected_and_change_nothing(store: Store) -> None:
    _five(store, keep_generations=2)
    c = store.collection("c")
    c.create_reader("r", generation_id=b"5")
    run_background(store)
    before = raw_state(store)
    with pytest.raises(GenerationCollected):
        c.get(b"k", generation_id=b"3")
    with pytest.raises(GenerationCollected):
        list(c.diff(b"3"))
    assert raw_state(store) == before
    assert c.get(b"k", generation_id=b"4") is not None


def test_keep_ms_keeps_the_window_and_gc_collects_once_time_passes(open_store) -> None:
    clock = Clock()
    store = open_store(clock_ms=clock)
    c = store.create_collection("c", manual=True, retention=RetentionPolicy(keep_ms=50_000))
    for number, gen in enumerate(GENS, start=1):
        commit(c, gen, [(b"k", b"v%d" % number)])
        clock.now += 20_000  # committed 20 s apart: 1 at t, 5 at t+80 s; now t+100 s
    c.create_reader("r", generation_id=b"5")
    run_background(store)
    # the window [t+50 s, t+100 s] holds 4 and 5; 3 (committed at t+40 s) was current when it began
    assert _readable(store) == [b"3", b"4", b"5"]
    clock.now += 45_000  # window [t+95 s, ...]: 5 was current when it began
    run_background(store)  # no write: GC finds it on its own as time passes
    assert _readable(store) == [b"5"]


def test_gc_running_in_the_background_collects_when_the_window_passes(open_store) -> None:
    clock = Clock()
    store = open_store(clock_ms=clock, background=True, gc_interval_ms=20)
    c = store.create_collection("c", manual=True, retention=RetentionPolicy(keep_ms=1_000))
    for gen in GENS:
        commit(c, gen, [(b"k", gen)])
    c.create_reader("r", generation_id=b"5")
    from tests.helpers import wait_until

    assert _readable(store) == GENS
    clock.now += 10_000
    wait_until(lambda: _readable(store) == [b"5"], timeout=60)


def test_both_keep_what_either_keeps(open_store) -> None:
    clock = Clock()
    store = open_store(clock_ms=clock)
    c = store.create_collection(
        "c", manual=True, retention=RetentionPolicy(keep_ms=30_000, keep_generations=2)
    )
    for gen in GENS:
        commit(c, gen, [(b"k", gen)])
        clock.now += 10_000
    c.create_reader("r", generation_id=b"5")
    run_background(store)
    # time keeps 3 (current at t+20 s, the window's start) and after; count keeps 4, 5
    assert _readable(store) == [b"3", b"4", b"5"]


def test_a_policy_does_not_run_gc_without_readers(store: Store) -> None:
    _five(store, keep_generations=1)
    before = raw_state(store)
    run_background(store)
    assert raw_state(store)["records"] == before["records"]
    assert _readable(store) == GENS


def test_set_retention_later_and_clear_it(store: Store) -> None:
    _five(store)
    c = store.collection("c")
    assert c.retention() is None
    assert c.set_retention(RetentionPolicy(keep_generations=4)) == RetentionPolicy(keep_generations=4)
    c.create_reader("r", generation_id=b"5")
    run_background(store)
    assert _readable(store) == [b"2", b"3", b"4", b"5"]
    # a longer policy cannot bring back what is gone; a shorter one lets GC go on
    c.set_retention(RetentionPolicy(keep_generations=100))
    assert _readable(store) == [b"2", b"3", b"4", b"5"]
    assert c.set_retention(RetentionPolicy()) is None
    assert c.retention() is None
    run_background(store)
    assert _readable(store) == [b"5"]


@pytest.mark.parametrize(
    "policy",
    [{"keep_ms": 0}, {"keep_generations": 0}, {"keep_ms": -1}, {"keep_generations": True}, {"keep_ms": 1.5}],
)
def test_bad_policies_are_invalid(policy: dict[str, object]) -> None:
    with pytest.raises(InvalidRequest):
        RetentionPolicy(**policy)  # type: ignore[arg-type]


def test_store_default_applies_to_new_collections_only(open_store, tmp_path) -> None:
    store = open_store(default_retention=RetentionPolicy(keep_generations=7))
    a = store.create_collection("a", manual=False)
    b = store.create_collection("b", manual=True, retention=RetentionPolicy(keep_ms=1_000))
    none = store.create_collection("none", manual=True, retention=RetentionPolicy())
    assert a.retention() == RetentionPolicy(keep_generations=7)
    assert b.retention() == RetentionPolicy(keep_ms=1_000)
    assert none.retention() is None
    store.close()
    reopened = open_store()  # another process without the default: the collections keep theirs
    assert reopened.collection("a").retention() == RetentionPolicy(keep_generations=7)
    assert reopened.create_collection("c", manual=True).retention() is None


def test_old_metadata_rows_open_without_migration(store: Store) -> None:
    store.create_collection("c", manual=True)
    with store.env.begin(write=True) as txn:  # the row as stores before retention wrote it: 13 fields
        raw = txn.get(b"c", db=store.tables.collections)
        fields = msgpack.unpackb(raw, raw=False)
        txn.put(b"c", msgpack.packb(fields[:13], use_bin_type=True), db=store.tables.collections)
    assert store.collection("c").retention() is None
    store.collection("c").set_retention(RetentionPolicy(keep_generations=2))
    assert store.collection("c").retention() == RetentionPolicy(keep_generations=2)
    assert layout.is_collection_row(b"c")


def test_history_marks_collected_generations(store: Store) -> None:
    _five(store, keep_generations=2)
    c = store.collection("c")
    infos, _ = c.history()
    assert not any(info.collected for info in infos)
    c.create_reader("r", generation_id=b"5")
    expected = [(b"5", False), (b"4", False), (b"3", True), (b"2", True), (b"1", True), (b"", True)]
    # marked as soon as reads there answer 410 (the readers' minimum), before and after GC's work
    infos, _ = c.history()
    assert [(info.generation_id, info.collected) for info in infos] == expected
    run_background(store)
    infos, _ = c.history()
    assert [(info.generation_id, info.collected) for info in infos] == expected
    assert _readable(store) == [b"4", b"5"]


def test_backup_and_compaction_keep_the_policy_and_what_it_keeps(open_store, tmp_path) -> None:
    from diffstore.engine import backup, check, compact

    source = open_store(tmp_path / "source")
    seen = _five(source, keep_generations=3)
    source.collection("c").create_reader("r", generation_id=b"5")
    run_background(source)
    source.close()  # (LMDB opens a directory once per process: the backup opens it on its own)
    backup.backup_directory(tmp_path / "source", tmp_path / "copy")
    compact.compact(tmp_path / "source")
    for where in ("source", "copy"):
        assert check.check_directory(tmp_path / where).ok  # a row with a policy is a sound row
        restored = open_store(tmp_path / where)
        c = restored.collection("c")
        assert c.retention() == RetentionPolicy(keep_generations=3)
        run_background(restored)  # GC there honours the policy it came with
        assert _readable(restored) == [b"3", b"4", b"5"]
        assert {gen: as_dict(c, generation_id=gen) for gen in (b"3", b"4", b"5")} == {
            gen: seen[gen] for gen in (b"3", b"4", b"5")
        }
        commit(c, b"6", [(b"k", b"v6")], update_readers=[("r", b"6")])
        run_background(restored)
        assert _readable(restored) == [b"4", b"5"]
        restored.close()
