"""Fencing covers the open generation, not only start and commit (issue 25, item 2).

The open generation remembers the lease it was started under: its writes, commit and abort must carry it,
and a start under a newer version drops it whatever its id. A model of that table (engine/leases.py)
checked by hypothesis, examples of each rule, and two processes on one directory playing the issue's
owner change (:func:`tests.lease_actor.play_takeover`).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import hypothesis.strategies as st
import msgpack
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from diffstore import Store, StoreConfig
from diffstore.engine.types import LeaseToken
from diffstore.errors import DiffstoreError, GenerationMismatch, LeaseLost, OutdatedGeneration
from tests.engine.conftest import StoreFactory
from tests.helpers import ManualClock
from tests.lease_actor import Actor, play_paused_takeover, play_takeover


def gen(n: int) -> bytes:
    return n.to_bytes(8, "big")


# --- the model ------------------------------------------------------------------------------------------


@dataclass
class Open:
    generation: bytes
    lease: LeaseToken | None
    records: dict[bytes, bytes] = field(default_factory=dict)


@dataclass
class Model:
    """One lease ``w`` (version, holder or not) and a manual collection, as the table of engine/leases.py
    says they behave."""

    version: int = 0
    held: bool = False
    current: bytes = b""
    committed: dict[bytes, bytes] = field(default_factory=dict)
    open: Open | None = None

    def fences(self, token: LeaseToken | None) -> bool:
        return token is None or (self.held and token.version == self.version)

    def supersedes(self, token: LeaseToken | None) -> bool:
        assert self.open is not None
        opened = self.open.lease
        if opened is not None and not self.fences(opened):
            return True  # its owner is fenced out: anyone may start over or abort
        return token is not None and (opened is None or token.version > opened.version)

    def start(self, g: bytes, token: LeaseToken | None) -> str | None:
        if not self.fences(token):
            return "leaseLost"
        if self.open is not None and self.open.lease != token:
            if not self.supersedes(token):
                return "leaseLost"
            self.open = None
        if self.open is not None and self.open.generation == g:
            return None
        self.open = Open(g, token)  # ids only grow here: abortOutdated drops an older open generation
        return None

    def put(self, key: bytes, value: bytes, token: LeaseToken | None) -> str | None:
        if not self.fences(token):
            return "leaseLost"
        if self.open is None:
            return "generationMismatch"
        if self.open.lease != token:
            return "leaseLost"
        self.open.records[key] = value
        return None

    def revert(self, token: LeaseToken | None) -> str | None:
        """A revert to the current generation: fenced as a put; the open generation then reads as the
        current one (the keys it wrote get their committed values back, or are deleted)."""
        if not self.fences(token):
            return "leaseLost"
        if self.open is None:
            return "generationMismatch"
        if self.open.lease != token:
            return "leaseLost"
        self.open.records = {k: v for k, v in self.committed.items() if k in self.open.records}
        return None

    def finish(self, commit: bool, token: LeaseToken | None) -> str | None:
        if not self.fences(token):
            return "leaseLost"
        if self.open is None:
            return "generationMismatch"
        if self.open.lease != token and (commit or not self.supersedes(token)):
            return "leaseLost"
        if commit:
            self.current = self.open.generation
            self.committed.update(self.open.records)
        self.open = None
        return None


TOKENS = st.none() | st.integers(1, 4).map(lambda v: LeaseToken("w", v))
KEYS = st.sampled_from([b"k1", b"k2"])


class FencingMachine(RuleBasedStateMachine):
    """Owners come and go on lease ``w`` while writers with any token (or none) start, write, revert, commit
    and abort; the store must do what the model says, and a refused call must change nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="fencing-")
        self.clock = ManualClock()
        self.store = Store.open(self.dir, StoreConfig(background=False, clock_ms=self.clock))
        self.c = self.store.create_collection("c", manual=True)
        self.model = Model()
        self.counter = 0
        self.writes = 0

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _expect(self, expected: str | None, call: object) -> None:
        before = (self.c.generation_state(), self._visible())
        try:
            call()  # type: ignore[operator]
            got = None
        except DiffstoreError as exc:
            got = exc.code
        assert got == expected
        if got is not None:
            assert (self.c.generation_state(), self._visible()) == before

    def _visible(self) -> tuple[dict[bytes, bytes], dict[bytes, bytes] | None]:
        """The records of the current generation, and those a read of the open one sees (None: none open)."""
        next_open = self.c.generation_state()[1]
        committed = {r.key: r.value for r in self.c.query() if r.value is not None}
        pending = None if next_open is None else {r.key: r.value for r in self.c.query(next_open) if r.value}
        return committed, pending

    @rule(owner=st.sampled_from(["A", "B"]))
    def take_over(self, owner: str) -> None:
        """The holder's lease expires (it paused) and ``owner`` takes it: a new version."""
        self.clock.now_ms += 1_000
        lease = self.c.acquire_lease("w", owner, 1_000)
        self.model.version, self.model.held = lease.version, True
        assert lease.version == self.model.version

    @rule()
    def expire(self) -> None:
        self.clock.now_ms += 1_000
        self.model.held = False

    @rule(token=TOKENS, same=st.booleans())
    def start(self, token: LeaseToken | None, same: bool) -> None:
        if not (same and self.model.open is not None):
            self.counter += 1
        g = self.model.open.generation if same and self.model.open is not None else gen(self.counter)
        expected = self.model.start(g, token)
        self._expect(expected, lambda: self.c.start_generation(g, abort_outdated=True, lease=token))

    @rule(token=TOKENS, key=KEYS)
    def put(self, token: LeaseToken | None, key: bytes) -> None:
        g = self.model.open.generation if self.model.open is not None else gen(self.counter)
        self.writes += 1
        value = b"%d" % self.writes
        expected = self.model.put(key, value, token)
        self._expect(expected, lambda: self.c.put(key, value, generation_id=g, lease=token))

    @rule(token=TOKENS)
    def revert(self, token: LeaseToken | None) -> None:
        g = self.model.open.generation if self.model.open is not None else gen(self.counter)
        current = self.model.current
        expected = self.model.revert(token)
        self._expect(expected, lambda: self.c.revert(current, generation_id=g, lease=token))

    @rule(token=TOKENS, commit=st.booleans())
    def finish(self, token: LeaseToken | None, commit: bool) -> None:
        g = self.model.open.generation if self.model.open is not None else gen(self.counter)
        expected = self.model.finish(commit, token)
        if commit:
            self._expect(expected, lambda: self.c.commit_generation(g, lease=token))
        else:
            self._expect(expected, lambda: self.c.abort_generation(g, lease=token))

    @invariant()
    def same_state(self) -> None:
        model = self.model
        open_id = None if model.open is None else model.open.generation
        assert self.c.generation_state() == (model.current, open_id)
        pending = None if model.open is None else {**model.committed, **model.open.records}
        assert self._visible() == (model.committed, pending)


FencingMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck)
)
TestFencingModel = FencingMachine.TestCase


# --- examples -------------------------------------------------------------------------------------------


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def test_a_newer_owner_starting_the_same_id_drops_the_old_owners_records(
    open_store: StoreFactory, clock: ManualClock
) -> None:
    c = open_store(clock_ms=clock).create_collection("c", manual=True)
    old = c.acquire_lease("w", "A", 1_000).token
    c.start_generation(b"1", lease=old)
    c.put(b"a", b"A", generation_id=b"1", lease=old)
    clock.now_ms += 1_000
    new = c.acquire_lease("w", "B", 1_000).token
    c.start_generation(b"1", lease=new)  # no abortOutdated needed: the old owner's generation is dead
    assert c.generation_state() == (b"", b"1")
    assert c.get(b"a", generation_id=b"1") is None
    with pytest.raises(LeaseLost, match="version 1"):
        c.put(b"a", b"late", generation_id=b"1", lease=old)
    with pytest.raises(LeaseLost, match="started under lease 'w' version 2; this write carries none"):
        c.put(b"a", b"late", generation_id=b"1")
    c.put(b"b", b"B", generation_id=b"1", lease=new)
    c.start_generation(b"1", lease=new)  # idempotent for its own owner: nothing dropped
    c.commit_generation(b"1", lease=new)
    assert [(r.key, r.value) for r in c.query()] == [(b"b", b"B")]


