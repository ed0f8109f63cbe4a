"""The lease keeper (pure, fed times) and its driver :class:`LeaseGuard` over real collections, and fenced
rounds (:class:`diffstore.rounds.Round` with a lease)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from diffstore import Store, StoreConfig
from diffstore.engine.types import Lease, LeaseToken
from diffstore.errors import GenerationMismatch, LeaseLost
from diffstore.lease_keeper import Action, LeaseConfig, LeaseGuard, LeaseKeeper, default_owner
from diffstore.rounds import Round

DEADLINE_S = 30.0


def lease(version: int = 1, owner: str = "me") -> Lease:
    return Lease("l", owner, version, 0)


# --- the pure keeper --------------------------------------------------------------------------------------


def test_defaults_follow_the_ttl() -> None:
    config = LeaseConfig("l", "me", ttl_ms=10_000)
    assert config.renew_every_s == pytest.approx(10 / 3)
    assert config.margin_s == pytest.approx(2.0)
    assert config.standby_poll_s == pytest.approx(0.25)
    assert LeaseConfig("l", "me", ttl_ms=1_000).standby_poll_s == pytest.approx(0.25)
    assert LeaseConfig("l", "me", ttl_ms=200).standby_poll_s == pytest.approx(0.05)
    assert LeaseConfig("l").owner != LeaseConfig("l").owner  # unique per guard by default
    assert default_owner().count(":") == 2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"name": ""},
        {"ttl_ms": 0},
        {"ttl_ms": 86_400_001},
        {"renew_every_ms": 10_000},
        {"margin_ms": 7_000},
        {"standby_poll_ms": 0},
    ],
)
def test_bad_configs_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        LeaseConfig(**{"name": "l", "owner": "me", "ttl_ms": 10_000, **kwargs})  # type: ignore[arg-type]


def test_standby_acquires_then_renews_every_third_of_the_ttl() -> None:
    k = LeaseKeeper(LeaseConfig("l", "me", ttl_ms=3_000, margin_ms=600))
    assert k.due(0.0) is Action.ACQUIRE and not k.active
    k.granted(lease(), sent_at=0.0)
    assert k.holds(0.1) and k.token == LeaseToken("l", 1)
    assert k.due(0.5) is Action.WAIT and k.wait_s(0.5) == pytest.approx(0.5)
    assert k.due(1.0) is Action.RENEW
    k.granted(lease(), sent_at=1.0)
    assert k.valid_until == pytest.approx(1.0 + 3.0 - 0.6)


def test_a_refused_standby_polls_cheaply() -> None:
    k = LeaseKeeper(LeaseConfig("l", "me", ttl_ms=10_000))
    k.refused(0.0)
    assert k.due(0.1) is Action.WAIT
    assert k.wait_s(0.1) == pytest.approx(0.15)
    assert k.due(0.25) is Action.ACQUIRE


def test_renewals_that_keep_failing_lose_the_lease_before_it_can_expire() -> None:
    k = LeaseKeeper(LeaseConfig("l", "me", ttl_ms=3_000, margin_ms=600, retry_ms=100))
    k.granted(lease(), sent_at=0.0)
    now = 1.0
    while k.due(now) is not Action.ACQUIRE:
        if k.due(now) is Action.RENEW:
            k.failed(now)
        assert k.holds(now) == (now < 2.4)
        now = round(now + 0.1, 3)
    assert not k.active and now >= 2.4  # dropped at ttl - margin after the last grant's send time


def test_a_refused_renewal_is_a_loss() -> None:
    k = LeaseKeeper(LeaseConfig("l", "me", ttl_ms=3_000))
    k.granted(lease(), sent_at=0.0)
    k.refused(1.0)
    assert not k.holds(1.0) and k.token is None and k.due(1.0) is Action.WAIT


def test_a_renewal_cannot_change_the_version() -> None:
    k = LeaseKeeper(LeaseConfig("l", "me", ttl_ms=3_000))
    k.granted(lease(1), 0.0)
    with pytest.raises(ValueError):
        k.granted(lease(2), 1.0)


# --- the guard over a real store ---------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "store", StoreConfig(background=False)) as opened:
        opened.create_collection("c", manual=True)
        yield opened


def test_one_guard_is_active_the_other_stands_by_and_takes_over_on_release(store: Store) -> None:
    c = store.collection("c")
    first = LeaseGuard(c, LeaseConfig("l", "first", ttl_ms=60_000))
    try:
        token = first.wait_active(timeout_s=DEADLINE_S)
        assert token == LeaseToken("l", 1) and first.holds(token)
        with LeaseGuard(c, LeaseConfig("l", "second", ttl_ms=60_000, standby_poll_ms=5)) as second:
            assert second.wait_active(timeout_s=0.05) is None  # a bound on the wait, not a timing check
            assert not second.holds()
            first.close()  # releases: no waiting for the expiry
            taken = second.wait_active(timeout_s=DEADLINE_S)
            assert taken == LeaseToken("l", 2)
            assert c.leases() == [Lease("l", "second", 2, c.leases()[0].expires_at_ms)]
        assert c.leases()[0].owner is None  # closing released it
    finally:
        first.close()


def test_a_dead_holders_lease_is_taken_after_its_expiry_and_its_rounds_are_fenced(store: Store) -> None:
    c = store.collection("c")
    c.create_reader("pos", "c")
    dead = LeaseGuard(c, LeaseConfig("l", "dead", ttl_ms=300, standby_poll_ms=5))
    old = dead.wait_active(timeout_s=DEADLINE_S)
    assert old is not None
    stale = Round.next(c, lease=old)
    stale.start()
    c.put_many([(b"k", b"stale")], generation_id=stale.generation_id, lease=old)
    dead.close(release=False)  # as if killed: nothing renews, nothing releases
    with LeaseGuard(c, LeaseConfig("l", "alive", ttl_ms=60_000, standby_poll_ms=5)) as alive:
        new = alive.wait_active(timeout_s=DEADLINE_S)
        assert new is not None and new.version == old.version + 1
        with pytest.raises(LeaseLost):
            stale.commit([("pos", b"x")])
        fresh = Round.next(c, lease=new)
        assert fresh.generation_id[8:16] == new.version.to_bytes(8, "big")
        assert fresh.generation_id != stale.generation_id
        fresh.start()  # discards the dead holder's generation
        with pytest.raises(GenerationMismatch):  # a zombie's late write cannot land in the new generation
            c.put_many([(b"k", b"zombie")], generation_id=stale.generation_id)
        with pytest.raises(LeaseLost):  # nor under the new generation's id, with its old token or none
            c.put_many([(b"k", b"zombie")], generation_id=fresh.generation_id, lease=old)
        with pytest.raises(LeaseLost):
            c.put_many([(b"k", b"zombie")], generation_id=fresh.generation_id)
        assert not stale.abort()  # not its generation any more: left alone
        c.put_many([(b"k", b"fresh")], generation_id=fresh.generation_id, lease=new)
        fresh.commit([("pos", fresh.generation_id)])
    assert c.get(b"k").value == b"fresh"  # type: ignore[union-attr]
    assert [r.generation_id for r in c.readers()] == [fresh.generation_id]


def test_wait_active_ends_when_asked_to_stop(store: Store) -> None:
    c = store.collection("c")
    with LeaseGuard(c, LeaseConfig("l", "a", ttl_ms=60_000)) as holder:
        assert holder.wait_active(timeout_s=DEADLINE_S) is not None
        with LeaseGuard(c, LeaseConfig("l", "b", ttl_ms=60_000, standby_poll_ms=5)) as standby:
            stop = threading.Event()
            result: list[object] = []
            waiter = threading.Thread(target=lambda: result.append(standby.wait_active(stop)))
            waiter.start()
            stop.set()
            waiter.join(DEADLINE_S)
            assert not waiter.is_alive() and result == [None]


def test_a_guard_notices_that_its_lease_was_taken(store: Store) -> None:
    """Another owner takes the lease behind the guard's back (e.g. after a long pause): the next renewal is
    refused and the guard stands by."""
    c = store.collection("c")
    with LeaseGuard(c, LeaseConfig("l", "a", ttl_ms=600, standby_poll_ms=5)) as guard:
        token = guard.wait_active(timeout_s=DEADLINE_S)
        assert token is not None
        c.release_lease("l", "a", token.version)
        taken = c.acquire_lease("l", "thief", 60_000)
        end = time.monotonic() + DEADLINE_S
        while guard.holds(token):
            assert time.monotonic() < end, "the guard still believes it holds a taken lease"
            time.sleep(0.005)
        assert guard.token is None
        assert c.leases()[0].version == taken.version
