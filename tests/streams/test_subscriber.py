"""Consumer: the pure ack bookkeeping, then the real consumer against the embedded server."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from diffstore.streams.client import StreamClient, StreamNotFound
from diffstore.streams.producer import BufferedProducer, ProducerConfig
from diffstore.streams.records import Compression, RecordId, StreamRecord
from diffstore.streams.server import ServerThread, StreamServerConfig
from diffstore.streams.subscriber import AckBook, StreamSubscriber, SubscriberConfig
from tests.helpers import wait_until

WAIT_S = 20.0


def _ids(*indices: int) -> list[RecordId]:
    return [RecordId(1, 10, i) for i in indices]


def test_acks_are_grouped_by_count() -> None:
    book = AckBook(ack_batch_records=3, ack_flush_ms=1000)
    book.delivered(_ids(0, 1, 2, 3))
    assert book.unacked == 4
    book.ack(_ids(0, 1), now=0.0)
    assert book.take(0.0) == []
    book.ack(_ids(2), now=0.0)
    assert book.take(0.0) == _ids(0, 1, 2)
    assert book.unacked == 1 and book.pending == 0


def test_acks_are_sent_by_age_and_forced() -> None:
    book = AckBook(ack_batch_records=100, ack_flush_ms=50)
    book.ack(_ids(5), now=1.0)
    assert book.next_deadline() == 1.05
    assert book.take(1.04) == []
    assert book.take(1.05) == _ids(5)
    assert book.next_deadline() is None
    book.ack(_ids(6), now=2.0)
    assert book.take(2.0, force=True) == _ids(6)
    assert book.take(2.0, force=True) == []


def test_duplicate_acks_are_sent_once_and_redelivery_is_idempotent() -> None:
    book = AckBook(ack_batch_records=1, ack_flush_ms=0)
    book.delivered(_ids(1))
    book.delivered(_ids(1))
    assert book.unacked == 1
    book.ack(_ids(1) + _ids(1), now=0.0)
    assert book.take(0.0) == _ids(1)
    assert book.unacked == 0


# -- against the embedded server ------------------------------------------------------------------------


@pytest.fixture
def client(stream_server: Any) -> Iterator[StreamClient]:
    with StreamClient(stream_server.url) as stream_client:
        yield stream_client


def _append(client: StreamClient, stream: str, payloads: list[bytes], key: str = "") -> list[RecordId]:
    with BufferedProducer(client, stream, ProducerConfig(compression=Compression.ZSTD)) as producer:
        futures = [producer.append(p, key=key) for p in payloads]
    return [f.result() for f in futures]


def _poll_records(consumer: StreamSubscriber, count: int, ack: bool) -> list[StreamRecord]:
    records: list[StreamRecord] = []
    deadline = time.monotonic() + WAIT_S
    while len(records) < count:
        assert time.monotonic() < deadline, f"got {len(records)} of {count}"
        batch = consumer.poll(0.2)
        if batch is not None:
            records.extend(batch.records)
            if ack:
                consumer.ack(batch.record_ids)
    return records


def test_consumer_decodes_acks_and_moves_the_committed_position(client: StreamClient) -> None:
    client.create_stream("s", shard_count=2)
    client.create_subscription("sub", "s")
    ids = _append(client, "s", [b"p%d" % i for i in range(50)], key="k")
    with StreamSubscriber(client, "sub", SubscriberConfig(consumer_name="c1")) as consumer:
        records = _poll_records(consumer, 50, ack=True)
        assert [r.payload for r in records] == [b"p%d" % i for i in range(50)]
        assert [r.record_id for r in records] == ids
        assert [c.name for c in client.list_consumers("sub")] == ["c1"]

        def committed() -> bool:
            offsets = {o.shardId: o.batchId for o in client.get_subscription("sub").offsets}
            return offsets.get(ids[-1].shard_id, 0) >= ids[-1].batch_id

        wait_until(committed)
        assert consumer.unacked == 0


def test_unacked_records_come_again_after_the_ack_timeout(client: StreamClient) -> None:
    client.create_stream("s", shard_count=1)
    client.create_subscription("sub", "s", ack_timeout_s=2)  # 2 units = 100 ms on the test server
    ids = _append(client, "s", [b"a", b"b", b"c"])
    with StreamSubscriber(client, "sub") as consumer:
        first = _poll_records(consumer, 3, ack=False)
        assert [r.record_id for r in first] == ids
        consumer.ack([first[0].record_id, first[2].record_id])
        # The unacked record comes again with its id (under load the acked ones may too, if their acks
        # arrive after the timeout: only the server's own tests can pin "only the unacked ones").
        again: list[StreamRecord] = []
        while ids[1] not in [r.record_id for r in again]:
            again.extend(_poll_records(consumer, 1, ack=True))
        assert {r.record_id for r in again} <= set(ids)
        assert next(r for r in again if r.record_id == ids[1]).payload == b"b"


def test_missing_subscription_ends_the_consumer_with_not_found(client: StreamClient) -> None:
    consumer = StreamSubscriber(client, "missing")
    deadline = time.monotonic() + WAIT_S
    with pytest.raises(StreamNotFound):
        while time.monotonic() < deadline:
            consumer.poll(0.1)
    consumer.close()


def test_consumer_reconnects_after_a_server_restart(stream_server_config: StreamServerConfig) -> None:
    first = ServerThread(stream_server_config).start()
    port = first.server.port
    restarted_config = dataclasses.replace(stream_server_config, port=port)
    with StreamClient(first.url) as client:
        client.create_stream("s", shard_count=1)
        client.create_subscription("sub", "s")
        _append(client, "s", [b"before"])
        config = SubscriberConfig(reconnect_initial_ms=5, reconnect_max_ms=50)
        consumer = StreamSubscriber(client, "sub", config)
        try:
            assert [r.payload for r in _poll_records(consumer, 1, ack=True)] == [b"before"]
            first.stop()
            second = ServerThread(restarted_config).start()
            try:
                _append(client, "s", [b"after"])
                seen: list[bytes] = []
                deadline = time.monotonic() + WAIT_S
                while b"after" not in seen:  # "before" may come again: its ack may not have been stored
                    assert time.monotonic() < deadline, seen
                    seen.extend(r.payload for r in _poll_records(consumer, 1, ack=True))
                assert set(seen) <= {b"before", b"after"}
                assert consumer.reconnects >= 1
            finally:
                consumer.close()
                second.stop()
        finally:
            first.stop()


_OFFICIAL_APPENDER = """
import asyncio, json, sys
from hstreamdb import insecure_client

