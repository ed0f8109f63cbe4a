"""``diffstore ingest`` rides out a blip of its servers (issue 54, item 1).

Before the fix a 3 s restart of ``diffstore serve`` made the active ingestor exit 1 (``GET …: ConnectError``)
and its standby died the same way at the next blip. Here two ``diffstore ingest --url`` processes (one active,
one standby) run while records flow, and

- the diffstore server is SIGKILLed and started again on the same port and data directory ~3 s later;
- the streams server (``diffstore streams serve``) is SIGKILLed while it delivers a backlog and started again;
- the link to the diffstore server is cut (connections reset, new ones refused), then stalled.

Both ingestors must still be running afterwards, the active one must have said once that it waits and once
that the server is back, and C must hold every record exactly once (``check_exactly_once``: the mapper writes
``rec/<seq>`` with a value unique to each application, so a record applied twice shows in two generations).
"""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_ingest_ha import WAIT_S, Ingestors, check_exactly_once, holder_pid, reached, stored_positions

from diffstore.client import Client
from diffstore.errors import NoSuchCollection
from diffstore.streams.client import StreamClient, StreamError
from diffstore.streams.producer import BufferedProducer, ProducerConfig
from diffstore.streams.records import RecordId
from tests.faults import TcpProxy, kill9
from tests.helpers import close_pipes, free_port, wait_until
from tests.replica.conftest import Server

OUTAGE_S = 3.0  # how long a server stays down: the length of the fault, not a wait for a condition
KEYS = 40


class StreamsServer:
    """A ``diffstore streams serve`` process with test intervals; ``start`` again after ``kill9``."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.port = free_port()
        self.url = f"hstream://127.0.0.1:{self.port}"
        self.log = data.parent / "streams.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> StreamsServer:
        command = [
            sys.executable, "-m", "diffstore.streams.cli", "streams", "serve", "--data", str(self.data),
            "--port", str(self.port), "--resend-tick", "0.005", "--assignment-interval", "0.01",
            "--ack-timeout-unit", "0.05",
        ]  # fmt: skip
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        with StreamClient(self.url) as probe:
            wait_until(lambda: self._answers(probe), WAIT_S, what="the streams server to answer")
        return self

    def _answers(self, probe: StreamClient) -> bool:
        assert self.process is not None and self.process.poll() is None, self.log.read_text()
        try:
            probe.check_reachable(1.0)
            probe.describe_cluster()
            return True
        except StreamError:
            return False

    def kill9(self) -> None:
        if self.process is not None:
            kill9(self.process)
            close_pipes(self.process)
            self.process = None


class Flow:
    """Produces records to stream ``s`` in a thread (``key-N`` → an 8-digit sequence number) until stopped,
    remembering every acknowledged id and the last payload of each key."""

    def __init__(self, client: StreamClient, seed: int) -> None:
        self.client = client
        self.rng = random.Random(seed)
        self.seqs = itertools.count()
        self.expected: dict[bytes, bytes] = {}
        self.ids: list[RecordId] = []
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def produce(self, count: int) -> None:
        with BufferedProducer(
            self.client, "s", ProducerConfig(batch_max_records=100, linger_ms=5)
        ) as producer:
            futures = []
            for seq in itertools.islice(self.seqs, count):
                key = f"key-{self.rng.randrange(KEYS)}"
                payload = b"%08d" % seq
                self.expected[key.encode()] = payload
                futures.append(producer.append(payload, key=key))
            producer.flush()
            self.ids.extend(f.result() for f in futures)

    def start(self) -> Flow:
        def run() -> None:
            try:
                while not self.stop.wait(0.02):  # a steady trickle, the pace of a live source
                    self.produce(100)
            except BaseException as exc:  # reported by the test thread
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        return self

    def finish(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(WAIT_S)
            assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error

    @property
    def total(self) -> int:
        return len(self.ids)

    def target(self) -> dict[int, tuple[int, int]]:
        target: dict[int, tuple[int, int]] = {}
        for rid in self.ids:
            target[rid.shard_id] = max(target.get(rid.shard_id, (0, 0)), (rid.batch_id, rid.batch_index))
        return target


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[Server | StreamsServer]]:
    started: list[Server | StreamsServer] = []
    try:
        yield started
    finally:
        for server in started:
            server.kill9()


def start_pipeline(tmp_path: Path, streams_url: str, diffstore_url: str) -> Ingestors:
    with StreamClient(streams_url) as client:
        client.create_stream("s", shard_count=2)
        client.create_subscription("sub", "s", ack_timeout_s=40, max_unacked_records=20_000)
    ingestors = Ingestors(streams_url, ["--url", diffstore_url], ("--lease-ttl-ms", "10000"))
    ingestors.start()
    ingestors.start()
    for pid in ingestors.alive:  # both started (a server away at start is an error at once: exit 2)
        assert ingestors.ready[pid].wait(WAIT_S), "\n".join(ingestors.log[-40:])
    return ingestors


def outage_lines(ingestors: Ingestors, pid: int) -> tuple[int, int]:
    """How many "does not answer" and "is back" lines ``pid`` wrote."""
    mine = [line for line in ingestors.log if line.startswith(f"{pid}: ")]
    return sum("does not answer" in line for line in mine), sum("is back after" in line for line in mine)


def waiting_logged(ingestors: Ingestors, pid: int) -> bool:
    return outage_lines(ingestors, pid)[0] >= 1


def each_wait_ended(ingestors: Ingestors, pid: int) -> bool:
    """``pid`` said it waits at least once, and said the server is back after each wait."""
    waiting, back = outage_lines(ingestors, pid)
    return waiting >= 1 and back == waiting


def finish(ingestors: Ingestors, flow: Flow, collection_url: str) -> None:
    """Waits for C's positions to reach the last record, stops both ingestors (exit 0), checks C."""
    with Client(collection_url, timeout_s=60) as client:
        collection = client.collection("C")
        deadline = time.monotonic() + WAIT_S
        while not reached(stored_positions(collection), flow.target()):
            assert time.monotonic() < deadline, "C's positions did not reach the last records:\n" + "\n".join(
                ingestors.log[-40:]
            )
            time.sleep(0.05)
        assert all(p.poll() is None for p in ingestors.alive.values()), "\n".join(ingestors.log[-40:])
        ingestors.stop()
        check_exactly_once(collection, flow.expected, flow.total)


