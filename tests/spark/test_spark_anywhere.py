"""What users run, on whatever session the suite has: the data source (batch and streaming, read and
write), a leased transform over several rounds, a preview, the lineage of a round.

The suite's local session runs these as any Spark test; ``test_spark_connect.py`` runs this very file again
in a child pytest whose session is a Spark Connect server's, whose jobs run on a standalone cluster — the
same code path, the same assertions.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers_spark import commit_items, initial_load, load_example_job, random_changes, snapshot, user_key
from pyspark.sql import functions as F

from diffstore import Store
from diffstore.client import Client
from diffstore.spark import Transform
from diffstore.wire import decode_es

WAIT_S = 300.0


def _rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted(tuple(bytes(v) if v is not None else None for v in row) for row in df.collect())


def test_batch_reads_and_a_write_that_commits_with_its_reader(
    spark: Any, server_url: str, store: Store, names: dict[str, str]
) -> None:
    a, c = names["A"], names["C"]
    store.create_collection(a, manual=True)
    first = commit_items(store, a, [(b"k1", b"a1"), (b"k2", b"a2")])
    commit_items(store, a, [(b"k1", None), (b"k3", b"a3")])

    def reader() -> Any:
        return spark.read.format("diffstore").option("url", server_url).option("collection", a)

    assert _rows(reader().load()) == [(b"k2", b"a2"), (b"k3", b"a3")]
    diff = reader().option("generationIdEncoding", "base64").option("fromGenerationId", _b64(first)).load()
    assert _rows(diff) == [(b"k1", b"a1", None), (b"k3", None, b"a3")]

    target = store.create_collection(c, manual=True)
    target.create_reader("from_a", a, generation_id=None)
    target.start_generation(b"g1")
    frame = spark.createDataFrame([(b"k1", b"v1"), (b"k2", None)], "key binary, value binary")
    updates = '[{"readerName": "from_a", "generationId": "1", "expectedGenerationId": null}]'
    (
        frame.write.format("diffstore").mode("append")
        .option("url", server_url).option("collection", c)
        .option("generationId", "g1").option("updateReaders", updates)
        .save()
    )  # fmt: skip
    target = store.collection(c)
    assert target.generation_id == b"g1" and snapshot(store, c) == {b"k1": b"v1"}
    assert [(r.name, r.generation_id) for r in target.readers()] == [("from_a", b"1")]


def _b64(value: bytes) -> str:
    import base64

    return base64.b64encode(value).decode()


SPARK_CONNECT_BACK = "Python worker failed to connect back"
"""Spark waits a fixed 10 s (not configurable in 4.3) for the Python process of a stream source to start
and connect back; on an overloaded 2-core machine importing pyspark there can take longer, more so next
to a Connect server and a cluster's JVMs. The query then fails while INITIALIZING, before any batch; the
user's remedy — start it again from its checkpoint — is what ``_mirror`` does, a few times, after which
the test is skipped naming the cause (the local session's streaming tests cover the same code)."""


def _mirror(spark: Any, url: str, a: str, c: str, checkpoint: Path, attempts: int = 3) -> None:
    """A → C (C's value = A's toValue) with the availableNow trigger, run to its end."""
    try:
        _mirror_once(spark, url, a, c, checkpoint)
    except Exception as exc:
        if SPARK_CONNECT_BACK not in str(exc):
            raise
        if attempts <= 1:
            pytest.skip(
                f"Spark's Python stream source did not start within its fixed 10 s: {SPARK_CONNECT_BACK}"
            )
        _mirror(spark, url, a, c, checkpoint, attempts - 1)


def _mirror_once(spark: Any, url: str, a: str, c: str, checkpoint: Path) -> None:
    changes = (
        spark.readStream.format("diffstore")
        .option("url", url).option("collection", a)
        .option("startingGeneration", "earliest")
        .load()
    )  # fmt: skip
    query = (
        changes.select("key", F.col("toValue").alias("value"))
        .writeStream.format("diffstore")
        .option("url", url).option("collection", c)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )  # fmt: skip
    assert query.awaitTermination(WAIT_S), f"still running: {query.status}"
    if query.exception() is not None:
        raise RuntimeError(str(query.exception())[:2000])


def test_a_stream_restarted_from_its_checkpoint_mirrors_a_collection(
    spark: Any, server_url: str, store: Store, names: dict[str, str], tmp_path: Path
) -> None:
    a, c = names["A"], names["C"]
    store.create_collection(a, manual=True)
    store.create_collection(c, manual=True)
    checkpoint = tmp_path / "checkpoint"
    commit_items(store, a, [(user_key(i), b"v1-%d" % i) for i in range(30)])
    commit_items(store, a, [(user_key(i), b"v2-%d" % i) for i in range(0, 30, 3)])
    _mirror(spark, server_url, a, c, checkpoint)
    assert snapshot(store, c) == snapshot(store, a)
    first = store.collection(c).generation_id
    # deletes, inserts and updates; the restarted query resumes from its checkpoint: one more batch
    commit_items(store, a, [(user_key(i), None) for i in range(0, 30, 5)] + [(user_key(40), b"new")])
    commit_items(store, a, [(user_key(1), b"v3")])
    _mirror(spark, server_url, a, c, checkpoint)
    assert snapshot(store, c) == snapshot(store, a)
    counters = [int.from_bytes(g[:8], "big") for g in (first, store.collection(c).generation_id)]
    assert counters == [1, 2]  # each batch applied once


def test_a_leased_transform_over_rounds_of_updates_and_deletes(
    spark: Any, server_url: str, store: Store, names: dict[str, str]
) -> None:
    rng = random.Random(27)
    users = 300
    for name in names.values():
        store.create_collection(name, manual=True)
    a, b = initial_load(rng, users)
    commit_items(store, names["A"], a)
    commit_items(store, names["B"], b)
    job = load_example_job()
    sources = {"a": names["A"], "b": names["B"]}
    # the first round's diffs are read by Spark tasks (over local_diff_max_rows), the later ones on the driver
    transform = Transform(
        spark, server_url, names["C"], sources, job.country_totals, partitions=2, lease_ttl_ms=30_000,
        local_diff_max_rows=100,
    )  # fmt: skip
    try:
        for round_ in range(3):
            rounds = transform.run()
            assert len(rounds) == 1 and rounds[0].rows_written
            assert snapshot(store, names["C"]) == job.recompute(
                snapshot(store, names["A"]), snapshot(store, names["B"])
            )
            changes_a, changes_b = random_changes(rng, users, 60 if round_ else 150)
            commit_items(store, names["A"], changes_a)
            commit_items(store, names["B"], changes_b)
        assert len(transform.run()) == 1
        assert snapshot(store, names["C"]) == job.recompute(
            snapshot(store, names["A"]), snapshot(store, names["B"])
        )
        c = store.collection(names["C"])
        spans = {s.reader_name: s.to_generation_id for s in c.lineage(c.generation_id).sources or ()}
        assert spans["from_a"] == store.collection(names["A"]).generation_id
    finally:
        transform.close()


def test_a_preview_holds_what_the_round_then_commits(
    spark: Any, server_url: str, store: Store, names: dict[str, str]
) -> None:
    rng = random.Random(28)
    for name in names.values():
        store.create_collection(name, manual=True)
    a, b = initial_load(rng, 100)
    commit_items(store, names["A"], a)
    commit_items(store, names["B"], b)
    job = load_example_job()
    transform = Transform(
        spark, server_url, names["C"], {"a": names["A"], "b": names["B"]}, job.country_totals, partitions=2
    )
    try:
        transform.run()
        changes, _ = random_changes(rng, 100, 30)
        started = httpx.post(f"{server_url}/collections/{names['A']}/phantom/start", json={})
        phantom_a = started.json()["phantomId"]
        with Client(server_url) as client:
            handle = client.collection(names["A"])
            handle.put_many(changes, generation_id=handle.generation_id, phantom_id=decode_es(phantom_a))
        before = snapshot(store, names["C"])
        phantom_c = decode_es(transform.preview({"a": phantom_a}))
        assert snapshot(store, names["C"]) == before  # nothing committed
        with Client(server_url) as client:
            target = client.collection(names["C"])
            previewed = {r.key: r.value for r in target.query(phantom_id=phantom_c)}
        commit_items(store, names["A"], changes)
        assert len(transform.run()) == 1
        assert snapshot(store, names["C"]) == previewed
    finally:
        transform.close()
