"""The index of each generation's keys in both its forms (engine/changes.py): a store written before
``change_chunks`` existed (a ``changes`` row per key, written here through layout.py) reads, diffs, counts,
aborts, takes new writes and is collected exactly as one written now; and a generation holding both forms
at once (written in both layouts) stays whole.

Each scenario runs twice side by side: on a store left as written, and on its twin whose chunks are
rewritten as ``changes`` rows at given steps (an old store, then opened by this code); every answer of
the two must be equal, and ``diffstore check`` must pass on both.
"""

from __future__ import annotations

import contextlib
import itertools
import uuid
from pathlib import Path
from unittest import mock

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from diffstore import Store, StoreConfig
from diffstore.engine import changes, check, layout

from .util import as_dict, run_background

Items = list[tuple[bytes, bytes | None]]
LONG = b"L" * 250


def as_old_layout(store: Store) -> int:
    """Rewrites every chunk as a ``changes`` row per key, the layout before chunks; returns how many
    chunks it rewrote."""
    tables = store.tables
    with store.write() as scope:
        txn = scope.txn
        chunks = [(bytes(key), bytes(raw)) for key, raw in txn.cursor(db=tables.change_chunks)]
        for key, raw in chunks:
            run = key[:12]
            for form in layout.unpack_forms(raw):
                assert txn.put(run + form, b"", db=tables.changes, overwrite=False)
            txn.delete(key, db=tables.change_chunks)
    return len(chunks)


def keys(*indices: int) -> list[bytes]:
    return [b"k%03d" % i for i in indices]


def steps() -> list[tuple[str, object]]:
    """What the scenario does, step by step (a list, so that both stores run exactly the same)."""
    every = range(300)
    return [
        ("commit", (b"1", [(k, b"v1") for k in keys(*every)] + [(LONG + b"a", b"la"), (b"z\x00", b"zero")])),
        ("commit", (b"2", [(k, b"v2") for k in keys(*every[::7])] + [(LONG + b"b", b"lb")])),
        ("start", b"3"),
        ("put_many", (b"3", [(k, b"v3") for k in keys(*range(100, 151))])),
        ("put_many", (b"3", [(k, b"w3") for k in keys(*range(140, 161))])),  # partly held already
        ("put_many", (b"3", [(k, None) for k in keys(50, 20, 145)] + [(LONG + b"a", None)])),
        ("put_many", (b"3", [(k, b"x3") for k in keys(10, 299)])),
        ("commit_open", b"3"),
        ("start", b"4"),
        ("put_many", (b"4", [(k, b"v4") for k in keys(*range(0, 300, 3))])),
        ("abort", b"4"),
        ("commit", (b"4", [(k, b"v4") for k in keys(*range(5, 300, 11))])),
        ("commit", (b"5", [(k, b"v5") for k in keys(*every)])),
        ("reader", b"3"),
        ("commit", (b"6", [(k, b"v6") for k in keys(*range(200, 260))] + [(b"z\x00", None)])),
        ("reader", b"5"),
    ]


def run_step(store: Store, step: tuple[str, object]) -> None:
    coll = store.collection("c")
    kind, arg = step
    if kind == "commit":
        generation, items = arg  # type: ignore[misc]
        coll.start_generation(generation)
        coll.put_many(items, generation_id=generation)
        coll.commit_generation(generation)
    elif kind == "start":
        coll.start_generation(arg)  # type: ignore[arg-type]
    elif kind == "put_many":
        generation, items = arg  # type: ignore[misc]
        coll.put_many(items, generation_id=generation)
    elif kind == "commit_open":
        coll.commit_generation(arg)  # type: ignore[arg-type]
    elif kind == "abort":
        coll.abort_generation(arg)  # type: ignore[arg-type]
    elif kind == "reader":
        coll.update_reader("r", arg)  # type: ignore[arg-type]
        run_background(store)
    else:
        raise AssertionError(kind)


