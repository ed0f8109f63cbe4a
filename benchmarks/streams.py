"""Stream benchmarks, each against a baseline measured in the same run (figures and ratios printed).

1. Producer: records/s of :class:`BufferedProducer` appending N 100-byte records, vs Append RPCs of
   pre-encoded batches of the same size (the wire and server cost alone).
2. Producer with many partition keys: records/s with ``--many-keys`` (10,000) distinct keys vs 10 keys,
   same stream shape (``--shards`` shards). Goal: >= 0.8x (records of many keys share a shard's batch).
3. Ingestion end to end (embedded server → collection in an embedded store): records/s of the
   :class:`Ingestor`, vs a bare StreamingFetch consumer that only decodes and acks. Goal: ≥ 0.5×.

The embedded HStream server runs in its own process (``diffstore streams serve``) so that it does not
share the interpreter lock with the code measured.

    python benchmarks/streams.py [--records 1000000] [--keyed-records 300000] [--many-keys 10000]
        [--ingest-records 300000] [--batch 1000] [--rounds 3] [--only producer,keys,ingest]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from _harness import machine, streams_serve

from diffstore.streams.client import StreamClient
from diffstore.streams.ingest import CommitStats, IngestConfig, Ingestor
from diffstore.streams.producer import BufferedProducer, ProducerConfig
from diffstore.streams.records import Compression, RecordFlag, build_batch, encode_header, encode_records
from diffstore.streams.sinks import EngineSink
from diffstore.streams.subscriber import StreamSubscriber

PAYLOAD = b"x" * 100


def bench_producer(client: StreamClient, records: int, batch: int, round_no: int) -> tuple[float, float]:
    """Returns (producer records/s, raw Append records/s)."""
    producer_stream, raw_stream = f"producer-bench-{round_no}", f"raw-bench-{round_no}"
    client.create_stream(producer_stream, shard_count=1)
    config = ProducerConfig(batch_max_records=batch, batch_max_bytes=1 << 30, compression=Compression.NONE)
    start = time.perf_counter()
    with BufferedProducer(client, producer_stream, config) as producer:
        for _ in range(records):
            producer.append(PAYLOAD)
    producer_rate = records / (time.perf_counter() - start)

    client.create_stream(raw_stream, shard_count=1)
    shard_id = client.list_shards(raw_stream)[0].shard_id
    encoded = build_batch(encode_records(encode_header(RecordFlag.RAW, ""), [PAYLOAD] * batch), batch,
                          Compression.NONE, time.time_ns())  # fmt: skip
    start = time.perf_counter()
    for _ in range(records // batch):
        client.append(raw_stream, shard_id, encoded)
    raw_rate = (records // batch) * batch / (time.perf_counter() - start)
    return producer_rate, raw_rate


def bench_keys(client: StreamClient, records: int, keys: int, shards: int, name: str) -> float:
    """Records/s of the producer appending ``records`` 100-byte records round-robin over ``keys`` keys."""
    client.create_stream(name, shard_count=shards)
    names = [f"key-{i}" for i in range(keys)]
    start = time.perf_counter()
    with BufferedProducer(client, name, ProducerConfig(batch_max_records=1000)) as producer:
        for i in range(records):
            producer.append(PAYLOAD, key=names[i % keys])
    return records / (time.perf_counter() - start)


def fill_stream(client: StreamClient, stream: str, records: int, keys: int, rounds: int) -> None:
    client.create_stream(stream, shard_count=2)
    for i in range(rounds):
        client.create_subscription(f"bare-{i}", stream, max_unacked_records=50_000)
        client.create_subscription(f"ingest-{i}", stream, max_unacked_records=50_000)
    with BufferedProducer(client, stream, ProducerConfig(batch_max_records=1000)) as producer:
        for i in range(records):
            producer.append(PAYLOAD, key=f"key-{i % keys}")


def bench_bare_consumer(client: StreamClient, records: int, subscription: str) -> float:
    received = 0
    start = time.perf_counter()
    with StreamSubscriber(client, subscription) as consumer:
        while received < records:
            batch = consumer.poll(10)
            if batch is None:
                raise RuntimeError(f"bare consumer stalled at {received} records")
            received += len(batch.records)
            consumer.ack(batch.record_ids)
    return records / (time.perf_counter() - start)


def bench_ingest(client: StreamClient, records: int, subscription: str, data_dir: Path) -> float:
    sink = EngineSink.open(data_dir, "C", create=True)
    ingestor = Ingestor(client, sink, IngestConfig(subscription))  # the defaults: windows of 10,000 / 500 ms

    def on_commit(stats: CommitStats) -> None:
        if stats.applied_total >= records:
            ingestor.stop()

    start = time.perf_counter()
    try:
        ingestor.run(on_commit)
    finally:
        sink.close()
    return ingestor.applied_total / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000, help="records, producer benchmark")
    parser.add_argument("--ingest-records", type=int, default=300_000, help="records, ingestion benchmark")
    parser.add_argument("--batch", type=int, default=1000, help="records per batch")
    parser.add_argument("--keys", type=int, default=100, help="partition keys of the ingestion stream")
    parser.add_argument("--keyed-records", type=int, default=300_000, help="records, many-keys benchmark")
    parser.add_argument("--many-keys", type=int, default=10_000, help="distinct keys, many-keys benchmark")
    parser.add_argument("--shards", type=int, default=2, help="shards, many-keys benchmark")
    parser.add_argument("--rounds", type=int, default=3, help="alternated bare/ingestion rounds (best)")
    parser.add_argument("--only", default="producer,keys,ingest", help="comma-separated benchmarks to run")
    args = parser.parse_args()
    print(machine())
    only = set(args.only.split(","))
    with tempfile.TemporaryDirectory() as tmp, streams_serve(Path(tmp) / "hstream") as url:
        with StreamClient(url) as client:
            n, batch, m = args.records, args.batch, args.ingest_records
            if "producer" in only:
                produced = [bench_producer(client, n, batch, i) for i in range(args.rounds)]
                _report("producer", "raw Append", produced)
                print(f"  ({n:,} records of 100 B per round, batches of {batch}, no compression)")
            if "keys" in only:
                k, many, shards = args.keyed_records, args.many_keys, args.shards
                keyed = [
                    (
                        bench_keys(client, k, many, shards, f"many-{i}"),
                        bench_keys(client, k, 10, shards, f"few-{i}"),
                    )
                    for i in range(args.rounds)
                ]
                _report(f"{many} keys", "10 keys", keyed)
                print(f"  ({k:,} records of 100 B per round, {shards} shards, batches of 1000; goal >= 0.8x)")
            if "ingest" not in only:
                return

            fill_stream(client, "ingest-bench", m, args.keys, args.rounds)
            ingested = []
            for i in range(args.rounds):
                bare = bench_bare_consumer(client, m, f"bare-{i}")
                ingest = bench_ingest(client, m, f"ingest-{i}", Path(tmp) / f"store-{i}")
                ingested.append((ingest, bare))
            _report("ingestion", "bare consumer", ingested)
            print(f"  ({m:,} records, {args.keys} keys; ingestion with the default windows; goal >= 0.5x)")


def _report(name: str, baseline: str, rounds: list[tuple[float, float]]) -> None:
    """Rounds alternate measure and baseline (this machine's load is noisy): each round, best, median."""
    for i, (measured, base) in enumerate(rounds):
        print(f"{name:>10} {measured:10,.0f} records/s  {baseline} {base:10,.0f} records/s  "
              f"ratio {measured / base:.2f}x  (round {i + 1})")  # fmt: skip
    best = max(r[0] for r in rounds) / max(r[1] for r in rounds)
    median = statistics.median(r[0] / r[1] for r in rounds)
    print(f"{name} / {baseline}: best/best {best:.2f}x, median of rounds {median:.2f}x")


if __name__ == "__main__":
    main()
