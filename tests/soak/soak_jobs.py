"""What the soak's subprocesses import by name: the ingestion mapper (``soak_jobs:mapper``) and the
transform job (``soak_jobs:join``).

The mapper writes each record's payload under its key (A: key → payload) and a trace row
``rec/<seq mod 100,000>`` → ``<seq>:<pid>:<n>``, unique to each application: a record applied twice shows as
its sequence number in two generations' diffs. The trace keys wrap, so A stays bounded however long the
soak runs; a window never holds 100,000 records, so no two records of one generation share a trace key.

The job keeps C = A's value then B's, for the keys both hold (``docs/spark.md``'s example).
"""

from __future__ import annotations

import itertools
import os
from typing import Any

TRACE_KEYS = 100_000
_applications = itertools.count()


def trace_key(seq: int) -> bytes:
    return b"rec/%05d" % (seq % TRACE_KEYS)


def mapper(record: Any) -> list[tuple[bytes, bytes]]:
    payload = bytes(record.payload)
    token = b"%s:%d:%d" % (payload, os.getpid(), next(_applications))
    return [(record.partition_key.encode(), payload), (trace_key(int(payload)), token)]


def join(spark: Any, diffs: Any, lookup: Any) -> Any:
    from pyspark.sql import functions as F

    changed = diffs["a"].select("key").union(diffs["b"].select("key"))
    # the trace rows are never in B, so never in C: the round skips them
    keys = changed.where(~F.col("key").cast("string").startswith("rec/")).distinct()
    a = lookup("a", keys).withColumnRenamed("value", "a")
    b = lookup("b", keys).withColumnRenamed("value", "b")
    return keys.join(a, "key", "left").join(b, "key", "left").select("key", F.concat("a", "b").alias("value"))


def expected_c(a: dict[bytes, bytes], b: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """C recomputed from A and B (the job's meaning, for the checks)."""
    return {k: a[k] + b[k] for k in a.keys() & b.keys()}