def test_a_leased_generation_refuses_the_unleased_and_other_leases(open_store: StoreFactory) -> None:
    store = open_store()
    c = store.create_collection("c", manual=True)
    token = c.acquire_lease("w", "A", 60_000).token
    other = c.acquire_lease("x", "A", 60_000).token
    c.start_generation(gen(1), lease=token)
    c.put(b"k", b"v", generation_id=gen(1), lease=token)
    before = (c.generation_state(), list(c.query(gen(1))))
    for call in [
        lambda: c.start_generation(gen(2), abort_outdated=True),
        lambda: c.start_generation(gen(2), abort_outdated=True, lease=other),
        lambda: c.put(b"k", b"x", generation_id=gen(1)),
        lambda: c.put_many([(b"k", b"x")], generation_id=gen(1), lease=other),
        lambda: c.commit_generation(gen(1)),
        lambda: c.commit_generation(gen(1), lease=other),
        lambda: c.abort_generation(gen(1)),
        lambda: c.abort_generation(gen(1), lease=other),
    ]:
        with pytest.raises(LeaseLost):
            call()
        assert (c.generation_state(), list(c.query(gen(1)))) == before
    with pytest.raises(OutdatedGeneration):  # SPEC §1's rules still apply to the owner itself
        c.start_generation(gen(2), lease=token)
    with pytest.raises(GenerationMismatch):
        c.put(b"k", b"x", generation_id=gen(2), lease=token)
    c.abort_generation(gen(1), lease=token)
    assert c.generation_state() == (b"", None)


def test_a_lease_supersedes_an_unleased_generation_and_a_newer_owner_may_abort(
    open_store: StoreFactory, clock: ManualClock
) -> None:
    c = open_store(clock_ms=clock).create_collection("c", manual=True)
    c.start_generation(gen(1))
    c.put(b"k", b"unleased", generation_id=gen(1))
    with pytest.raises(LeaseLost, match="started under no lease"):
        c.put(b"k", b"x", generation_id=gen(1), lease=c.acquire_lease("w", "A", 1_000).token)
    c.start_generation(gen(1), lease=LeaseToken("w", 1))  # a writer without a lease is fenced out too
    assert c.get(b"k", generation_id=gen(1)) is None
    clock.now_ms += 1_000
    newer = c.acquire_lease("w", "B", 1_000).token
    c.abort_generation(gen(1), lease=newer)  # the successor cleans up its predecessor's generation
    assert c.generation_state() == (b"", None)


def test_a_generation_whose_lease_holds_no_more_may_be_dropped_by_anyone(
    open_store: StoreFactory, clock: ManualClock
) -> None:
    """A writer without a lease (a transform or an ingestor run without one, after HA ones) is not stuck
    behind a dead owner's generation: once that lease expired or was released, it may start over or abort;
    but never write into it or commit it."""
    c = open_store(clock_ms=clock).create_collection("c", manual=True)
    lease = c.acquire_lease("w", "A", 1_000)
    c.start_generation(gen(1), lease=lease.token)
    c.put(b"k", b"A", generation_id=gen(1), lease=lease.token)
    with pytest.raises(LeaseLost):
        c.start_generation(gen(2), abort_outdated=True)  # it still holds
    clock.now_ms += 1_000
    with pytest.raises(LeaseLost):
        c.put(b"k", b"x", generation_id=gen(1))
    with pytest.raises(LeaseLost):
        c.commit_generation(gen(1))
    c.start_generation(gen(1))  # expired: dropped and opened afresh, without a lease
    assert c.get(b"k", generation_id=gen(1)) is None
    c.put(b"k", b"mine", generation_id=gen(1))
    assert c.renew_lease("w", "A", 1).version == 1  # A comes back (nobody took the lease)...
    with pytest.raises(LeaseLost):  # ...but its generation is gone: its write is refused
        c.put(b"k", b"A", generation_id=gen(1), lease=lease.token)
    c.start_generation(gen(2), lease=lease.token)  # a lease supersedes a generation without one
    c.release_lease("w", "A", 1)
    c.abort_generation(gen(2))  # released: anyone may abort it
    assert c.generation_state() == (b"", None)


