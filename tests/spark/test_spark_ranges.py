"""Routing keys to partitions by key range: the labels land where Spark's hash partitioning puts them."""

from __future__ import annotations

from pyspark.sql import functions as F

from diffstore.spark._ranges import by_key_range, murmur3_int, partition_labels


def test_murmur3_is_sparks_hash_of_an_int(spark) -> None:  # type: ignore[no-untyped-def]
    values = [-(2**31), -1000, -1, 0, 1, 2, 42, 12345, 2**31 - 1]
    frame = spark.createDataFrame([(v,) for v in values], "v int")
    assert {row.v: row.h for row in frame.select("v", F.hash("v").alias("h")).collect()} == {
        v: murmur3_int(v) for v in values
    }


def test_each_partition_holds_one_key_range(spark) -> None:  # type: ignore[no-untyped-def]
    keys = [b"user%06d" % i for i in range(0, 3000, 7)] + [b"", b"\xff\xff"]
    frame = spark.createDataFrame([(k,) for k in keys], "key binary")
    cuts = [b"user000700", b"user001400", b"user002100"]
    parts = (
        by_key_range(frame, "key", cuts).rdd.glom().map(lambda rows: sorted(r.key for r in rows)).collect()
    )
    bounds = [None, *cuts, None]
    assert len(parts) == 4 and sorted(k for part in parts for k in part) == sorted(keys)
    for i, part in enumerate(parts):
        low, high = bounds[i], bounds[i + 1]
        assert part and all((low is None or k >= low) and (high is None or k < high) for k in part)
    assert by_key_range(frame, "key", []).rdd.getNumPartitions() == 1


def test_labels_cover_every_partition() -> None:
    for count in (1, 2, 3, 4, 16, 64):
        labels = partition_labels(count)
        assert [murmur3_int(label) % count for label in labels] == list(range(count))