def test_a_restart_of_the_diffstore_server_leaves_the_ingestors_running_exactly_once(
    tmp_path: Path, servers: list[Server | StreamsServer]
) -> None:
    streams = StreamsServer(tmp_path / "hstream")
    servers.append(streams.start())
    store = Server(tmp_path / "db")
    servers.append(store.start())
    ingestors = start_pipeline(tmp_path, streams.url, store.url)
    try:
        with StreamClient(streams.url) as client:
            flow = Flow(client, seed=54).start()
            ingestors.next_commit(time.monotonic() + WAIT_S)
            with store.client() as admin:
                active = holder_pid(admin.collection("C"))
            assert active in ingestors.alive
            for _ in range(2):  # the soak's "two outages 49 s apart", closer together
                ingestors.drain()
                store.kill9()
                time.sleep(OUTAGE_S)
                store.start()
                ingestors.next_commit(time.monotonic() + WAIT_S)  # the pipeline moves again
            flow.finish()
        wait_until(lambda: each_wait_ended(ingestors, active), WAIT_S, what="one line at each end")
        finish(ingestors, flow, store.url)
    finally:
        ingestors.close()


def test_a_restart_of_the_streams_server_leaves_the_ingestors_running_exactly_once(
    tmp_path: Path, servers: list[Server | StreamsServer]
) -> None:
    streams = StreamsServer(tmp_path / "hstream")
    servers.append(streams.start())
    store = Server(tmp_path / "db")
    servers.append(store.start())
    ingestors = start_pipeline(tmp_path, streams.url, store.url)
    try:
        with StreamClient(streams.url) as client:
            flow = Flow(client, seed=55)
            flow.produce(6000)  # a backlog that is being delivered when the server dies
            ingestors.next_commit(time.monotonic() + WAIT_S)
            with store.client() as admin:
                active = holder_pid(admin.collection("C"))
            streams.kill9()
            wait_until(lambda: waiting_logged(ingestors, active), WAIT_S, what="the wait to be logged")
            time.sleep(OUTAGE_S)
            streams.start()
        with StreamClient(streams.url) as client:
            flow.client = client
            flow.produce(2000)  # records published after the restart come too
            ingestors.drain()
            ingestors.next_commit(time.monotonic() + WAIT_S)
        wait_until(lambda: each_wait_ended(ingestors, active), WAIT_S, what="the return to be logged")
        finish(ingestors, flow, store.url)
    finally:
        ingestors.close()


