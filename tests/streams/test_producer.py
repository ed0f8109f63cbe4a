"""Producer: the pure buffering and dispatch logic, then the real producer against the embedded server."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from diffstore.streams.client import StreamClient, StreamError, StreamNotFound
from diffstore.streams.consumer import Consumer
from diffstore.streams.producer import (
    AppendFuture,
    BatchBuffer,
    BufferedProducer,
    OrderedDispatch,
    PendingBatch,
    ProducerConfig,
    ProducerError,
)
from diffstore.streams.records import Compression, RecordFlag, RecordId, StreamRecord

WAIT_S = 20.0


def _buffer(**kw: float) -> BatchBuffer:
    return BatchBuffer(ProducerConfig(**kw))  # type: ignore[arg-type]


def test_batch_sealed_by_record_count() -> None:
    buf = _buffer(batch_max_records=3, linger_ms=1000)
    first, sealed = buf.add("k", RecordFlag.RAW, b"a", 0.0)
    assert not sealed and first.payloads == [b"a"]
    same, sealed = buf.add("k", RecordFlag.RAW, b"b", 0.0)
    assert same is first and not sealed
    same, (full,) = buf.add("k", RecordFlag.RAW, b"c", 0.0)
    assert same is full is first and full.payloads == [b"a", b"b", b"c"]
    assert buf.empty


def test_batch_sealed_by_bytes() -> None:
    buf = _buffer(batch_max_bytes=10, linger_ms=1000)
    assert not buf.add("k", RecordFlag.RAW, b"12345", 0.0)[1]
    (sealed,) = buf.add("k", RecordFlag.RAW, b"67890", 0.0)[1]
    assert sealed.size_bytes == 10


def test_batches_are_per_key_and_sealed_by_age() -> None:
    buf = _buffer(linger_ms=100)
    buf.add("a", RecordFlag.RAW, b"1", 0.0)
    buf.add("b", RecordFlag.RAW, b"2", 0.05)
    buf.add("a", RecordFlag.RAW, b"3", 0.06)
    assert buf.next_deadline() == pytest.approx(0.1)
    assert buf.due(0.09) == []
    assert buf.due(0.2, busy={"a", "b"}) == []  # keys with a batch in flight keep growing
    assert buf.next_deadline(busy={"a"}) == pytest.approx(0.15)
    (due_a,) = buf.due(0.1)
    assert due_a.partition_key == "a" and due_a.payloads == [b"1", b"3"]
    assert buf.next_deadline() == pytest.approx(0.15)
    assert [b.partition_key for b in buf.drain()] == ["b"]
    assert buf.next_deadline() is None


def test_flag_change_seals_the_open_batch_first() -> None:
    buf = _buffer(linger_ms=1000)
    buf.add("k", RecordFlag.RAW, b"raw", 0.0)
    holder, (sealed,) = buf.add("k", RecordFlag.JSON, b"json", 0.0)
    assert sealed.flag is RecordFlag.RAW and sealed.payloads == [b"raw"]
    (rest,) = buf.drain()
    assert rest is holder and rest.flag is RecordFlag.JSON and rest.payloads == [b"json"]


def test_zero_linger_seals_every_record() -> None:
    buf = _buffer(linger_ms=0)
    holder, sealed = buf.add("k", RecordFlag.RAW, b"x", 0.0)
    assert list(sealed) == [holder]


def test_dispatch_runs_keys_concurrently_and_each_key_in_order() -> None:
    def batch(key: str, n: int) -> PendingBatch:
        return PendingBatch(key, RecordFlag.RAW, 0.0, [b"%d" % n])

    dispatch: OrderedDispatch[PendingBatch] = OrderedDispatch(lambda b: b.partition_key)
    a1, a2, a3, b1 = batch("a", 1), batch("a", 2), batch("a", 3), batch("b", 1)
    assert dispatch.submit(a1) is True
    assert dispatch.submit(a2) is False
    assert dispatch.submit(b1) is True  # another key: concurrent
    assert dispatch.submit(a3) is False
    assert dispatch.finished("a") is a2
    assert dispatch.finished("b") is None
    assert dispatch.finished("a") is a3
    assert dispatch.busy
    assert dispatch.finished("a") is None
    assert not dispatch.busy


def test_config_is_validated() -> None:
    with pytest.raises(ValueError):
        ProducerConfig(batch_max_records=0)
    with pytest.raises(ValueError):
        ProducerConfig(linger_ms=-1)


# -- against the embedded server ------------------------------------------------------------------------


@pytest.fixture
def client(stream_server: Any) -> Iterator[StreamClient]:
    with StreamClient(stream_server.url) as stream_client:
        yield stream_client


def _read_all(client: StreamClient, subscription: str, count: int) -> list[StreamRecord]:
    records: list[StreamRecord] = []
    with Consumer(client, subscription) as consumer:
        deadline = time.monotonic() + WAIT_S
        while len(records) < count:
            assert time.monotonic() < deadline, f"got {len(records)} of {count} records"
            batch = consumer.poll(0.5)
            if batch is not None:
                records.extend(batch.records)
                consumer.ack(batch.record_ids)
    return records


@pytest.mark.parametrize("compression", list(Compression))
def test_producer_appends_keyed_raw_and_json_records_in_order(
    client: StreamClient, compression: Compression
) -> None:
    client.create_stream("orders", shard_count=2)
    client.create_subscription("all", "orders")
    config = ProducerConfig(batch_max_records=7, linger_ms=5, compression=compression)
    futures: list[tuple[str, Any, AppendFuture]] = []
    with BufferedProducer(client, "orders", config) as producer:
        for i in range(300):
            key = f"key-{i % 5}" if i % 4 else ""
            payload: Any = {"n": i, "tag": "j"} if i % 3 == 0 else (b"raw-%d" % i if i % 2 else f"str-{i}")
            futures.append((key, payload, producer.append(payload, key=key)))
    shard_map = client.shard_map("orders")
    ids = [f.result(timeout=WAIT_S) for _, _, f in futures]
    assert len(set(ids)) == 300
    last_by_key: dict[str, RecordId] = {}
    for (key, _, _), rid in zip(futures, ids, strict=True):
        assert rid.shard_id == shard_map.shard_for_key(key)
        if key in last_by_key:
            assert rid > last_by_key[key]  # same key: strictly in append order
        last_by_key[key] = rid
    by_id = {r.record_id: r for r in _read_all(client, "all", 300)}
    for (key, payload, _), rid in zip(futures, ids, strict=True):
        record = by_id[rid]
        assert record.partition_key == key
        if isinstance(payload, dict):
            assert record.is_json and record.json() == payload
        else:
            assert record.flag is RecordFlag.RAW
            assert record.payload == (payload if isinstance(payload, bytes) else payload.encode())


def test_append_errors_reach_every_future_and_flush(client: StreamClient) -> None:
    client.create_stream("doomed", shard_count=1)
    producer = BufferedProducer(client, "doomed", ProducerConfig(linger_ms=1000))
    ok = producer.append(b"first")
    producer.flush()
    assert ok.result(timeout=WAIT_S).shard_id > 0
    client.delete_stream("doomed", force=True)
    failing = [producer.append(b"x%d" % i) for i in range(3)]
    with pytest.raises(ProducerError) as info:
        producer.flush()
    assert isinstance(info.value.errors[0], StreamError)
    for future in failing:
        assert isinstance(future.exception(timeout=WAIT_S), StreamError)
        with pytest.raises(StreamError):
            future.result(timeout=WAIT_S)
    producer.close()


def test_missing_stream_is_not_found(client: StreamClient) -> None:
    with pytest.raises(StreamNotFound):
        BufferedProducer(client, "nope")


_OFFICIAL_CONSUMER = """
import asyncio, json, sys
from hstreamdb import insecure_client

