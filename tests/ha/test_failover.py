"""Fail-over under faults (issue 50 items 2, 3, 6): three real members on a real etcd, a writer that sends
every write to every member throughout, and one fault after another on the leader: kill -9, SIGSTOP, and
its link to etcd cut. After each: another member leads and accepts writes, the old one rejoins as a
replica. At the end: no write was ever accepted by two members, each leader's acknowledged writes survive
as a prefix (what the design guarantees without ``--synchronous``: the lost ones, counted, are the last of
a term), the final leader's own are all there, and the members' digests agree on every generation they
share."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable

import httpx

from diffstore.client import Client, Collection
from tests.faults import kill9
from tests.ha.conftest import WAIT_S, Member, wait_follows, wait_leader
from tests.ha.writer import COLLECTION, Writer, key
from tests.helpers import wait_until

LEADS = re.compile(r"ha: (\S+) leads cluster c1 at term (\d+)")


def wait_ack_by_other(writer: Writer, old: Member, since: float) -> None:
    wait_until(
        lambda: writer.acks.first_ack_by_other_than(old.name, since) is not None,
        WAIT_S,
        0.1,
        f"a write acknowledged by a member other than {old.name}",
    )


def signal_member(member: Member, signum: int) -> None:
    assert member.process is not None
    os.kill(member.process.pid, signum)


def test_failover_after_kill9_sigstop_and_an_etcd_cut_with_a_writer_throughout(members: list[Member]) -> None:
    for member in members:
        member.start()
    leader = wait_leader(members)
    with Client(leader.url, timeout_s=30) as client:
        client.create_collection(COLLECTION)
    writer = Writer(members).start()
    wait_until(lambda: writer.acks.acked(), WAIT_S, 0.1, "a first acknowledged write")

    def kill(member: Member) -> Callable[[], None]:
        kill9(member.process)  # type: ignore[arg-type]
        return member.start

    def stop(member: Member) -> Callable[[], None]:
        signal_member(member, signal.SIGSTOP)
        return lambda: signal_member(member, signal.SIGCONT)

    def cut(member: Member) -> Callable[[], None]:
        member.proxy.cut()
        return member.proxy.accept

    def stall(member: Member) -> Callable[[], None]:
        member.proxy.stall()
        return member.proxy.passing

    try:
        for fault in (kill, stop, cut, stall):
            old = leader
            since = time.monotonic()
            heal = fault(old)
            wait_ack_by_other(writer, old, since)
            if fault in (cut, stall):  # cut off etcd but alive: it stepped back on its own
                ha = old.ha()
                assert ha is not None and ha["role"] != "leader"
                refused = httpx.post(
                    f"{old.url}/collections/{COLLECTION}/generation/start",
                    json={"generationId": "99999999"},
                    timeout=30,
                )
                assert refused.status_code == 409 and refused.json()["error"] == "readOnlyReplica"
                assert refused.json().get("leader") != old.url  # never itself
            heal()
            leader = wait_leader(members)
            assert leader is not old
            wait_follows(old, leader)
    finally:
        acks = writer.stop()

    # never two members accepting one write, and the accepting member changed only at the faults
    assert all(len(names) <= 1 for names in acks.by_write.values())
    acked = acks.acked()
    terms: list[list[int]] = []
    previous = None
    for n, name in acked:
        if name != previous:
            terms.append([])
            previous = name
        terms[-1].append(n)
    assert len(terms) <= 5, [(t[0], t[-1]) for t in terms]

    for member in members:
        if member is not leader:
            wait_follows(member, leader)
    with Client(leader.url, timeout_s=30) as client:
        final = Collection(client, COLLECTION, True)
        current = final.generation_id
        present = {n for n, _ in acked if final.get(key(n)) is not None}
        theirs, _ = final.digests(limit=10_000)
    lost = [n for n, _ in acked if n not in present]
    print(f"acknowledged writes: {len(acked)}; lost in {len(terms) - 1} fail-overs: {len(lost)}")
    for run in terms:  # each term's survivors are a prefix of its acknowledged writes
        kept = [n in present for n in run]
        assert kept == sorted(kept, reverse=True), (run[0], run[-1], lost)
    assert all(kept for kept in (n in present for n in terms[-1]))  # the final leader's own: all kept

    # the members' logs: each term was led by one member, and terms only grew (each fault raised it)
    led: dict[int, set[str]] = {}
    for member in members:
        for found in LEADS.finditer(member.log.read_text(errors="replace")):
            led.setdefault(int(found.group(2)), set()).add(found.group(1))
    assert all(len(names) == 1 for names in led.values()), led
    assert leader.name in led[max(led)] and max(led) >= 5, led

    leader_digests = {d.generation_id: d.digest for d in theirs}
    for member in members:
        if member is leader:
            continue

        def caught_up(member: Member = member) -> bool:
            with Client(member.url, timeout_s=30) as client:
                return Collection(client, COLLECTION, True).generation_id == current

        wait_until(caught_up, WAIT_S, 0.1, f"{member.name} to catch up")
        with Client(member.url, timeout_s=30) as client:
            mine, _ = Collection(client, COLLECTION, True).digests(limit=10_000)
        shared = [d for d in mine if d.generation_id in leader_digests]
        assert shared
        assert all(leader_digests[d.generation_id] == d.digest for d in shared)