def answers(store: Store) -> dict[str, object]:
    """Everything a user can read of the collection: states, diffs (the scan and the keyed way, with and
    without intermediate values, key ranges), changed-key counts, what a replica copies."""
    coll = store.collection("c")
    generations, _ = coll.generations(limit=1000)
    history = [(info.generation_id, info.changed_keys) for info in coll.history(limit=1000)[0]]
    found: dict[str, object] = {"generations": generations, "history": history}
    kept = [g for g in generations if not coll.readers() or g >= (coll.readers()[0].generation_id or b"")]
    for generation in kept:
        found[f"state {generation!r}"] = as_dict(coll, generation_id=generation)
        found[f"records {generation!r}"] = coll.generation_records(generation, limit=10_000).records
    for start, end in itertools.combinations_with_replacement([b"", *sorted(kept)], 2):
        if end == b"" or start > end:
            continue
        for intermediate in (False, True):
            found[f"diff {start!r} {end!r} {intermediate}"] = list(
                coll.diff(from_generation_id=start, to_generation_id=end, include_intermediate=intermediate)
            )
        found[f"diff range {start!r} {end!r}"] = list(
            coll.diff(from_generation_id=start, to_generation_id=end, from_key=b"k100", to_key=b"k150")
        )
    return found


def python_only(on: bool) -> contextlib.AbstractContextManager[object]:
    return mock.patch.object(layout, "ACCEL", None) if on else contextlib.nullcontext()


@pytest.mark.parametrize("pure", [False, True], ids=["accelerator", "pure-python"])
@pytest.mark.parametrize(
    "old_at",
    [{0}, {1}, {3}, {4, 6}, {9}, {11, 12, 13}],
    ids=["first-generation", "committed", "open", "open-mixed", "open-then-aborted", "before-gc"],
)
def test_a_store_in_the_old_layout_answers_as_one_in_the_new(
    tmp_path: Path, old_at: set[int], pure: bool
) -> None:
    if pure is False and layout.ACCEL is None:
        pytest.skip("the compiled accelerator was not built")
    script = steps()
    config = StoreConfig(background=False)
    with (
        python_only(pure),
        Store.open(tmp_path / "new", config) as new,
        Store.open(tmp_path / "old", config) as old,
    ):
        for store in (new, old):
            store.create_collection("c", manual=True).create_reader("r", None, None)
        rewritten = 0
        for index, step in enumerate(script):
            for store in (new, old):
                run_step(store, step)
            if index in old_at:
                rewritten += as_old_layout(old)
            assert answers(old) == answers(new), f"after step {index} {step[0]}"
            for store in (new, old):
                with store.env.begin() as txn:
                    report = check.check(txn, store.tables)
                assert report.ok, (index, report.problems)
        assert rewritten > 0  # the old store did hold changes rows of its own
        with new.env.begin() as txn_new, old.env.begin() as txn_old:
            assert list(txn_new.cursor(db=new.tables.records)) == list(txn_old.cursor(db=old.tables.records))


def test_new_writes_into_a_generation_of_the_old_layout_count_each_key_once(tmp_path: Path) -> None:
    """An open generation of an old store (``changes`` rows) takes writes that append chunks after its
    rows and rows among them; the count of its keys (its history row) and its diff stay exact."""
    with Store.open(tmp_path / "s", StoreConfig(background=False)) as store:
        coll = store.create_collection("c", manual=True)
        coll.start_generation(b"1")
        coll.put_many([(k, b"a") for k in keys(10, 20, 30)], generation_id=b"1")
        assert as_old_layout(store) == 1
        coll.put_many([(k, b"b") for k in keys(40, 50)], generation_id=b"1")  # above: a chunk
        coll.put_many([(k, b"c") for k in keys(20, 25, 50, 60)], generation_id=b"1")  # 20, 50 held
        coll.commit_generation(b"1")
        info = coll.history()[0][0]
        assert info.changed_keys == 7
        assert [item.key for item in coll.diff(from_generation_id=b"", to_generation_id=b"1")] == keys(
            10, 20, 25, 30, 40, 50, 60
        )
        with store.env.begin() as txn:
            report = check.check(txn, store.tables)
        assert report.ok, report.problems
        assert report.rows["changes"] > 0 and report.rows["change_chunks"] > 0


def test_chunks_of_the_longest_keys_stay_in_their_pages(tmp_path: Path) -> None:
    """A chunk whose first form is a long key's (418 bytes) still fits a node of its page: no chunk takes
    an overflow page of its own (fails with 1,800 bytes of forms per chunk)."""
    with Store.open(tmp_path / "s", StoreConfig(background=False)) as store:
        coll = store.create_collection("c", manual=True)
        coll.start_generation(b"1")
        coll.put_many([(b"\x00" * 200 + b"%04d" % i, b"v") for i in range(200)], generation_id=b"1")
        coll.commit_generation(b"1")
        with store.env.begin() as txn:
            stat = txn.stat(store.tables.change_chunks)
            assert stat["entries"] > 1 and stat["overflow_pages"] == 0
        assert len(list(coll.diff(from_generation_id=b"", to_generation_id=b"1"))) == 200