def test_a_cut_then_stalled_link_to_the_diffstore_server_is_ridden_out_exactly_once(
    tmp_path: Path, servers: list[Server | StreamsServer]
) -> None:
    streams = StreamsServer(tmp_path / "hstream")
    servers.append(streams.start())
    store = Server(tmp_path / "db")
    servers.append(store.start())
    with TcpProxy(store.url.removeprefix("http://")) as proxy:
        ingestors = start_pipeline(tmp_path, streams.url, f"http://{proxy.address}")
        try:
            with StreamClient(streams.url) as client:
                flow = Flow(client, seed=56).start()
                ingestors.next_commit(time.monotonic() + WAIT_S)
                with store.client() as admin:
                    active = holder_pid(admin.collection("C"))
                proxy.cut(refuse=True)
                wait_until(lambda: waiting_logged(ingestors, active), WAIT_S, what="the wait logged")
                time.sleep(OUTAGE_S)
                proxy.accept()
                wait_until(lambda: each_wait_ended(ingestors, active), WAIT_S, what="the return logged")
                ingestors.drain()
                ingestors.next_commit(time.monotonic() + WAIT_S)
                proxy.stall()  # requests hang, then arrive late: held back, not lost or applied twice
                time.sleep(OUTAGE_S)
                proxy.passing()
                ingestors.drain()
                ingestors.next_commit(time.monotonic() + WAIT_S)
                flow.finish()
            finish(ingestors, flow, store.url)
        finally:
            ingestors.close()


def test_give_up_after_s_ends_the_ingestor_once_its_server_stayed_away_that_long(
    tmp_path: Path, servers: list[Server | StreamsServer]
) -> None:
    streams = StreamsServer(tmp_path / "hstream")
    servers.append(streams.start())
    store = Server(tmp_path / "db")
    servers.append(store.start())
    with StreamClient(streams.url) as client:
        client.create_stream("s", shard_count=1)
        client.create_subscription("sub", "s")
    command = [
        sys.executable, "-m", "diffstore.streams.ingest_cli", "--hstream", streams.url,
        "--subscription", "sub", "--collection", "C", "--url", store.url, "--create-collection",
        "--lease-ttl-ms", "0", "--give-up-after-s", "2", "--window-ms", "20",
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    try:
        with StreamClient(streams.url) as client:
            Flow(client, seed=57).produce(50)
        with store.client() as admin:

            def committed() -> bool:
                try:
                    return admin.collection("C").generation_id != b""
                except NoSuchCollection:  # the ingestor has not created it yet
                    return False

            wait_until(committed, WAIT_S, what="a first window")
        store.kill9()
        with StreamClient(streams.url) as client:
            Flow(client, seed=58).produce(50)  # a window to write while the server is away
        assert process.wait(WAIT_S) == 1
        assert process.stderr is not None
        err = process.stderr.read()
        assert "does not answer; retrying with back-off for up to 2 s" in err
        assert "gave up after" in err and "diffstore ingest stopped" in err and "Traceback" not in err
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        close_pipes(process)
