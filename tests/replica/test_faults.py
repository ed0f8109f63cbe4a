"""The replica under the nemesis's other faults (kill -9 is test_crash's): its link to the primary delayed,
stalled and cut by a TCP proxy, and the primary and the replica paused (SIGSTOP/SIGCONT) while generations
flow. Each time it converges to exactly the primary's state: every generation once, same reads."""

from __future__ import annotations

from pathlib import Path

from tests.faults import TcpProxy, paused
from tests.helpers import wait_until

from .compare import caught_up, every_read, generations
from .conftest import Server
from .test_crash import Writer, _applied

FOLLOW_S = 180.0


def _converged(primary: Server, replica: Server, writer: Writer) -> None:
    with primary.client() as p, replica.client() as r:
        wait_until(lambda: caught_up(p, r), FOLLOW_S, what="the replica to converge")
        held = generations(p)
        assert generations(r) == held
        assert held["A"][-1] == b"%06d" % writer.n
        chosen = {"A": held["A"][-3:], "C": held["C"]}
        assert every_read(r, chosen) == every_read(p, chosen)


def test_a_delayed_stalled_and_cut_link_to_the_primary_converges(
    tmp_path: Path, primary: Server, servers: list[Server]
) -> None:
    writer = Writer()
    with TcpProxy(primary.url.removeprefix("http://")) as proxy:
        replica = Server(tmp_path / "replica", "--replica-of", f"http://{proxy.address}")
        servers.append(replica)
        replica.start()
        with primary.client() as p:
            writer.setup(p)
            writer.commit(p, 2)
            wait_until(lambda: _applied(replica) >= 2, FOLLOW_S, what="2 generations applied")

            proxy.delay(30)  # every chunk of every long poll and page waits
            writer.commit(p, 2)
            wait_until(lambda: _applied(replica) >= 4, FOLLOW_S, what="4 generations over a slow link")

            proxy.stall()  # the replica's requests hang mid-answer while the primary goes on
            writer.commit(p, 2)
            proxy.passing()
            wait_until(lambda: _applied(replica) >= 6, FOLLOW_S, what="6 generations after a stall")

            proxy.cut(refuse=True)  # every connection reset, and new ones refused for a while
            writer.commit(p, 2)
            assert _applied(replica) <= 6  # nothing can reach it while the link is down
            proxy.accept()
            writer.commit(p, 1)
        _converged(primary, replica, writer)


def test_paused_primary_and_paused_replica_converge(primary: Server, replica: Server) -> None:
    writer = Writer()
    with primary.client() as p:
        writer.setup(p)
        writer.commit(p, 2)
        wait_until(lambda: _applied(replica) >= 2, FOLLOW_S, what="2 generations applied")
    assert replica.process is not None and primary.process is not None

    # the replica stopped mid-follow: the primary keeps committing without it
    with paused(replica.process), primary.client() as p:
        writer.commit(p, 3)
    wait_until(lambda: _applied(replica) >= 5, FOLLOW_S, what="the resumed replica to catch up")

    # the primary stopped while the replica's long polls and pages are in flight
    with primary.client() as p:
        writer.commit(p, 1)
    with paused(primary.process):
        applied = _applied(replica)  # the replica still answers reads while its primary is frozen
        assert applied >= 5
    with primary.client() as p:
        writer.commit(p, 2)
    _converged(primary, replica, writer)
