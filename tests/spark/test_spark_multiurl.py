"""The Spark data source given a primary's and its replica's URLs (the replica first): the driver and the
executors find the leader, so the write lands on the primary, committed once with its reader update, and
the read answers what the primary holds."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers_spark import user_key

from diffstore.replica import READER_PREFIX
from tests.helpers import wait_until
from tests.replica.compare import caught_up
from tests.replica.conftest import Server

pytest.importorskip("pyspark")

FOLLOW_S = 180.0


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Server, Server]]:
    primary = Server(tmp_path / "primary").start()
    replica = None
    try:
        replica = Server(tmp_path / "replica", "--replica-of", primary.url).start()
        yield primary, replica
    finally:
        for server in (replica, primary):
            if server is not None:
                server.kill9()


def test_the_data_source_writes_and_reads_through_the_leader_of_a_url_list(spark, pair) -> None:  # type: ignore[no-untyped-def]
    primary, replica = pair
    with primary.client() as p, replica.client() as r:
        c = p.create_collection("C", manual=True)
        c.create_reader("from_x", "hstream://elsewhere", None)
        generation = b"\x00\x00\x00\x00\x00\x00\x00\x01"
        c.start_generation(generation)
        wait_until(lambda: "C" in [i.name for i in r.collections()], FOLLOW_S, what="C on the replica")
    urls = f"{replica.url},{primary.url}"
    rows = [(user_key(i), b"w%d" % i) for i in range(40)]
    frame = spark.createDataFrame(rows, "key binary, value binary").repartition(3)
    updates = '[{"readerName": "from_x", "generationId": "Zw==", "expectedGenerationId": null}]'
    (
        frame.write.format("diffstore")
        .mode("append")
        .option("url", urls)
        .option("collection", "C")
        .option("generationIdEncoding", "base64")
        .option("generationId", base64.b64encode(generation).decode())
        .option("updateReaders", updates)
        .option("batchRows", "7")
        .save()
    )
    with primary.client() as p, replica.client() as r:
        c = p.collection("C")
        assert c.generation_id == generation and c.next_generation_id is None
        readers = {x.name: x.generation_id for x in c.readers() if not x.name.startswith(READER_PREFIX)}
        assert readers == {"from_x": b"g"}  # (the replica's hold aside)
        assert {x.key: x.value for x in c.query()} == dict(rows)
        wait_until(lambda: caught_up(p, r), FOLLOW_S, what="the replica to copy the write")
    read = spark.read.format("diffstore").option("url", urls).option("collection", "C").load()
    assert sorted((bytes(x["key"]), bytes(x["value"])) for x in read.collect()) == sorted(rows)
