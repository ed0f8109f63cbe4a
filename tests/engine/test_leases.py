"""Leases in the engine: acquire/renew/release/expiry against a tiny reference model (hypothesis), fencing of
generation/start and /commit, CAS under racing processes on one directory, and deletion with the collection.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from diffstore import Store, StoreConfig
from diffstore.engine.types import Lease, LeaseToken
from diffstore.errors import InvalidRequest, LeaseLost, NoSuchCollection
from tests.engine.conftest import StoreFactory
from tests.helpers import ManualClock

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 120.0


def gen(n: int) -> bytes:
    return n.to_bytes(8, "big")


# --- the reference model ------------------------------------------------------------------------------


@dataclass
class Row:
    owner: str | None
    version: int
    expires_at_ms: int
    ttl_ms: int


class Model:
    """What the leases of one collection should do, written from the table in engine/leases.py."""

    def __init__(self) -> None:
        self.rows: dict[str, Row] = {}

    def held(self, row: Row, now: int) -> bool:
        return row.owner is not None and now < row.expires_at_ms

    def acquire(self, name: str, owner: str, ttl: int, now: int) -> Lease | None:
        row = self.rows.get(name)
        if row is not None and self.held(row, now) and row.owner != owner:
            return None
        version = 1 if row is None else row.version + 1
        self.rows[name] = Row(owner, version, now + ttl, ttl)
        return Lease(name, owner, version, now + ttl)

    def renew(self, name: str, owner: str, version: int, ttl: int | None, now: int) -> Lease | None:
        row = self.rows.get(name)
        if row is None or row.owner != owner or row.version != version:
            return None
        row.ttl_ms = row.ttl_ms if ttl is None else ttl
        row.expires_at_ms = now + row.ttl_ms
        return Lease(name, owner, version, row.expires_at_ms)

    def release(self, name: str, owner: str, version: int) -> bool:
        row = self.rows.get(name)
        if row is None or row.version != version:
            return False
        if row.owner is None:
            return True
        if row.owner != owner:
            return False
        row.owner, row.expires_at_ms = None, 0
        return True

    def fences(self, name: str, version: int, now: int) -> bool:
        row = self.rows.get(name)
        return row is not None and row.version == version and self.held(row, now)

    def listing(self) -> list[Lease]:
        return [Lease(n, r.owner, r.version, r.expires_at_ms) for n, r in sorted(self.rows.items())]


NAMES = st.sampled_from(["a", "b"])
OWNERS = st.sampled_from(["o1", "o2", "o3"])
VERSIONS = st.integers(1, 6)
TTLS = st.sampled_from([1, 5, 20])


class LeaseMachine(RuleBasedStateMachine):
    """Random acquire/renew/release/time steps and fenced start/commit vs the model."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="leases-")
        self.clock = ManualClock()
        self.store = Store.open(self.dir, StoreConfig(background=False, clock_ms=self.clock))
        self.c = self.store.create_collection("c", manual=True)
        self.model = Model()
        self.counter = 0

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(name=NAMES, owner=OWNERS, ttl=TTLS)
    def acquire(self, name: str, owner: str, ttl: int) -> None:
        expected = self.model.acquire(name, owner, ttl, self.clock.now_ms)
        try:
            got: Lease | None = self.c.acquire_lease(name, owner, ttl)
        except LeaseLost as exc:
            assert repr(self.model.rows[name].owner) in exc.reason  # names the current owner
            got = None
        assert got == expected

    @rule(name=NAMES, owner=OWNERS, version=VERSIONS, ttl=st.none() | TTLS)
    def renew(self, name: str, owner: str, version: int, ttl: int | None) -> None:
        expected = self.model.renew(name, owner, version, ttl, self.clock.now_ms)
        try:
            got: Lease | None = self.c.renew_lease(name, owner, version, ttl)
        except LeaseLost:
            got = None
        assert got == expected

    @rule(name=NAMES, owner=OWNERS, version=VERSIONS)
    def release(self, name: str, owner: str, version: int) -> None:
        expected = self.model.release(name, owner, version)
        try:
            self.c.release_lease(name, owner, version)
            got = True
        except LeaseLost:
            got = False
        assert got == expected

    @rule(ms=st.integers(0, 25))
    def time_passes(self, ms: int) -> None:
        self.clock.now_ms += ms

    @rule(name=NAMES, version=VERSIONS, commit=st.booleans())
    def fenced_round(self, name: str, version: int, commit: bool) -> None:
        """A fenced start, then a fenced commit or abort: done iff the model says it holds.

        (How the open generation's lease fences writes, commits and aborts: test_lease_fencing.py.)
        """
        holds = self.model.fences(name, version, self.clock.now_ms)
        before = self.c.generation_state()
        self.counter += 1
        g = gen(self.counter)
        token = LeaseToken(name, version)
        try:
            self.c.start_generation(g, lease=token)
            if commit:
                self.c.commit_generation(g, lease=token)
            else:
                self.c.abort_generation(g, lease=token)
            done = True
        except LeaseLost:
            done = False
            assert self.c.generation_state() == before
        assert done == holds
        if commit and done:
            assert self.c.generation_id == g

    @invariant()
    def same_listing(self) -> None:
        assert self.c.leases() == self.model.listing()


LeaseMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck)
)
TestLeaseModel = LeaseMachine.TestCase


# --- examples -------------------------------------------------------------------------------------------


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def test_acquire_renew_release_and_takeover_after_expiry(
    open_store: StoreFactory, clock: ManualClock
) -> None:
    store = open_store(clock_ms=clock)
    c = store.create_collection("c", manual=True)
    first = c.acquire_lease("ingest", "a", 1_000)
    assert first == Lease("ingest", "a", 1, clock.now_ms + 1_000)
    with pytest.raises(LeaseLost, match="'a'"):
        c.acquire_lease("ingest", "b", 1_000)
    clock.now_ms += 999
    with pytest.raises(LeaseLost):
        c.acquire_lease("ingest", "b", 1_000)
    assert c.renew_lease("ingest", "a", 1).expires_at_ms == clock.now_ms + 1_000
    clock.now_ms += 1_000  # expired: b takes over with a new version
    second = c.acquire_lease("ingest", "b", 500)
    assert second.version == 2
    with pytest.raises(LeaseLost):
        c.renew_lease("ingest", "a", 1)
    c.release_lease("ingest", "b", 2)
    c.release_lease("ingest", "b", 2)  # idempotent
    assert c.leases() == [Lease("ingest", None, 2, 0)]
    assert c.acquire_lease("ingest", "a", 10).version == 3  # versions are never reused


def test_an_expired_lease_nobody_took_may_be_renewed_but_does_not_fence(
    open_store: StoreFactory, clock: ManualClock
) -> None:
    store = open_store(clock_ms=clock)
    c = store.create_collection("c", manual=True)
    lease = c.acquire_lease("l", "a", 100)
    clock.now_ms += 100
    with pytest.raises(LeaseLost, match="expired"):
        c.start_generation(gen(1), lease=lease.token)
    assert c.generation_state() == (b"", None)
    assert c.renew_lease("l", "a", 1).expires_at_ms == clock.now_ms + 100
    c.start_generation(gen(1), lease=lease.token)
    assert c.next_generation_id == gen(1)


def test_an_old_owners_commit_is_refused_after_takeover_and_changes_nothing(
    open_store: StoreFactory, clock: ManualClock
) -> None:
    store = open_store(clock_ms=clock)
    c = store.create_collection("c", manual=True)
    c.create_reader("pos", "c")
    old = c.acquire_lease("l", "old", 1_000)
    c.start_generation(gen(1), lease=old.token)
    c.put_many([(b"k", b"old")], generation_id=gen(1), lease=old.token)
    c.commit_generation(gen(1), [("pos", gen(1))], lease=old.token)
    c.start_generation(gen(2), lease=old.token)
    c.put_many([(b"k", b"zombie")], generation_id=gen(2), lease=old.token)
    clock.now_ms += 1_000  # the old owner pauses past its expiry; a standby takes over
    new = c.acquire_lease("l", "new", 1_000)
    readers_before = c.readers()
    with pytest.raises(LeaseLost, match="version 2"):
        c.commit_generation(gen(2), [("pos", gen(2))], lease=old.token)
    assert c.generation_state() == (gen(1), gen(2))
    assert c.readers() == readers_before
    assert c.get(b"k") is not None and c.get(b"k").value == b"old"  # type: ignore[union-attr]
    with pytest.raises(LeaseLost):
        c.start_generation(gen(3), abort_outdated=True, lease=old.token)
    assert c.generation_state() == (gen(1), gen(2))
    c.start_generation(gen(3), abort_outdated=True, lease=new.token)  # drops the zombie's generation
    c.put_many([(b"k", b"new")], generation_id=gen(3), lease=new.token)
    c.commit_generation(gen(3), [("pos", gen(3))], lease=new.token)
    assert c.get(b"k").value == b"new"  # type: ignore[union-attr]
    assert [r.generation_id for r in c.readers()] == [gen(3)]