async def main(host, port, want):
    got = []
    async with await insecure_client(host=host, port=int(port)) as client:
        async def process(ack, stop, records):
            records = list(records)
            got.extend(records)
            await ack([r.id for r in records])
            if len(got) >= int(want):
                await stop()
        consumer = client.new_consumer("official", "sub", process)
        await asyncio.wait_for(consumer.start(), timeout=30)
    print(json.dumps([
        [r.id.shard_id, r.id.batch_id, r.id.batch_index, r.header.key or "",
         r.payload if isinstance(r.payload, dict) else r.payload.decode()]
        for r in got
    ]))

asyncio.run(main(*sys.argv[1:]))
"""


def test_official_client_reads_what_the_producer_appends(client: StreamClient, stream_server: Any) -> None:
    """Interop: gzip batches of RAW and JSON records from our producer decode in the official client."""
    client.create_stream("s", shard_count=2)
    client.create_subscription("sub", "s")
    config = ProducerConfig(compression=Compression.GZIP, batch_max_records=3)
    with BufferedProducer(client, "s", config) as producer:
        futures = [producer.append(b"raw-%d" % i, key=f"k{i % 2}") for i in range(5)]
        futures.append(producer.append({"n": 1, "s": "x"}, key="j"))
    ids = [f.result() for f in futures]
    host, port = stream_server.address.rsplit(":", 1)
    command = [sys.executable, "-c", _OFFICIAL_CONSUMER, host, port, str(len(ids))]
    done = subprocess.run(command, capture_output=True, text=True, timeout=WAIT_S * 2)
    assert done.returncode == 0, done.stderr
    seen = {RecordId(s, b, i): (key, payload) for s, b, i, key, payload in json.loads(done.stdout)}
    assert [seen[rid] for rid in ids[:5]] == [(f"k{i % 2}", f"raw-{i}") for i in range(5)]
    assert seen[ids[5]] == ("j", {"n": 1.0, "s": "x"})
