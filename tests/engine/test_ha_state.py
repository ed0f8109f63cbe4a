"""A fail-over member's role in the store: the write deadline every user write checks in its own
transaction, and leading / following / stepping back as one transaction each (``engine/ha_state.py``)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from diffstore import Store
from diffstore.engine.ha_state import HaRecord
from diffstore.errors import ReadOnlyReplica


def leader(until_ns: int, term: int = 3) -> HaRecord:
    return HaRecord("c1", "m1", "leader", "m1", "http://m1", term, until_ns)


def test_a_leader_accepts_writes_only_before_its_deadline(store: Store) -> None:
    c = store.create_collection("c", manual=True)
    store.ha_publish(leader(time.monotonic_ns() + 60 * 10**9))
    c.write_generation(b"0001", [(b"k", b"v")])
    store.ha_publish(leader(time.monotonic_ns() - 1))  # the lease was not renewed in time
    with pytest.raises(ReadOnlyReplica) as refused:
        c.write_generation(b"0002", [(b"k", b"w")])
    assert refused.value.leader is None
    with pytest.raises(ReadOnlyReplica):
        store.check_writable()
    with pytest.raises(ReadOnlyReplica):
        store.delete_collection("c")
    assert c.generation_id == b"0001" and c.get(b"k").value == b"v"  # type: ignore[union-attr]


@pytest.mark.parametrize("role", ["replica", "candidate", "fenced"])
def test_a_member_that_does_not_lead_refuses_writes_naming_the_leader(store: Store, role: str) -> None:
    c = store.create_collection("c", manual=True)
    store.ha_publish(HaRecord("c1", "m1", role, "m2", "http://m2", 4, time.monotonic_ns() + 60 * 10**9))
    with pytest.raises(ReadOnlyReplica) as refused:
        c.start_generation(b"0001")
    assert refused.value.leader == "http://m2"
    assert refused.value.details() == {"leader": "http://m2"}
    assert c.next_generation_id is None


def test_serving_without_fail_over_forgets_the_role(store: Store) -> None:
    c = store.create_collection("c", manual=True)
    store.ha_publish(leader(0))
    assert store.ha_clear()
    assert store.ha_record() is None
    c.write_generation(b"0001", [(b"k", b"v")])


def test_a_primary_with_data_follows_a_new_leader_and_leads_again_at_a_higher_term(store: Store) -> None:
    c = store.create_collection("c", manual=True)
    c.write_generation(b"0001", [(b"k", b"v")])
    follower = HaRecord("c1", "m1", "replica", "m2", "http://m2", 5)
    store.ha_follow(follower, "ha-m1")
    state = store.replica_state()
    assert state.following and state.primary == "http://m2" and state.replica_id == "ha-m1"
    assert state.term == 5 and c.get(b"k").value == b"v"  # type: ignore[union-attr]
    store.ha_lead(leader(time.monotonic_ns() + 60 * 10**9, term=6))
    state = store.replica_state()
    assert not state.following and state.term == 6 and state.fenced is None
    c.write_generation(b"0002", [(b"k", b"w")])


def test_check_knows_a_members_role_row(tmp_path: Path) -> None:
    """A leading member is a primary with a role row of its own: check finds nothing wrong with it."""
    from diffstore import StoreConfig
    from diffstore.engine.check import check_directory

    with Store.open(tmp_path / "db", StoreConfig(background=False)) as member:
        member.create_collection("c", manual=True).write_generation(b"0001", [(b"k", b"v")])
        member.ha_publish(leader(time.monotonic_ns() + 60 * 10**9))
    report = check_directory(tmp_path / "db")
    assert report.ok, report.problems
