"""Helpers of the ingestion tests: produce records, compute final positions, ingest until they are reached.

Kept light (no HTTP server imports): the crash test's ingestor subprocesses import this module's siblings.
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any

from diffstore.streams.client import StreamClient
from diffstore.streams.ingest import CommitStats, IngestConfig, Ingestor
from diffstore.streams.producer import BufferedProducer, ProducerConfig
from diffstore.streams.records import Compression, RecordId, RecordPosition, StreamRecord
from diffstore.streams.sinks import CollectionSink

WAIT_S = 60.0
_applications = itertools.count()


def tracing_mapper(record: StreamRecord) -> list[tuple[bytes, bytes]]:
    """Key → payload (the final-value check) and ``rec/<seq>`` → a token unique to this application, so
    a record applied twice (in two generations or by two processes) shows. Ingestor subprocesses name it
    ``--mapper ingest_helpers:tracing_mapper``."""
    seq = record.payload
    token = b"%d:%d" % (os.getpid(), next(_applications))
    return [(record.partition_key.encode(), seq), (b"rec/" + seq, token)]


def produce(client: StreamClient, stream: str, items: list[tuple[str, Any]]) -> list[RecordId]:
    config = ProducerConfig(batch_max_records=50, compression=Compression.ZSTD)
    with BufferedProducer(client, stream, config) as producer:
        futures = [producer.append(payload, key=key) for key, payload in items]
    return [f.result() for f in futures]


def last_positions(ids: list[RecordId]) -> dict[int, RecordPosition]:
    positions: dict[int, RecordPosition] = {}
    for rid in ids:
        if rid.shard_id not in positions or rid.position > positions[rid.shard_id]:
            positions[rid.shard_id] = rid.position
    return positions


def ingest_until(
    client: StreamClient, sink: CollectionSink, config: IngestConfig, target: dict[int, RecordPosition]
) -> list[CommitStats]:
    """Runs an ingestor in a thread until its committed positions reach ``target``, then stops it cleanly."""
    ingestor = Ingestor(client, sink, config)
    commits: list[CommitStats] = []
    done = threading.Event()

    def on_commit(stats: CommitStats) -> None:
        commits.append(stats)
        if all(stats.positions.get(s, RecordPosition(0, 0)) >= p for s, p in target.items()):
            done.set()

    errors: list[BaseException] = []

    def run() -> None:
        try:
            ingestor.run(on_commit)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)
            done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert done.wait(WAIT_S), f"positions {commits[-1].positions if commits else None}, wanted {target}"
    ingestor.stop()
    thread.join(WAIT_S)
    assert not thread.is_alive()
    if errors:
        raise errors[0]
    return commits
