"""Lineage end to end: streams → ingestion into A and B → the Spark A+B→C transform → C's lineage walked
back to the stream positions that made each generation of C."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from helpers_spark import load_example_job, snapshot  # noqa: E402

from diffstore import Store  # noqa: E402
from diffstore.engine.types import LineageSource  # noqa: E402
from diffstore.spark import Transform  # noqa: E402
from diffstore.streams.client import StreamClient  # noqa: E402
from diffstore.streams.ingest import IngestConfig  # noqa: E402
from diffstore.streams.records import RecordPosition  # noqa: E402
from diffstore.streams.server import ServerThread, StreamServerConfig  # noqa: E402
from diffstore.streams.sinks import HttpSink  # noqa: E402
from tests.streams.ingest_helpers import ingest_until, last_positions, produce  # noqa: E402


@pytest.fixture
def streams(tmp_path: Path) -> Iterator[StreamClient]:
    config = StreamServerConfig(
        data_dir=tmp_path / "hstream",
        port=0,
        resend_tick=0.005,
        assignment_interval=0.01,
        ack_timeout_unit=0.05,
        sync=False,
    )
    server = ServerThread(config).start()
    try:
        with StreamClient(server.url) as client:
            yield client
    finally:
        server.stop()


def _ingest(
    streams: StreamClient, url: str, stream: str, collection: str, items: list[tuple[str, bytes]]
) -> dict[int, RecordPosition]:
    """Produces ``items`` and ingests the stream into ``collection`` until they are all applied."""
    positions = last_positions(produce(streams, stream, items))
    sink = HttpSink.open(url, collection, create=True)
    try:
        ingest_until(
            streams, sink, IngestConfig(f"sub-{collection}", window_records=40, window_ms=20), positions
        )
    finally:
        sink.close()
    return positions


def _spans(sources: tuple[LineageSource, ...] | None) -> dict[str, tuple[bytes | None, bytes | None]]:
    assert sources is not None
    return {s.reader_name: (s.from_generation_id, s.to_generation_id) for s in sources}


def test_c_is_traced_back_to_the_stream_records(
    spark: Any, server_url: str, store: Store, names: dict[str, str], streams: StreamClient
) -> None:
    a_name, b_name, c_name = names["A"], names["B"], names["C"]
    streams.create_stream("countries", shard_count=2)
    streams.create_stream("amounts", shard_count=1)
    streams.create_subscription(f"sub-{a_name}", "countries")
    streams.create_subscription(f"sub-{b_name}", "amounts")
    users = [f"user{i}" for i in range(60)]
    first_a = _ingest(
        streams,
        server_url,
        "countries",
        a_name,
        [(u, b"DE" if i % 2 else b"FR") for i, u in enumerate(users)],
    )
    first_b = _ingest(
        streams, server_url, "amounts", b_name, [(u, b"%d" % (i * 10)) for i, u in enumerate(users)]
    )
    for source in (a_name, b_name):  # a null reader keeps every generation of A and B: the walk is complete
        store.collection(source).create_reader("keep")
    store.create_collection(c_name, manual=True)
    job = load_example_job()
    transform = Transform(
        spark, server_url, c_name, {"a": a_name, "b": b_name}, job.country_totals, partitions=2
    )
    try:
        assert len(transform.run()) == 1
        assert snapshot(store, c_name) == job.recompute(snapshot(store, a_name), snapshot(store, b_name))
        c = store.collection(c_name)
        first = c.generation_id
        lineage = c.lineage(first, depth=3)
        a, b = store.collection(a_name), store.collection(b_name)
        # the transform's commit moved from_a and from_b from null to A's and B's generations
        assert _spans(lineage.sources) == {
            "from_a": (None, a.generation_id),
            "from_b": (None, b.generation_id),
        }
        by_reader = {s.reader_name: s for s in lineage.sources}
        # ... and A's and B's generations up to there were made by these stream positions, per shard
        assert _spans(by_reader["from_a"].sources) == {
            f"hstream/sub-{a_name}/{shard}": (None, p.to_bytes()) for shard, p in first_a.items()
        }
        assert _spans(by_reader["from_b"].sources) == {
            f"hstream/sub-{b_name}/{shard}": (None, p.to_bytes()) for shard, p in first_b.items()
        }
        assert all(s.target == "hstream://countries" for s in by_reader["from_a"].sources or ())

        # a second round after more records of one stream: only A's new positions made it
        gen_a = a.generation_id
        second_a = _ingest(streams, server_url, "countries", a_name, [(u, b"JP") for u in users[:25]])
        assert len(transform.run()) == 1
        assert snapshot(store, c_name) == job.recompute(snapshot(store, a_name), snapshot(store, b_name))
        lineage = c.lineage(c.generation_id, depth=2)
        by_reader = {s.reader_name: s for s in lineage.sources}
        assert _spans(lineage.sources)["from_a"] == (gen_a, a.generation_id)
        assert _spans(by_reader["from_a"].sources) == {
            f"hstream/sub-{a_name}/{shard}": (first_a[shard].to_bytes(), p.to_bytes())
            for shard, p in second_a.items()
        }
        if by_reader.get("from_b") is not None:  # B did not move: no stream records of B made it
            assert by_reader["from_b"].from_generation_id == by_reader["from_b"].to_generation_id
            assert by_reader["from_b"].sources == ()
        assert c.lineage(first, depth=1).sources[0].to_generation_id == gen_a  # the first round keeps its own
    finally:
        transform.close()
