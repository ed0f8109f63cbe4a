"""A client given several servers, against real ones: it keeps writing exactly-once rounds across a
promotion that steps the old primary down; a commit whose answer a cut link lost is sent again and found
applied, never applied twice; the command line takes ``--url a,b`` and ``DIFFSTORE_URL=a,b``."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from diffstore.client import AsyncClient, Client
from diffstore.client import _calls as calls
from diffstore.client._calls import generation_committed
from diffstore.engine.types import ReaderUpdate
from diffstore.errors import BadVersion, DiffstoreError, LeaderChanged, NoLeader
from diffstore.outage import is_outage
from diffstore.rounds import Round
from tests.faults import TcpProxy
from tests.helpers import wait_until

from .compare import caught_up
from .conftest import Server

FOLLOW_S = 180.0
ROUNDS_BEFORE, ROUNDS_AFTER = 10, 10


class RoundWriter(threading.Thread):
    """Writes rounds of one key each into manual collection ``M``, moving reader ``w`` with a CAS, as a
    pipeline does; a round cut short by the fail-over is redone from what the leader holds."""

    def __init__(self, client: Client) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.acked: list[int] = []
        self.redone = 0
        self.stop = threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            collection = self.client.collection("M")
            i = 0
            while not self.stop.is_set():
                try:
                    stored = {r.name: r.generation_id for r in collection.readers()}
                    if stored["w"] is not None and int(stored["w"]) >= i:
                        i = int(stored["w"]) + 1  # a round whose answer was lost made it
                        continue
                    round_ = Round.next(collection)
                    update = ReaderUpdate("w", str(i).encode(), expected=stored["w"])
                    round_.write([(f"k{i:04}".encode(), str(i).encode())], [update])
                except (LeaderChanged, NoLeader) as exc:
                    self.redone += 1
                    assert is_outage(exc)
                    continue
                except BadVersion:  # read while no member led (a replica's reader, behind): read again
                    self.redone += 1
                    continue
                except DiffstoreError as exc:
                    if not is_outage(exc):
                        raise
                    self.redone += 1
                    continue
                self.acked.append(i)
                i += 1
        except BaseException as exc:
            self.failure = exc


def _promote(tmp_path: Path, url: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "diffstore.cli", "promote", "--url", url, "--wait", "120"]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)


def test_a_client_of_both_keeps_writing_rounds_exactly_once_across_a_promotion(
    tmp_path: Path, primary: Server, replica: Server
) -> None:
    with primary.client() as p, replica.client() as r:
        p.create_collection("M", manual=True).create_reader("w")
        wait_until(lambda: caught_up(p, r), FOLLOW_S, what="the replica to copy M")
    with Client([primary.url, replica.url], timeout_s=60, failover_wait_s=120) as both:
        writer = RoundWriter(both)
        writer.start()
        try:
            wait_until(lambda: len(writer.acked) >= ROUNDS_BEFORE or not writer.is_alive(), FOLLOW_S)
            promoted = _promote(tmp_path, replica.url)
            assert promoted.returncode == 0, promoted.stderr
            after = len(writer.acked)
            wait_until(
                lambda: len(writer.acked) >= after + ROUNDS_AFTER or not writer.is_alive(),
                FOLLOW_S,
                what="writes on the promoted replica",
            )
        finally:
            writer.stop.set()
            writer.join(120)
        assert writer.failure is None, writer.failure
        assert both._transport.finder is not None and both._transport.finder.leader == replica.url
    with primary.client() as p, replica.client() as r:
        assert p.execute(calls.replication())["role"] == "fenced"
        m = r.collection("M")
        last = writer.acked[-1]
        assert writer.acked == list(range(last + 1))
        assert {x.name: x.generation_id for x in m.readers()}["w"] == str(last).encode()
        records = {x.key: x.value for x in m.query()}
        assert records == {f"k{i:04}".encode(): str(i).encode() for i in range(last + 1)}
        # each round's key was written by exactly one committed generation: none applied twice
        history, more = m.history(limit=1000)
        assert not more
        assert sum(info.changed_keys or 0 for info in history) == last + 1


def test_a_commit_whose_answer_a_cut_link_lost_is_found_applied_not_applied_twice(primary: Server) -> None:
    with primary.client() as p:
        p.create_collection("M", manual=True).create_reader("w")
    with TcpProxy(primary.url.removeprefix("http://")) as proxy:
        via = f"http://{proxy.address}"
        with Client([via, primary.url], timeout_s=300) as both:
            m = both.collection("M")  # finds the leader: the first URL, through the proxy
            assert both._transport.finder is not None and both._transport.finder.leader == via
            m.start_generation(b"g1")
            m.put_many([(b"k", b"v")], generation_id=b"g1")
            outcome: list[object] = []

            def commit() -> None:
                try:
                    m.commit_generation(b"g1", [ReaderUpdate("w", b"g1", expected=None)])
                    outcome.append("ok")
                except BaseException as exc:
                    outcome.append(exc)

            # every chunk waits long enough that the answer is still held when the store shows the commit
            proxy.delay(15_000)
            thread = threading.Thread(target=commit, daemon=True)
            thread.start()
            with primary.client() as direct:
                wait_until(
                    lambda: direct.execute(generation_committed("M", b"g1")), FOLLOW_S, what="the commit"
                )
                proxy.cut(refuse=True)  # its answer is lost with the link
                thread.join(FOLLOW_S)
                assert outcome == ["ok"]
                assert both._transport.finder.leader == primary.url  # it went around the cut link
                state = direct.collection("M")
                assert state.generation_id == b"g1" and state.next_generation_id is None
                assert {x.name: x.generation_id for x in state.readers()}["w"] == b"g1"
                history, _ = state.history(limit=10)
                assert [(h.generation_id, h.changed_keys) for h in history[:1]] == [(b"g1", 1)]


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "diffstore.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)


def test_the_command_line_writes_to_the_leader_of_url_lists(primary: Server, replica: Server) -> None:
    with primary.client() as p, replica.client() as r:
        p.create_collection("A", manual=False)
        wait_until(lambda: caught_up(p, r), FOLLOW_S, what="the replica to copy A")
    listed = _cli("put", "A", "k", "v", "--url", f"{replica.url},{primary.url}")
    assert listed.returncode == 0, listed.stderr
    env = {**os.environ, "DIFFSTORE_URL": f"{replica.url}, {primary.url}"}
    from_env = _cli("put", "A", "k2", "v2", env=env)
    assert from_env.returncode == 0, from_env.stderr
    with primary.client() as p:
        assert {x.key: x.value for x in p.collection("A").query()} == {b"k": b"v", b"k2": b"v2"}
    # a single URL keeps its meaning: a replica refuses, nothing written
    alone = _cli("put", "A", "k3", "v3", "--url", replica.url)
    assert alone.returncode != 0 and "readOnlyReplica" in alone.stderr + alone.stdout
    bad = _cli("put", "A", "k3", "v3", "--url", f"{primary.url},nowhere")
    assert bad.returncode == 2 and "'nowhere' is not an http:// or https:// URL" in bad.stderr
    with primary.client() as p:
        assert p.collection("A").get(b"k3") is None
    promote = _cli("promote", "--url", f"{replica.url},{primary.url}")
    assert promote.returncode == 1 and "names several" in promote.stderr
    with replica.client() as r:
        assert r.execute(calls.replication())["role"] == "replica"


@pytest.mark.parametrize("urls", [" , ", ""])
def test_a_client_needs_a_url(urls: str) -> None:
    with pytest.raises(ValueError):
        Client(urls)


def test_an_async_client_of_both_writes_to_the_primary_and_follows_the_promotion(
    tmp_path: Path, primary: Server, replica: Server
) -> None:
    async def write(client: AsyncClient, key: bytes) -> None:
        collection = await client.collection("A")
        await collection.put(key, b"v", producer_id="p", seq_no=int(key[1:]))

    with primary.client() as p, replica.client() as r:
        p.create_collection("A", manual=False)
        wait_until(lambda: caught_up(p, r), FOLLOW_S, what="the replica to copy A")

    async def scenario() -> None:
        async with AsyncClient(f"{replica.url},{primary.url}", timeout_s=60) as both:
            await write(both, b"k1")
            assert both._transport.finder is not None and both._transport.finder.leader == primary.url
            promoted = await asyncio.to_thread(_promote, tmp_path, replica.url)
            assert promoted.returncode == 0, promoted.stderr
            await write(both, b"k2")  # the old primary answers fenced, naming the new one
            assert both._transport.finder.leader == replica.url

    asyncio.run(scenario())
    with replica.client() as r:
        assert {x.key for x in r.collection("A").query()} == {b"k1", b"k2"}
        assert r.collection("A").producer_last_seq_no("p") == 2
