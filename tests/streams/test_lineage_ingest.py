"""Ingestion records lineage: every window's commit names the stream positions it moved, shard by shard."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ingest_helpers import ingest_until, last_positions, produce

from diffstore.streams.client import StreamClient
from diffstore.streams.ingest import IngestConfig
from diffstore.streams.sinks import EngineSink


@pytest.fixture
def client(stream_server: Any) -> Iterator[StreamClient]:
    with StreamClient(stream_server.url) as stream_client:
        yield stream_client


def test_each_window_records_the_stream_positions_it_applied(client: StreamClient, tmp_path: Path) -> None:
    client.create_stream("events", shard_count=2)
    client.create_subscription("ing", "events")
    ids = produce(client, "events", [(f"k{i % 37}", b"v%d" % i) for i in range(300)])
    sink = EngineSink.open(tmp_path / "db", "A", create=True)
    try:
        config = IngestConfig("ing", window_records=64, window_ms=20)
        commits = ingest_until(client, sink, config, last_positions(ids))
        assert len(commits) >= 2
        collection = sink.collection
        reached: dict[str, bytes | None] = {}
        for stats in commits:  # in commit order, each shard's spans follow on from one another
            lineage = collection.lineage(stats.generation_id, depth=3)
            assert lineage.generation_id == stats.generation_id and lineage.sources
            for source in lineage.sources:
                assert (source.collection_name, source.target) == (None, "hstream://events")
                assert source.sources is None  # a stream reader is a leaf, whatever the depth
                assert source.from_generation_id == reached.get(source.reader_name)
                reached[source.reader_name] = source.to_generation_id
        assert reached == {f"hstream/ing/{shard}": p.to_bytes() for shard, p in last_positions(ids).items()}
    finally:
        sink.close()