async def main(host, port):
    out = []
    async with await insecure_client(host=host, port=int(port)) as client:
        for payloads, key, compression in (
            ([b"raw-0", b"raw-1"], None, None),
            (["str-0"], "k1", "gzip"),
            ([{"n": 3.0, "s": "x", "l": [1.0, True]}], "k2", "gzip"),
        ):
            ids = await client.append("s", payloads, key=key, compresstype=compression)
            out.extend([r.shard_id, r.batch_id, r.batch_index] for r in ids)
    print(json.dumps(out))

asyncio.run(main(*sys.argv[1:]))
"""


def test_consumer_reads_what_the_official_client_appends(client: StreamClient, stream_server: Any) -> None:
    """Interop: records appended by the official ``hstreamdb`` client (gzip, str, dict) decode here."""
    client.create_stream("s", shard_count=2)
    client.create_subscription("sub", "s")
    host, port = stream_server.address.rsplit(":", 1)
    done = subprocess.run(
        [sys.executable, "-c", _OFFICIAL_APPENDER, host, port], capture_output=True, text=True, timeout=WAIT_S
    )
    assert done.returncode == 0, done.stderr
    ids = [RecordId(*rid) for rid in json.loads(done.stdout)]
    with StreamSubscriber(client, "sub") as consumer:
        by_id = {r.record_id: r for r in _poll_records(consumer, len(ids), ack=True)}
    assert [by_id[i].payload for i in ids[:3]] == [b"raw-0", b"raw-1", b"str-0"]
    assert [by_id[i].partition_key for i in ids] == ["", "", "k1", "k2"]
    assert by_id[ids[3]].is_json and by_id[ids[3]].json() == {"n": 3, "s": "x", "l": [1, True]}
