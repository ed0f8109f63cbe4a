"""The schemas of the ``diffstore`` format's rows, each in Spark's and in Arrow's form.

A snapshot read has ``key``, ``value``; a diff read ``key``, ``fromValue``, ``toValue`` (the streaming
source adds ``generationId``); a lookup answers ``key``, ``value``; a write task answers ``rows``.
Every column is binary except the write count; a null value is an absent key.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

SNAPSHOT_SCHEMA = StructType(
    [StructField("key", BinaryType(), False), StructField("value", BinaryType(), True)]
)
SNAPSHOT_ARROW = pa.schema([pa.field("key", pa.binary(), False), pa.field("value", pa.binary())])

DIFF_SCHEMA = StructType(
    [
        StructField("key", BinaryType(), False),
        StructField("fromValue", BinaryType(), True),
        StructField("toValue", BinaryType(), True),
    ]
)
DIFF_ARROW = pa.schema(
    [
        pa.field("key", pa.binary(), False),
        pa.field("fromValue", pa.binary()),
        pa.field("toValue", pa.binary()),
    ]
)

STREAM_SCHEMA = StructType([*DIFF_SCHEMA.fields, StructField("generationId", BinaryType(), False)])
STREAM_ARROW = pa.schema([*DIFF_ARROW, pa.field("generationId", pa.binary(), False)])

# StructTypes, not DDL strings: a string is parsed by the JVM at every createDataFrame (about 15 ms of a
# small round's lookup under load)
LOOKUP_SCHEMA = StructType([StructField("key", BinaryType(), True), StructField("value", BinaryType(), True)])
LOOKUP_ARROW = pa.schema([pa.field("key", pa.binary()), pa.field("value", pa.binary())])

WRITTEN_SCHEMA = StructType([StructField("rows", LongType(), True)])
WRITTEN_ARROW = pa.schema([pa.field("rows", pa.int64())])
