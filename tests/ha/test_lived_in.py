"""Fail-over of a store with a life behind it (``tests/lived_in.py``: collected history, readers moved in
and outside commits, leases, a deleted and re-created collection, an open generation, 64 KiB keys): every
member converges on the leader, the pipeline carries on on the new leader after a kill -9, and the old
leader rejoins: every member holds the new leader's generations, readers, leases and digests."""

from __future__ import annotations

from diffstore.client import Client
from tests.faults import kill9
from tests.ha.conftest import WAIT_S, Member, wait_follows, wait_leader
from tests.helpers import wait_until
from tests.lived_in import live
from tests.replica.compare import converged, copied


def same_digests(leader: Client, member: Client) -> None:
    """The member holds the leader's generations, readers and leases, and the same digest at each."""
    held = wait_until(lambda: copied(leader, member), WAIT_S, 0.1, "the member to converge on the leader")
    for name, generations in held.items():
        mine, theirs = member.collection(name), leader.collection(name)
        for generation in generations:
            assert mine.digest(generation) == theirs.digest(generation), (name, generation)


def test_a_lived_in_cluster_fails_over_and_every_member_converges(members: list[Member]) -> None:
    for member in members:
        member.start()
    old = wait_leader(members)
    with Client(old.url, timeout_s=60) as client:
        life = live(client, key_bytes=64 * 1024)
        for member in members:
            if member is not old:
                with member.client() as replica:
                    converged(client, replica, WAIT_S)
    kill9(old.process)  # type: ignore[arg-type]
    new = wait_leader(members)
    assert new is not old
    with Client(new.url, timeout_s=60) as client:
        life.more(client, rounds=1)  # readers, leases and generations carried over: the pipeline goes on
        old.start()
        wait_follows(old, new)
        # after the fail-over: the same generations, readers, leases and digests (not every read: the
        # lineage of the first generation a rejoining member copies again may lack its readers' origins)
        for member in members:
            if member is not new:
                with member.client() as replica:
                    same_digests(client, replica)