def test_writes_without_an_open_leased_generation(open_store: StoreFactory, clock: ManualClock) -> None:
    """A non-manual collection and phantoms have no open generation of an owner: a lease only fences."""
    store = open_store(clock_ms=clock)
    auto = store.create_collection("auto", manual=False)
    token = auto.acquire_lease("w", "A", 1_000).token
    auto.put(b"k", b"v", lease=token)
    auto.put(b"k", b"w")
    m = store.create_collection("m", manual=True)
    m_token = m.acquire_lease("w", "A", 1_000).token
    m.start_generation(gen(1), lease=m_token)
    phantom = m.start_phantom()
    m.put(b"p", b"v", generation_id=gen(1), phantom_id=phantom)  # private: the owner's lease not needed
    clock.now_ms += 1_000
    with pytest.raises(LeaseLost):
        auto.put(b"k", b"x", lease=token)
    with pytest.raises(LeaseLost):
        m.put(b"p", b"x", generation_id=gen(1), phantom_id=phantom, lease=m_token)
    assert auto.get(b"k", generation_id=auto.next_generation_id).value == b"w"  # type: ignore[union-attr]


def test_a_collection_row_written_before_fencing_covered_writes_still_opens(tmp_path: Path) -> None:
    """Rows of older versions have 11 fields (no ``next_lease``): read as an open generation without one."""
    path = tmp_path / "store"
    with Store.open(path, StoreConfig(background=False)) as store:
        c = store.create_collection("c", manual=True)
        c.start_generation(gen(1))
        c.put(b"k", b"v", generation_id=gen(1))
        with store.write() as scope:
            raw = scope.txn.get(b"c", db=store.tables.collections)
            fields = msgpack.unpackb(raw)
            assert len(fields) == 13 and fields[11] is None  # next_lease, then next_keys (a later field)
            scope.txn.put(b"c", msgpack.packb(fields[:11], use_bin_type=True), db=store.tables.collections)
    with Store.open(path, StoreConfig(background=False)) as store:
        c = store.collection("c")
        c.put(b"k2", b"v", generation_id=gen(1))
        c.commit_generation(gen(1))
        assert [r.key for r in c.query()] == [b"k", b"k2"]


# --- two processes on one directory -------------------------------------------------------------------


def test_a_fenced_out_process_changes_nothing_whatever_ids_it_uses(tmp_path: Path) -> None:
    """The issue's sequence: two processes, each with its own store on one directory (fails before the
    fix: B's start of the same id kept A's records and B's commit published them)."""
    path = tmp_path / "store"
    with Store.open(path, StoreConfig(background=False)) as store:
        store.create_collection("c", manual=True)
    with Actor(["--data", str(path)], "c") as a, Actor(["--data", str(path)], "c") as b:
        play_takeover(a, b)


def test_an_owner_paused_between_its_writes_changes_nothing_after_resuming(tmp_path: Path) -> None:
    """A real pause (SIGSTOP) of the owner process between its writes, B taking over meanwhile: resumed, A's
    pending write and every later one is ``leaseLost``; B's committed and open data are whole."""
    path = tmp_path / "store"
    with Store.open(path, StoreConfig(background=False)) as store:
        store.create_collection("c", manual=True)
    with Actor(["--data", str(path)], "c") as a, Actor(["--data", str(path)], "c") as b:
        play_paused_takeover(a, b)
