"""Ingestion end to end: embedded HStream server → Ingestor → a manual collection (embedded and over HTTP)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from ingest_helpers import ingest_until, last_positions, produce

from diffstore.client import Client
from diffstore.engine import Store, StoreConfig
from diffstore.engine.types import GenerationInfo
from diffstore.server import ServerConfig, create_app
from diffstore.streams.client import StreamClient
from diffstore.streams.ingest import CommitStats, IngestConfig, Ingestor
from diffstore.streams.records import RecordId, RecordPosition, StreamRecord
from diffstore.streams.sinks import EngineSink, HttpSink
from tests.helpers import close_pipes, serving, wait_until

WAIT_S = 30.0
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def client(stream_server: Any) -> Iterator[StreamClient]:
    with StreamClient(stream_server.url) as stream_client:
        yield stream_client


def test_stop_commits_the_open_window(client: StreamClient, tmp_path: Path) -> None:
    client.create_stream("s", shard_count=2)
    client.create_subscription("sub", "s")
    ids = produce(client, "s", [(f"k{i}", b"v%d" % i) for i in range(10)])
    sink = EngineSink.open(tmp_path / "db", "C", create=True)
    try:
        config = IngestConfig("sub", window_records=1_000_000, window_ms=10_000_000)  # never closes alone
        ingestor = Ingestor(client, sink, config)
        commits: list[CommitStats] = []
        thread = threading.Thread(target=ingestor.run, args=(commits.append,), daemon=True)
        thread.start()
        wait_until(lambda: ingestor.open_window_records == 10)
        assert commits == []
        ingestor.stop()
        thread.join(WAIT_S)
        assert not thread.is_alive()
        assert [c.records for c in commits] == [10]
        collection = sink.collection
        assert {r.key: r.value for r in collection.query()} == {b"k%d" % i: b"v%d" % i for i in range(10)}
        stored = {r.name: r.generation_id for r in collection.readers()}
        assert {stored[f"hstream/sub/{s}"] for s in last_positions(ids)} == {
            p.to_bytes() for p in last_positions(ids).values()
        }
    finally:
        sink.close()


def assert_window_metadata(
    history: list[GenerationInfo],
    commits: list[CommitStats],
    subscription: str,
    stream: str,
    ids: list[RecordId],
) -> None:
    """Each window's commit carries its subscription, stream, records and per shard the first..last
    positions it applied: together the windows' ranges cover each shard's records once, in order."""
    by_generation = {info.generation_id: info for info in history}
    ranges: dict[str, list[tuple[RecordPosition, RecordPosition]]] = {}
    for commit in commits:
        metadata = by_generation[commit.generation_id].metadata
        assert metadata is not None
        assert (metadata["subscription"], metadata["stream"]) == (subscription, stream)
        assert metadata["records"] == str(commit.records)
        for key, value in metadata.items():
            if key.startswith("shard."):
                first, last = (RecordPosition(*map(int, end.split("-"))) for end in value.split(".."))
                ranges.setdefault(key, []).append((first, last))
    for shard, position in last_positions(ids).items():
        spans = ranges[f"shard.{shard}"]
        firsts = [first for first, _ in spans]
        lasts = [last for _, last in spans]
        assert lasts[-1] == position and all(a < b for a, b in zip(lasts, firsts[1:], strict=False)), spans
        records = sorted(i.position for i in ids if i.shard_id == shard)
        assert firsts[0] == records[0]


def upper_mapper(record: StreamRecord) -> list[tuple[bytes, bytes | None]]:
    """A user mapper: renames keys, uppercases values, deletes on ``b"delete"``."""
    key = b"user/" + record.partition_key.encode()
    if record.payload == b"delete":
        return [(key, None)]
    return [(key, record.payload.upper())]


def test_ingest_into_embedded_collection_exactly_once(client: StreamClient, tmp_path: Path) -> None:
    client.create_stream("events", shard_count=2)
    client.create_subscription("ing", "events")
    items: list[tuple[str, Any]] = [(f"k{i % 7}", b"v%d" % i) for i in range(200)]
    items += [("json", {"b": 2, "a": [1, "x"]})]
    ids = produce(client, "events", items)
    sink = EngineSink.open(tmp_path / "db", "C", create=True)
    try:
        config = IngestConfig("ing", window_records=40, window_ms=20)
        commits = ingest_until(client, sink, config, last_positions(ids))
        store_collection = sink.collection
        assert store_collection.get(b"k3").value == b"v%d" % max(i for i in range(200) if i % 7 == 3)
        assert store_collection.get(b"json").value == b'{"a":[1,"x"],"b":2}'
        generations = [c.generation_id for c in commits]
        assert generations == sorted(generations) and len(set(generations)) == len(generations)
        assert all(len(g) == 8 for g in generations)
        assert sum(c.records for c in commits) == len(items)
        readers = {r.name: r for r in store_collection.readers()}
        for shard_id, position in last_positions(ids).items():
            reader = readers[f"hstream/ing/{shard_id}"]
            assert reader.collection == "hstream://events"
            assert reader.generation_id == position.to_bytes()
        assert store_collection.next_generation_id is None
        assert_window_metadata(store_collection.history(limit=1000)[0], commits, "ing", "events", ids)
    finally:
        sink.close()

    # A restarted ingestor applies only what is new.
    more = produce(client, "events", [("k0", b"later")])
    sink = EngineSink.open(tmp_path / "db", "C")
    try:
        commits = ingest_until(client, sink, IngestConfig("ing", window_ms=10), last_positions(ids + more))
        assert sum(c.records for c in commits) == 1
        assert sink.collection.get(b"k0").value == b"later"
    finally:
        sink.close()


def test_user_mapper_renames_and_tombstones(client: StreamClient, tmp_path: Path) -> None:
    client.create_stream("s", shard_count=1)
    client.create_subscription("sub", "s")
    ids = produce(client, "s", [("a", b"one"), ("b", b"two"), ("a", b"delete")])
    store = Store.open(tmp_path / "db")
    store.create_collection("C", manual=True)
    store.close()
    sink = EngineSink.open(tmp_path / "db", "C")
    try:
        config = IngestConfig("sub", window_records=2, window_ms=10, mapper=upper_mapper)
        ingest_until(client, sink, config, last_positions(ids))
        collection = sink.collection
        assert collection.get(b"user/a") is None
        assert collection.get(b"user/b").value == b"TWO"
        assert collection.get(b"a") is None
    finally:
        sink.close()


@contextmanager
def http_server(data_dir: Path, token: str | None = None) -> Iterator[str]:
    """A real uvicorn diffstore server on a free loopback port (wanting ``token`` when given)."""
    store = Store.open(data_dir, StoreConfig(commit_delay_ms=10))
    app = create_app(store, ServerConfig(token=token))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
    try:
        with serving(server) as url:
            yield url
    finally:
        store.close()


def test_ingest_through_the_http_client(client: StreamClient, tmp_path: Path) -> None:
    client.create_stream("s", shard_count=2)
    client.create_subscription("sub", "s")
    ids = produce(client, "s", [(f"k{i % 11}", b"%d" % i) for i in range(300)])
    with http_server(tmp_path / "db") as url:
        sink = HttpSink.open(url, "C", create=True)
        try:
            config = IngestConfig("sub", window_records=64, window_ms=20)
            commits = ingest_until(client, sink, config, last_positions(ids))
            collection = sink.collection
            assert collection.get(b"k5").value == b"%d" % max(i for i in range(300) if i % 11 == 5)
            readers = {r.name: r.generation_id for r in collection.readers()}
            assert {readers[f"hstream/sub/{s}"] for s in last_positions(ids)} == {
                p.to_bytes() for p in last_positions(ids).values()
            }
            assert_window_metadata(collection.history(limit=1000)[0], commits, "sub", "s", ids)
        finally:
            sink.close()


@pytest.mark.parametrize("target", ["data", "url", "url-token"])
def test_cli_ingests_and_stops_cleanly_on_sigterm(
    client: StreamClient, stream_server: Any, tmp_path: Path, target: str
) -> None:
    client.create_stream("s", shard_count=1)
    client.create_subscription("sub", "s")
    ids = produce(client, "s", [("k", b"%d" % i) for i in range(100)])
    with contextlib.ExitStack() as stack:
        if target == "data":
            destination = ["--data", str(tmp_path / "db")]
        elif target == "url":
            destination = ["--url", stack.enter_context(http_server(tmp_path / "db"))]
        else:  # a token-protected server: ingest sends the token it is given
            destination = [
                "--url",
                stack.enter_context(http_server(tmp_path / "db", "s3cret")),
                "--token",
                "s3cret",
            ]
        command = [
            sys.executable, "-m", "diffstore.cli", "ingest", "--hstream", stream_server.url,
            "--subscription", "sub", "--collection", "C", *destination, "--create-collection",
            "--window-records", "30", "--window-ms", "20", "--log-commits",
        ]  # fmt: skip
        pipe = subprocess.PIPE
        process = subprocess.Popen(command, stdout=pipe, stderr=pipe, text=True, cwd=REPO)
        try:
            assert process.stdout is not None
            applied = 0
            deadline = time.monotonic() + WAIT_S
            while applied < len(ids):
                assert time.monotonic() < deadline
                line = process.stdout.readline()
                assert line, process.stderr.read() if process.stderr else "no output"
                applied = int(json.loads(line)["applied"])
            process.terminate()
            assert process.wait(WAIT_S) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            close_pipes(process)
        if target != "data":
            with Client(destination[1], token="s3cret" if target == "url-token" else None) as http:
                record = http.collection("C").get(b"k")
            assert record is not None and record.value == b"99"
    if target == "data":
        with Store.open(tmp_path / "db") as store:
            collection = store.collection("C")
            assert collection.get(b"k").value == b"99"
            assert collection.next_generation_id is None


def test_shard_split_mid_ingest_is_ingested_exactly_once(client: StreamClient, tmp_path: Path) -> None:
    client.create_stream("grow", shard_count=1)
    client.create_subscription("sub", "grow")
    (first,) = client.list_shards("grow")
    before = produce(client, "grow", [(f"k{i}", b"old%d" % i) for i in range(50)])
    sink = EngineSink.open(tmp_path / "db", "C", create=True)
    try:
        ingestor = Ingestor(client, sink, IngestConfig("sub", window_records=20, window_ms=10))
        commits: list[CommitStats] = []
        errors: list[BaseException] = []

        def run() -> None:
            try:
                ingestor.run(commits.append)
            except BaseException as exc:  # reported below
                errors.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        wait_until(lambda: sum(c.records for c in commits) == 50 or errors)
        shards = client.split_shard("grow", first.shard_id)
        added = [s for s in shards if s.shard_id != first.shard_id]
        assert len(added) == 1 and added[0].start_hash == shards[0].end_hash + 1
        # a new producer lists the shards again: some keys now go to the new shard
        after = produce(client, "grow", [(f"k{i}", b"new%d" % i) for i in range(50)])
        assert {r.shard_id for r in after} == {first.shard_id, added[0].shard_id}
        target = last_positions(before + after)
        wait_until(
            lambda: (
                errors
                or bool(commits)
                and all(commits[-1].positions.get(s, RecordPosition(0, 0)) >= p for s, p in target.items())
            )
        )
        ingestor.stop()
        thread.join(WAIT_S)
        assert not errors and not thread.is_alive()
        assert sum(c.records for c in commits) == 100  # each record once, none twice
        collection = sink.collection
        assert {r.key: r.value for r in collection.query()} == {b"k%d" % i: b"new%d" % i for i in range(50)}
        readers = {r.name: r for r in collection.readers()}
        reader = readers[f"hstream/sub/{added[0].shard_id}"]
        assert reader.collection == "hstream://grow"
        assert reader.generation_id == target[added[0].shard_id].to_bytes()
    finally:
        sink.close()
