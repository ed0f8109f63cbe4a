"""Structured Streaming: the ``diffstore`` source and sink end to end on the real local session and server.

A query streams collection A's changes into manual collection C (``value`` = A's ``toValue``), so after every
batch C must equal A. C's generation counter (its first 8 bytes) counts the committed batches: a batch
applied twice would show as one generation too many.
"""

from __future__ import annotations

import base64
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers_spark import commit_items, snapshot, user_key
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType

from diffstore import Store
from diffstore.spark.streaming import batch_generation, committed_batch, is_batch_generation
from tests.helpers import wait_until

WAIT_S = 300.0


def _finish(query: Any) -> None:
    """Waits for an availableNow query to end, and says how far it got when it did not end well."""
    assert query.awaitTermination(WAIT_S), f"still running: {query.status} {query.lastProgress}"
    assert query.exception() is None, str(query.exception())[:2000]


def _counter(generation: bytes) -> int:
    return int.from_bytes(generation[:8], "big")


def _marker(store: Store, name: str) -> bytes | None:
    return {r.name: r.generation_id for r in store.collection(name).readers()}["spark/spark_sink"]


def _mirror_query(
    spark: Any, url: str, a: str, c: str, checkpoint: Path, *, fail_flag: Path | None = None
) -> Any:
    """A → C with the availableNow trigger; the sink task holding the key ending in 0x07 fails while
    ``fail_flag`` exists."""
    changes = (
        spark.readStream.format("diffstore")
        .option("url", url)
        .option("collection", a)
        .option("startingGeneration", "earliest")
        .load()
    )
    rows = changes.select("key", F.col("toValue").alias("value")).repartition(2)
    if fail_flag is not None:
        flag = str(fail_flag)

        @F.udf(BinaryType())  # type: ignore[misc]
        def guard(key: bytes) -> bytes:
            import os

            if key.endswith(b"\x07") and os.path.exists(flag):
                raise RuntimeError("injected failure")
            return key

        # after the shuffle: in the sink's own tasks, so the other task's rows reach C's open generation
        rows = rows.withColumn("key", guard("key"))
    return (
        rows.writeStream.format("diffstore")
        .option("url", url)
        .option("collection", c)
        .option("batchRows", "5")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def test_stream_mirrors_a_collection_exactly_once(spark, server_url, store: Store, names, tmp_path) -> None:
    a, c = names["A"], names["C"]
    store.create_collection(a, manual=True)
    store.create_collection(c, manual=True)
    checkpoint = tmp_path / "checkpoint"
    commit_items(store, a, [(user_key(i), b"v1-%d" % i) for i in range(30)])
    commit_items(store, a, [(user_key(i), b"v2-%d" % i) for i in range(0, 30, 3)])  # updates

    query = _mirror_query(spark, server_url, a, c, checkpoint)
    _finish(query)
    assert snapshot(store, c) == snapshot(store, a)
    batches = _counter(store.collection(c).generation_id)
    assert batches == 1 and committed_batch(_marker(store, c)) == 0
    # the source's reader holds A's GC back, at most up to what was read
    stream_reader = {r.name: r.generation_id for r in store.collection(a).readers()}["spark_stream"]
    assert (stream_reader or b"") <= store.collection(a).generation_id

    # deletes, inserts and updates; the restarted query resumes from its checkpoint
    commit_items(store, a, [(user_key(i), None) for i in range(0, 30, 5)] + [(user_key(40), b"new")])
    commit_items(store, a, [(user_key(1), b"v3")])
    query = _mirror_query(spark, server_url, a, c, checkpoint)
    _finish(query)
    assert snapshot(store, c) == snapshot(store, a)
    assert _counter(store.collection(c).generation_id) == 2 and committed_batch(_marker(store, c)) == 1

    # a replayed batch (committed in C, but Spark's commit log lost it) is not applied again
    before = store.collection(c).generation_id
    last_commit = max(
        (checkpoint / "commits").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1
    )
    last_commit.unlink()
    (last_commit.parent / f".{last_commit.name}.crc").unlink(missing_ok=True)
    query = _mirror_query(spark, server_url, a, c, checkpoint)
    _finish(query)
    assert store.collection(c).generation_id == before and store.collection(c).next_generation_id is None
    assert snapshot(store, c) == snapshot(store, a)

    # a failure mid-batch: one task's rows were written, the other task failed; nothing is applied
    mirrored = snapshot(store, c)
    flag = tmp_path / "fail"
    flag.touch()
    commit_items(store, a, [(user_key(i), b"v4-%d" % i) for i in range(0, 30, 2)] + [(user_key(7), b"v4")])
    query = _mirror_query(spark, server_url, a, c, checkpoint, fail_flag=flag)
    with pytest.raises(Exception, match="injected failure"):
        query.awaitTermination(WAIT_S)
    assert store.collection(c).generation_id == before and snapshot(store, c) == mirrored
    # The failed batch's generation was aborted; a task that Spark had not stopped yet may still have
    # opened it again afterwards: then it is that batch's leftover, never committed, and the restarted
    # run aborts it (the next assertions).
    leftover = store.collection(c).next_generation_id
    assert leftover is None or is_batch_generation(leftover, 2)
    flag.unlink()
    query = _mirror_query(spark, server_url, a, c, checkpoint, fail_flag=flag)
    _finish(query)
    assert snapshot(store, c) == snapshot(store, a)
    # Generation counters count above the open generation too: a task of the failed batch that Spark had
    # not stopped yet may open that batch's generation (counter 3) at any moment until the restart, before
    # or after `leftover` was read, and so push the restart's own generation to 4. Either way batch 2 is
    # committed once (the marker) with exactly A's contents (above).
    assert _counter(store.collection(c).generation_id) in (3, 4)
    assert committed_batch(_marker(store, c)) == 2
    assert store.collection(c).next_generation_id is None
    shutil.rmtree(checkpoint)


def test_processing_time_trigger_follows_commits(spark, server_url, store: Store, names, tmp_path) -> None:
    a, c = names["A"], names["C"]
    store.create_collection(a, manual=True)
    store.create_collection(c, manual=True)
    first = commit_items(store, a, [(b"old", b"1")])
    query = (
        spark.readStream.format("diffstore")
        .option("url", server_url)
        .option("collection", a)
        .option("startingGeneration", base64.b64encode(first).decode())
        .option("generationIdEncoding", "base64")
        .option("readerName", "follower")
        .load()
        .select("key", F.col("toValue").alias("value"))
        .writeStream.format("diffstore")
        .option("url", server_url)
        .option("collection", c)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        commit_items(store, a, [(b"k1", b"a"), (b"k2", b"b")])
        wait_until(
            lambda: snapshot(store, c) == {b"k1": b"a", b"k2": b"b"},
            timeout=WAIT_S,
            interval=0.1,
            what="the first change",
        )
        commit_items(store, a, [(b"k1", None), (b"k3", b"c")])
        wait_until(
            lambda: snapshot(store, c) == {b"k2": b"b", b"k3": b"c"},
            timeout=WAIT_S,
            interval=0.1,
            what="the second change",
        )
    finally:
        query.stop()
    assert query.exception() is None
    assert b"old" not in snapshot(store, c)  # startingGeneration: only what came after it


def test_stream_columns_and_starting_latest(spark, server_url, store: Store, names) -> None:
    a = names["A"]
    store.create_collection(a, manual=True)
    commit_items(store, a, [(b"k", b"1")])
    second = commit_items(store, a, [(b"k", b"2"), (b"j", b"x")])

    def run(starting: str, query_name: str) -> list[tuple[Any, ...]]:
        query = (
            spark.readStream.format("diffstore")
            .option("url", server_url)
            .option("collection", a)
            .option("startingGeneration", starting)
            .option("readerName", query_name)
            .load()
            .writeStream.format("memory")
            .queryName(query_name)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(WAIT_S)
        assert query.exception() is None
        return sorted(
            tuple(bytes(v) if v is not None else None for v in row)
            for row in spark.table(query_name).collect()
        )

    assert run("earliest", f"earliest_{a}") == [(b"j", None, b"x", second), (b"k", None, b"2", second)]
    assert run("latest", f"latest_{a}") == []


def test_stream_option_errors_are_one_line(spark, server_url, store: Store, names) -> None:
    a = names["A"]
    store.create_collection(a, manual=True)
    reader = spark.readStream.format("diffstore").option("url", server_url).option("collection", a)
    with pytest.raises(Exception) as info:
        reader.option("startingGeneration", "earliest").option("startingGeneraton", "x").load()
    message = str(info.value)
    assert (
        "unknown diffstore stream read option 'startinggeneraton' (did you mean 'startingGeneration'?)"
        in message
    )
    assert "Traceback" not in message
    plain = spark.readStream.format("diffstore").option("url", server_url).option("collection", a).load()
    query = plain.writeStream.format("memory").queryName(f"bad_{a}").start()  # the reader is built here
    with pytest.raises(Exception, match="needs the option startingGeneration"):
        query.awaitTermination(WAIT_S)


def test_batch_generation_is_shared_by_a_batch_and_drops_leftovers() -> None:
    run, other = b"R" * 8, b"O" * 8
    current = (5).to_bytes(8, "big") + b"x" * 16
    g = batch_generation(current, None, 7, run)
    assert g > current and is_batch_generation(g, 7, run) and not is_batch_generation(g, 7, other)
    assert batch_generation(current, g, 7, run) == g  # a sibling task sees it open: the same id
    leftover = batch_generation(current, None, 7, other)  # a dead run's attempt of the same batch
    mine = batch_generation(current, leftover, 7, run)
    assert mine > leftover and is_batch_generation(mine, 7, run)
    assert committed_batch(None) == -1 and committed_batch((3).to_bytes(8, "big")) == 3