def test_a_fencing_token_of_another_lease_or_collection_does_not_hold(open_store: StoreFactory) -> None:
    store = open_store()
    a = store.create_collection("a", manual=True)
    b = store.create_collection("b", manual=True)
    lease = a.acquire_lease("l", "o", 60_000)
    with pytest.raises(LeaseLost):
        b.start_generation(gen(1), lease=lease.token)
    with pytest.raises(LeaseLost):
        a.start_generation(gen(1), lease=LeaseToken("other", 1))
    assert b.generation_state() == (b"", None) and a.generation_state() == (b"", None)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda c: c.acquire_lease("", "o", 10), "lease name"),
        (lambda c: c.acquire_lease("x" * 256, "o", 10), "lease name"),
        (lambda c: c.acquire_lease("a/b", "o", 10), "lease name"),
        (lambda c: c.acquire_lease("..", "o", 10), "lease name"),
        (lambda c: c.acquire_lease("a\x00", "o", 10), "lease name"),
        (lambda c: c.acquire_lease("l", "", 10), "owner"),
        (lambda c: c.acquire_lease("l", "o", 0), "ttlMs"),
        (lambda c: c.acquire_lease("l", "o", 86_400_001), "ttlMs"),
        (lambda c: c.acquire_lease("l", "o", True), "ttlMs"),
        (lambda c: c.renew_lease("l", "o", 0), "version"),
        (lambda c: c.renew_lease("l", "o", 1, 0), "ttlMs"),
        (lambda c: c.release_lease("l", "o", -1), "version"),
        (lambda c: c.start_generation(gen(1), lease=LeaseToken("l", 0)), "version"),
        (lambda c: c.commit_generation(gen(1), lease=("l", 1)), "LeaseToken"),
    ],
)
def test_bad_lease_arguments_are_refused_and_change_nothing(
    open_store: StoreFactory, call: object, match: str
) -> None:
    store = open_store()
    c = store.create_collection("c", manual=True)
    held = c.acquire_lease("l", "o", 60_000)
    before = (c.leases(), c.generation_state())
    with pytest.raises(InvalidRequest, match=match):
        call(c)  # type: ignore[operator]
    assert (c.leases(), c.generation_state()) == before
    assert c.leases() == [held]


def test_leases_go_with_their_collection(open_store: StoreFactory) -> None:
    store = open_store()
    c = store.create_collection("c", manual=True)
    c.acquire_lease("l", "o", 60_000)
    store.delete_collection("c")
    with pytest.raises(NoSuchCollection):
        c.leases()
    again = store.create_collection("c", manual=True)
    assert again.leases() == []
    assert again.acquire_lease("l", "p", 60_000).version == 1
    while store.run_background_once():  # the purge of the dropped cid removes the old rows
        pass
    with store.read() as txn:
        assert [key for key, _ in txn.cursor(db=store.tables.leases)] == [
            key for key, _ in txn.cursor(db=store.tables.leases) if key[:4] == again._meta().cid_prefix
        ]


# --- racing processes -------------------------------------------------------------------------------------

RACER = """
import json, sys, time
from diffstore import Store, StoreConfig
from diffstore.errors import LeaseLost
path, me, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
won = []
with Store.open(path, StoreConfig(background=False)) as store:
    c = store.collection("c")
    print("ready", flush=True)
    sys.stdin.readline()
    for _ in range(rounds):
        try:
            lease = c.acquire_lease("l", me, 60_000)
        except LeaseLost:
            continue
        won.append(lease.version)
        c.release_lease("l", me, lease.version)
print(json.dumps(won), flush=True)
"""


def test_acquire_is_a_compare_and_set_across_racing_processes(tmp_path: Path) -> None:
    """Four processes acquire and release one lease in a loop: every version is handed out exactly once,
    to one process, and the last version counts every acquire."""
    path = tmp_path / "store"
    with Store.open(path, StoreConfig(background=False)) as store:
        store.create_collection("c", manual=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(path), f"p{i}", "60"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(4)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        won: list[int] = []
        for proc in procs:
            out, err = proc.communicate(timeout=DEADLINE_S)
            assert proc.returncode == 0, err
            won += json.loads(out.strip().splitlines()[-1])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert sorted(won) == list(range(1, len(won) + 1))
    assert won  # somebody won
    with Store.open(path, StoreConfig(background=False)) as store:
        assert store.collection("c").leases() == [Lease("l", None, len(won), 0)]
