"""Producer: the pure buffering and dispatch logic, then the real producer against the embedded server."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from diffstore.streams._proto import hstream_pb2 as pb
from diffstore.streams.client import StreamClient, StreamError, StreamNotFound
from diffstore.streams.producer import (
    AppendFuture,
    BatchBuffer,
    BufferedProducer,
    OrderedDispatch,
    PendingBatch,
    ProducerConfig,
    ProducerError,
)
from diffstore.streams.records import (
    Compression,
    RecordFlag,
    RecordId,
    StreamRecord,
    encode_header,
    encode_keyed_records,
)
from diffstore.streams.subscriber import StreamSubscriber

WAIT_S = 20.0


def _buffer(**kw: float) -> BatchBuffer:
    return BatchBuffer(ProducerConfig(**kw))  # type: ignore[arg-type]


RAW_A, RAW_B, JSON_A = (
    encode_header(RecordFlag.RAW, "a"),
    encode_header(RecordFlag.RAW, "b"),
    encode_header(RecordFlag.JSON, "a"),
)


def test_batch_sealed_by_record_count() -> None:
    buf = _buffer(batch_max_records=3, linger_ms=1000)
    first, sealed = buf.add(1, RAW_A, b"a", 0.0)
    assert not sealed and first.payloads == [b"a"]
    same, sealed = buf.add(1, RAW_B, b"b", 0.0)
    assert same is first and not sealed
    same, (full,) = buf.add(1, JSON_A, b"c", 0.0)
    assert same is full is first and full.payloads == [b"a", b"b", b"c"]
    assert full.headers == [RAW_A, RAW_B, JSON_A]
    assert buf.empty


def test_batch_sealed_by_bytes() -> None:
    buf = _buffer(batch_max_bytes=10, linger_ms=1000)
    assert not buf.add(1, RAW_A, b"12345", 0.0)[1]
    (sealed,) = buf.add(1, RAW_B, b"67890", 0.0)[1]
    assert sealed.size_bytes == 10


def test_batches_are_per_shard_and_sealed_by_age() -> None:
    buf = _buffer(linger_ms=100)
    buf.add(1, RAW_A, b"1", 0.0)
    buf.add(2, RAW_B, b"2", 0.05)
    buf.add(1, RAW_B, b"3", 0.06)  # another key of shard 1: same batch
    assert buf.next_deadline() == pytest.approx(0.1)
    assert buf.due(0.09) == []
    assert buf.due(0.2, busy={1, 2}) == []  # shards with a batch in flight keep growing
    assert buf.next_deadline(busy={1}) == pytest.approx(0.15)
    (due_1,) = buf.due(0.1)
    assert due_1.shard_id == 1 and due_1.payloads == [b"1", b"3"] and due_1.headers == [RAW_A, RAW_B]
    assert buf.next_deadline() == pytest.approx(0.15)
    assert [b.shard_id for b in buf.drain()] == [2]
    assert buf.next_deadline() is None


def test_mixed_keys_and_flags_encode_like_the_proto() -> None:
    batch = PendingBatch(1, 0.0, [RAW_A, JSON_A, RAW_B, RAW_A], [b"x", b"", b"y" * 300, b"z"])
    parsed = pb.BatchHStreamRecords.FromString(batch.encode())
    assert [(r.header.key, r.header.flag, r.payload) for r in parsed.records] == [
        ("a", RecordFlag.RAW, b"x"),
        ("a", RecordFlag.JSON, b""),
        ("b", RecordFlag.RAW, b"y" * 300),
        ("a", RecordFlag.RAW, b"z"),
    ]
    uniform = PendingBatch(1, 0.0, [RAW_A, RAW_A], [b"1", b"2"])
    assert uniform.encode() == encode_keyed_records(uniform.headers, uniform.payloads)


def test_zero_linger_seals_every_record() -> None:
    buf = _buffer(linger_ms=0)
    holder, sealed = buf.add(1, RAW_A, b"x", 0.0)
    assert list(sealed) == [holder]


def test_dispatch_runs_shards_concurrently_and_each_shard_in_order() -> None:
    def batch(shard: int, n: int) -> PendingBatch:
        return PendingBatch(shard, 0.0, [RAW_A], [b"%d" % n])

    dispatch: OrderedDispatch[int, PendingBatch] = OrderedDispatch(lambda b: b.shard_id)
    a1, a2, a3, b1 = batch(1, 1), batch(1, 2), batch(1, 3), batch(2, 1)
    assert dispatch.submit(a1) is True
    assert dispatch.submit(a2) is False
    assert dispatch.submit(b1) is True  # another shard: concurrent
    assert dispatch.submit(a3) is False
    assert dispatch.finished(1) is a2
    assert dispatch.finished(2) is None
    assert dispatch.finished(1) is a3
    assert dispatch.busy
    assert dispatch.finished(1) is None
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
    with StreamSubscriber(client, subscription) as consumer:
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


def test_many_keys_share_batches_and_keep_their_order(client: StreamClient) -> None:
    """5,000 records of 1,000 keys over 3 shards: batches hold many keys, yet every key reads back in
    append order (by record id and by what a consumer receives)."""
    client.create_stream("many", shard_count=3)
    client.create_subscription("all", "many")
    config = ProducerConfig(batch_max_records=400, linger_ms=5, compression=Compression.ZSTD)
    sent: list[tuple[str, bytes, AppendFuture]] = []
    with BufferedProducer(client, "many", config) as producer:
        for i in range(5_000):
            key, payload = f"k{(i * 7919) % 1_000}", b"%d" % i
            sent.append((key, payload, producer.append(payload, key=key)))
    ids = [f.result(timeout=WAIT_S) for _, _, f in sent]
    assert len(set(ids)) == 5_000
    assert len({(rid.shard_id, rid.batch_id) for rid in ids}) < 100  # not one Append per record
    expected: dict[str, list[bytes]] = {}
    last_by_key: dict[str, RecordId] = {}
    for (key, payload, _), rid in zip(sent, ids, strict=True):
        assert rid > last_by_key.get(key, RecordId(rid.shard_id, -1, 0))
        last_by_key[key] = rid
        expected.setdefault(key, []).append(payload)
    received: dict[str, list[bytes]] = {}
    for record in _read_all(client, "all", 5_000):
        received.setdefault(record.partition_key, []).append(record.payload)
    assert received == expected


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