# --- engine/changes.py against a model: a run's forms split at random into rows and chunks ---------------

_FORMS = st.lists(st.binary(max_size=3).map(layout.key_form), unique=True, max_size=40)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    run_forms=_FORMS,
    neighbour_forms=_FORMS,
    split=st.lists(st.integers(0, 3), min_size=40, max_size=40),
    bounds=st.tuples(st.binary(max_size=3), st.none() | st.binary(max_size=3)),
    removed=st.sets(st.integers(0, 39), max_size=12),
    pure=st.booleans(),
)
def test_a_run_reads_and_loses_forms_as_the_set_it_stands_for(
    tmp_path: Path,
    run_forms: list[bytes],
    neighbour_forms: list[bytes],
    split: list[int],
    bounds: tuple[bytes, bytes | None],
    removed: set[int],
    pure: bool,
) -> None:
    """Forms of generation 5 as ``changes`` rows (split 0) or in chunks (a new chunk where split is 1, the
    chunk before going on otherwise), beside generations 4 and 6 holding other forms in both forms: every
    read gives the set's answer, and removing forms leaves the set without them and chunks that still
    ascend and do not overlap."""
    prefix = layout.cid_bytes(3)
    run = layout.change_prefix(prefix, 5)
    forms = sorted(run_forms)
    lower, upper = layout.key_form(bounds[0]), None if bounds[1] is None else layout.key_form(bounds[1])
    with (
        python_only(pure),  # chunks unpacked by the accelerator or by the pure-Python twin
        Store.open(tmp_path / f"s{uuid.uuid4().hex}", StoreConfig(background=False)) as store,
    ):
        tables = store.tables
        with store.write() as scope:
            txn = scope.txn
            for seq in (4, 6):  # neighbours: half rows, half one chunk
                neighbours = sorted(neighbour_forms)
                for form in neighbours[::2]:
                    txn.put(layout.change_key(prefix, seq, form), b"", db=tables.changes)
                if neighbours[1::2]:
                    txn.put(
                        layout.change_key(prefix, seq, neighbours[1]),
                        layout.pack_forms(neighbours[1::2]),
                        db=tables.change_chunks,
                    )
            chunk: list[bytes] = []
            chunks: list[list[bytes]] = []
            for form, how in zip(forms, split, strict=False):
                if how == 0:
                    txn.put(run + form, b"", db=tables.changes)
                    continue
                if how == 1 or not chunk:
                    chunk = []
                    chunks.append(chunk)
                chunk.append(form)
            for held in chunks:
                txn.put(run + held[0], layout.pack_forms(held), db=tables.change_chunks)
        with store.env.begin() as txn:
            expected = [f for f in forms if f >= lower and (upper is None or f < upper)]
            assert list(changes.forms(txn, tables, prefix, 5, lower, upper)) == expected
            assert changes.count(txn, tables, prefix, 5) == len(forms)
            assert changes.any_written(txn, tables, prefix, 5) == bool(forms)
            assert changes.last_key(txn, tables, run) == (run + forms[-1] if forms else None)
            in_chunks = {form for held in chunks for form in held}
            probes = forms + [layout.key_form(b"\xff\xff\xff\xff"), layout.key_form(b"")]
            assert changes.held_in_chunks(txn, tables, run, probes) == in_chunks
        gone = [forms[i] for i in removed if i < len(forms)] + [layout.key_form(b"\xfe" * 4)]
        with store.write() as scope:
            changes.remove(scope.txn, tables, prefix, 5, gone)
        with store.env.begin() as txn:
            kept = [f for f in forms if f not in gone]
            assert list(changes.forms(txn, tables, prefix, 5)) == kept
            for seq in (4, 6):
                assert list(changes.forms(txn, tables, prefix, seq)) == sorted(neighbour_forms)
            left = [
                layout.unpack_forms(raw)
                for key, raw in txn.cursor(db=tables.change_chunks)
                if key[:12] == run
            ]
            assert all(held and held == sorted(held) for held in left)
            assert all(a[-1] < b[0] for a, b in zip(left, left[1:], strict=False))
            assert all(txn.get(run + held[0], db=tables.change_chunks) is not None for held in left)
