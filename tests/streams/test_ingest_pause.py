"""Two ``diffstore ingest`` on one subscription, the active one paused (SIGSTOP) again and again (#25).

A producer appends records all the time. Each round SIGSTOPs the active ingestor and holds it stopped until
the standby holds the lease and has committed a window of its own, then SIGCONTs it. The stopped one's
records in flight (sent to it, not acked) are still owed by the streams server; the new owner must not
store a position past them before it applied them, or they arrive below it later and are skipped as
duplicates (the loss this test was written for: one contiguous block of one shard per pause).

At the end:
- every produced record is in C exactly once (``rec/<seq>`` written by exactly one generation) and each key
  holds the payload of its last record;
- the lineage of the position readers is one chain per shard: each commit moves a reader from where the
  previous one left it;
- the generations carry non-decreasing lease versions: the resumed former owner committed nothing.

Runs against an embedded store shared by both processes (``--data``) and a diffstore server (``--url``), and
against a streams server that resends only at the ack deadline, newer batches first, as HStreamDB does (the
orders such a server may deliver are also fed to the frontier in tests/streams/test_ingest_window.py and
test_ingest_window_property.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from test_ingest import http_server
from test_ingest_ha import Ingestors, holder_pid, reached, stored_positions

from diffstore.client import Client
from diffstore.collection import Collection
from diffstore.engine import Store, StoreConfig
from diffstore.engine.overview import recent_generations
from diffstore.rounds import COUNTER_BYTES
from diffstore.streams.client import StreamClient
from diffstore.streams.producer import BufferedProducer, ProducerConfig
from diffstore.streams.records import RecordId
from diffstore.streams.server import ServerThread, StreamServerConfig
from tests.faults import TcpProxy, paused
from tests.helpers import wait_until

PAUSES = 3
ACK_TIMEOUT_UNITS = 60  # the subscription's ack timeout, in the server's units (the fixture's: 50 ms)
# Each takeover costs a recovery hold (ack timeout + 1 s) on such a server: a lease that flaps under load
# (the HA tests' 800 ms) would restart it again and again
LEASE_TTL_MS = 5000
KEYS = 40
WAIT_S = 90.0


class Producer:
    """Appends records ``%08d`` of a running sequence, to random keys, until stopped (in a thread)."""

    def __init__(self, client: StreamClient) -> None:
        self.client = client
        self.ids: list[RecordId] = []
        self.expected: dict[bytes, bytes] = {}
        self._stop = threading.Event()
        self._errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        rng = random.Random(25)
        seq = itertools.count()
        try:
            with BufferedProducer(self.client, "s", ProducerConfig(batch_max_records=50)) as producer:
                while not self._stop.is_set():
                    futures = []
                    for n in itertools.islice(seq, 50):
                        key = f"key-{rng.randrange(KEYS)}"
                        payload = b"%08d" % n
                        self.expected[key.encode()] = payload
                        futures.append(producer.append(payload, key=key))
                    producer.flush()
                    self.ids.extend(f.result() for f in futures)
                    self._stop.wait(0.02)  # pacing: a steady stream, not a flood on a shared machine
        except BaseException as exc:  # reported by stop()
            self._errors.append(exc)

    def start(self) -> Producer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(WAIT_S)
        assert not self._thread.is_alive()
        if self._errors:
            raise self._errors.pop()


def last_positions(ids: list[RecordId]) -> dict[int, tuple[int, int]]:
    last: dict[int, tuple[int, int]] = {}
    for rid in ids:
        last[rid.shard_id] = max(last.get(rid.shard_id, (0, 0)), (rid.batch_id, rid.batch_index))
    return last


def wait_commit_by(ingestors: Ingestors, pid: int) -> None:
    """Waits for a commit line (with records) of ``pid``."""
    deadline = time.monotonic() + WAIT_S
    while ingestors.next_commit(deadline)[0] != pid:
        pass


def wait_standing_by(ingestors: Ingestors, pid: int) -> None:
    """Waits until the last state line of ``pid`` says it stands by (``standby``, or ``acquiring`` when it
    looked while nobody held the lease). With an 800 ms lease on a loaded machine the "active" one may
    have lost its lease by itself just before it was paused: then it stood by already."""
    prefix = f"{pid}: ingest: "

    def standing_by() -> bool:
        states = [line[len(prefix) :] for line in list(ingestors.log) if line.startswith(prefix)]
        return bool(states) and not states[-1].startswith("active")

    try:
        wait_until(standing_by, WAIT_S, what=f"{pid} standing by")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the ingestors' log:\n" + "\n".join(ingestors.log[-40:])) from None


def check_lineage(collection: Collection, generations: list[bytes]) -> None:
    """Each commit moved each position reader from where the previous commit left it."""
    last: dict[str, bytes | None] = {}
    for generation in generations:
        for source in collection.lineage(generation).sources:
            if not source.reader_name.startswith("hstream/"):
                continue
            before = last.get(source.reader_name)
            assert source.from_generation_id == before, (
                f"{source.reader_name} moved by {generation.hex()} from {source.from_generation_id!r}, "
                f"but the previous commit left it at {before!r}"
            )
            last[source.reader_name] = source.to_generation_id
    for reader in collection.readers():
        if reader.name in last:
            assert reader.generation_id == last[reader.name]


def check_exactly_once(
    collection: Collection, generations: list[bytes], expected: dict[bytes, bytes], total: int
) -> None:
    """Every ``rec/<seq>`` written by exactly one of ``generations`` (all, oldest first); final values
    exact."""
    assert collection.generation_state()[1] is None
    final = {r.key: r.value for r in collection.query() if not r.key.startswith(b"rec/")}
    applied: dict[bytes, bytes] = {}
    for low, high in itertools.pairwise([b"", *generations]):
        for item in collection.diff(from_generation_id=low, to_generation_id=high):
            if item.key.startswith(b"rec/"):
                assert item.key not in applied, f"{item.key!r} applied by {applied[item.key]!r} and {high!r}"
                applied[item.key] = high
    missing = sorted({b"rec/%08d" % seq for seq in range(total)} - set(applied))
    assert not missing, f"{len(missing)} of {total} records missing: {missing[:3]} .. {missing[-3:]}"
    assert len(applied) == total
    assert final == expected


@contextlib.contextmanager
def target_collection(
    kind: str, tmp_path: Path
) -> Iterator[tuple[list[str], Collection, Callable[[], AbstractContextManager[object]]]]:
    """The ingestors' destination arguments, a handle on C, and ``between_writes()``: a context in which no
    ingestor is inside a write transaction of the store. With ``--data`` the processes share one LMDB
    file, whose one writer at a time is the others' lock: a process stopped inside a write would stop
    every other writer (its standby too), so a pause is taken while the test holds that lock itself."""
    if kind == "data":
        with Store.open(tmp_path / "db", StoreConfig(background=False)) as store:
            collection = store.create_collection("C", manual=True)
            yield ["--data", str(tmp_path / "db")], collection, store.write
    else:
        with http_server(tmp_path / "db") as url, Client(url) as client:
            yield ["--url", url], client.create_collection("C", manual=True), contextlib.nullcontext


@pytest.mark.parametrize("kind", ["url", "data"])
def test_pausing_the_active_ingestor_loses_and_duplicates_nothing(
    stream_server: Any, tmp_path: Path, kind: str
) -> None:
    run_pauses(stream_server, tmp_path, kind, None)


def test_pauses_with_a_slow_and_cut_network_to_the_streams_server(stream_server: Any, tmp_path: Path) -> None:
    """The same, with the ingestors reaching the streams server through a TCP proxy that delays every chunk
    while the active one is stopped, and cuts every connection once the standby took over (the stopped
    one's call ends, the new owner's call breaks and is opened again)."""
    with TcpProxy(stream_server.address) as proxy:
        run_pauses(stream_server, tmp_path, "url", proxy)


def test_pauses_against_a_server_that_resends_only_at_the_ack_deadline(
    stream_server_config: StreamServerConfig, tmp_path: Path
) -> None:
    """The same, against the embedded server in HStreamDB's order: a moved shard's unacked records are
    resent only when their ack deadline passes, after the new owner got the shard's newer batches
    (``redeliver_at_once=False``). The ingestors are told to hold each shard for what HStreamDB needs,
    the subscription's ack timeout plus a second (``--recovery-hold-ms``: the embedded server is
    recognised, and would get none)."""
    config = dataclasses.replace(stream_server_config, redeliver_at_once=False)
    hold_ms = int(ACK_TIMEOUT_UNITS * config.ack_timeout_unit * 1000) + 1000
    server = ServerThread(config).start()
    try:
        options = ("--recovery-hold-ms", str(hold_ms), "--lease-ttl-ms", str(LEASE_TTL_MS))
        run_pauses(server, tmp_path, "url", None, options)
    finally:
        server.stop()


def run_pauses(
    stream_server: Any, tmp_path: Path, kind: str, proxy: TcpProxy | None, options: tuple[str, ...] = ()
) -> None:
    with (
        target_collection(kind, tmp_path) as (destination, collection, between_writes),
        StreamClient(stream_server.url) as client,
    ):
        client.create_stream("s", shard_count=2)
        # 60 "seconds" = 3 s at the fixture's unit: records in flight to the stopped ingestor are not resent
        # before the standby has taken over and committed newer ones
        client.create_subscription("sub", "s", ack_timeout_s=ACK_TIMEOUT_UNITS, max_unacked_records=20_000)
        url = stream_server.url
        if proxy is not None:
            for shard in client.list_shards("s"):
                client.lookup_shard(shard.shard_id)  # the producer keeps the direct address
            # the server now tells every client to dial the proxy
            stream_server.server._servicer.advertise("127.0.0.1", proxy.port)
            url = f"hstream://{proxy.address}"
        ingestors = Ingestors(url, destination, options)
        producer = Producer(client)
        try:
            first = ingestors.start()
            second = ingestors.start()
            producer.start()
            for _ in range(PAUSES):
                ingestors.drain()
                active = wait_until(lambda: holder_pid(collection), WAIT_S, what="an active ingestor")
                wait_commit_by(ingestors, active)
                standby = second.pid if active == first.pid else first.pid
                with contextlib.ExitStack() as pause:
                    with between_writes():  # stopped outside any write of the store
                        pause.enter_context(paused(ingestors.alive[active]))
                    if proxy is not None:
                        proxy.delay(5)
                    wait_until(
                        lambda: holder_pid(collection) == standby,  # noqa: B023 (called at once)
                        WAIT_S,
                        what="the takeover",
                    )
                    ingestors.drain()
                    wait_commit_by(ingestors, standby)
                    if proxy is not None:
                        proxy.cut(refuse=False)
                        proxy.passing()
                wait_standing_by(ingestors, active)  # resumed, it saw its lease gone
            if proxy is not None:  # the ingestors' calls went through it, and were opened again after cuts
                assert proxy.connections > 2 + PAUSES and proxy.forwarded > 0
            # the producer runs on until everything produced up to now is applied (a stream that stops at
            # once leaves a takeover's backlog to be certified batch by batch: correct, but slow)
            until = last_positions(list(producer.ids))
            try:
                wait_until(
                    lambda: reached(stored_positions(collection), until),
                    WAIT_S,
                    what="the ingestors catching up",
                )
            except AssertionError as exc:
                log = "\n".join(ingestors.log[-30:])
                raise AssertionError(f"{exc}: at {stored_positions(collection)} of {until}\n{log}") from None
            producer.stop()
            target = last_positions(producer.ids)
            try:
                wait_until(
                    lambda: reached(stored_positions(collection), target),
                    WAIT_S,
                    what="the positions in C reaching the last records",
                )
            except AssertionError as exc:
                log = "\n".join(ingestors.log[-30:])
                raise AssertionError(f"{exc}: at {stored_positions(collection)} of {target}\n{log}") from None
            ingestors.stop()
        finally:
            producer.stop()
            ingestors.close()
    # checked on the store itself, once everything is closed (it lists the committed generation ids)
    with Store.open(tmp_path / "db", StoreConfig(background=False)) as store:
        collection = store.collection("C")
        generations = recent_generations(store, "C", 1_000_000)[::-1]
        check_exactly_once(collection, generations, producer.expected, len(producer.ids))
        check_lineage(collection, generations)
    versions = [int.from_bytes(g[COUNTER_BYTES : 2 * COUNTER_BYTES], "big") for g in generations]
    assert versions == sorted(versions), "a former owner committed after the takeover"
    assert versions[-1] - versions[0] >= PAUSES
