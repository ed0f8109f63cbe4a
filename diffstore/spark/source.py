"""The ``diffstore`` Python Data Source: snapshots and diffs in, records of an open generation out.

Reading: ``spark.read.format("diffstore").option("url", U).option("collection", "A")`` reads a snapshot
(columns ``key``, ``value``); with ``fromGenerationId`` or ``fromReader`` (+ ``toGenerationId``) it reads a
diff (``key``, ``fromValue``, ``toValue``). The generation range is pinned when Spark builds the reader on
the driver, so every partition reads the same consistent range even while the collection moves on.
Partitions are key ranges cut by ``GET /collections/{c}/splits``; each task pages through its range and
yields Arrow record batches.

Writing: a DataFrame of ``key`` (binary) and ``value`` (binary, null = tombstone) goes into the open
generation ``generationId`` of a manual collection. Tasks send putMany requests in batches. The commit runs
exactly once, in :meth:`DiffstoreWriter.commit`, which Spark calls on the driver only after every task
succeeded; it is one ``generation/commit`` request, and the server applies the commit together with
every reader update (compare-and-set included) in one storage transaction, so C's new records and the
readers that say which inputs produced them become visible together or not at all. If a task or the
commit fails, Spark calls :meth:`DiffstoreWriter.abort`, which aborts the generation (its records are
deleted). Retried or speculative tasks are harmless: a putMany of the same key in the same uncommitted
generation simply overwrites it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, StructField, StructType

from diffstore.errors import DiffstoreError, GenerationMismatch, InvalidRequest, NoSuchReader
from diffstore.spark._prefetch import ahead
from diffstore.spark._wire import WireClient
from diffstore.spark.options import ReadOptions, WriteOptions

SNAPSHOT_SCHEMA = StructType(
    [StructField("key", BinaryType(), False), StructField("value", BinaryType(), True)]
)
DIFF_SCHEMA = StructType(
    [
        StructField("key", BinaryType(), False),
        StructField("fromValue", BinaryType(), True),
        StructField("toValue", BinaryType(), True),
    ]
)
_SNAPSHOT_ARROW = pa.schema([pa.field("key", pa.binary(), False), pa.field("value", pa.binary())])
_DIFF_ARROW = pa.schema(
    [
        pa.field("key", pa.binary(), False),
        pa.field("fromValue", pa.binary()),
        pa.field("toValue", pa.binary()),
    ]
)
_DIFFSTORE_CAUSE = re.compile(r"diffstore\.errors\.(\w+): ([^\n]*)")
_SPARK_CAUSE = re.compile(r"(\[[A-Z_.]+\][^\n]*)")
# putMany bodies are capped at 32 MiB by the server; flush well before.
_MAX_BATCH_BYTES = 16 << 20


def register(spark: SparkSession) -> None:
    """Registers the ``diffstore`` format with a session (workers must be able to import diffstore)."""
    spark.dataSource.register(DiffstoreDataSource)


@dataclass(frozen=True)
class KeyRange(InputPartition):
    """One partition: keys in ``[from_key, to_key)``; ``None`` means unbounded."""

    from_key: bytes | None
    to_key: bytes | None


@dataclass(frozen=True, slots=True)
class PinnedRange:
    """The generations a read is pinned to (``from_generation_id`` only for diffs; None = beginning)."""

    is_diff: bool
    from_generation_id: bytes | None
    to_generation_id: bytes


def pin(client: WireClient, options: ReadOptions) -> PinnedRange:
    """Resolves the generations a read will use: explicit ones, else the reader's and the current one."""
    collection = options.connection.collection
    if not options.is_diff:
        generation = options.generation_id or client.state(collection).generation_id
        return PinnedRange(False, None, generation)
    from_generation = options.from_generation_id
    if options.from_reader is not None:
        owner = options.from_reader_collection or collection
        found = [r for r in client.readers(owner) if r.name == options.from_reader]
        if not found:
            raise NoSuchReader(f"no reader {options.from_reader!r} in collection {owner!r}")
        from_generation = found[0].generation_id
    to_generation = options.to_generation_id or client.state(collection).generation_id
    return PinnedRange(True, from_generation, to_generation)


def key_ranges(client: WireClient, collection: str, count: int, generation_id: bytes) -> list[KeyRange]:
    """Cuts a collection into up to ``count`` key ranges with the server's ``/splits``."""
    if count < 2:
        return [KeyRange(None, None)]
    cuts: list[bytes | None] = [None, *client.splits(collection, count, generation_id), None]
    return [KeyRange(cuts[i], cuts[i + 1]) for i in range(len(cuts) - 1)]


def read_snapshot(
    client: WireClient, collection: str, generation_id: bytes, part: KeyRange, limit: int
) -> Iterator[pa.RecordBatch]:
    """Yields the records of one key range at ``generation_id``, one Arrow batch per page."""
    page = client.query_page(collection, generation_id, part.from_key, part.to_key, limit)
    while True:
        if page.items:
            keys, values = zip(*page.items, strict=True)
            yield pa.RecordBatch.from_arrays(
                [pa.array(keys, pa.binary()), pa.array(values, pa.binary())], schema=_SNAPSHOT_ARROW
            )
        if page.cursor is None:
            return
        page = client.query_page(collection, cursor=page.cursor)


def _diff_batch(rows: list[tuple[bytes, bytes | None, bytes | None]]) -> pa.RecordBatch:
    keys, from_values, to_values = zip(*rows, strict=True)
    arrays = [
        pa.array(keys, pa.binary()),
        pa.array(from_values, pa.binary()),
        pa.array(to_values, pa.binary()),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=_DIFF_ARROW)


def read_diff(
    client: WireClient, collection: str, pinned: PinnedRange, part: KeyRange, limit: int
) -> Iterator[pa.RecordBatch]:
    """Yields the changes of one key range between the pinned generations, one Arrow batch per page.

    The server may answer a lower ``toGenerationId`` than asked (a huge range); the remaining steps are
    then read too and merged per key (first ``fromValue``, last ``toValue``), which holds this range's
    changed keys in memory only in that rare case.
    """
    target = pinned.to_generation_id
    page = client.diff_page(collection, pinned.from_generation_id, target, part.from_key, part.to_key, limit)
    if page.to_generation_id == target:
        while True:
            if page.items:
                yield _diff_batch(page.items)
            if page.cursor is None:
                return
            page = client.diff_page(collection, None, cursor=page.cursor)
    merged: dict[bytes, list[bytes | None]] = {}
    while True:
        for key, from_value, to_value in page.items:
            entry = merged.setdefault(key, [from_value, to_value])
            entry[1] = to_value
        if page.cursor is not None:
            page = client.diff_page(collection, None, cursor=page.cursor)
            continue
        if page.to_generation_id == target or page.from_generation_id == page.to_generation_id:
            break
        step_from = page.to_generation_id
        page = client.diff_page(collection, step_from, target, part.from_key, part.to_key, limit)
    rows = [(key, f, t) for key, (f, t) in sorted(merged.items()) if f != t]
    for start in range(0, len(rows), limit):
        yield _diff_batch(rows[start : start + limit])


class DiffstoreReader(DataSourceReader):
    """Built on the driver: pins the generation range and cuts the key ranges once per scan."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        connection = options.connection
        with WireClient(connection.url, connection.codec) as client:
            self.pinned = pin(client, options)
            self.ranges = key_ranges(
                client, connection.collection, options.partitions, self.pinned.to_generation_id
            )

    def partitions(self) -> list[InputPartition]:
        return list(self.ranges)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        part = partition if isinstance(partition, KeyRange) else KeyRange(None, None)
        connection = self.options.connection
        limit = self.options.page_limit
        with WireClient(connection.url, connection.codec) as client:
            if self.pinned.is_diff:
                pages = read_diff(client, connection.collection, self.pinned, part, limit)
            else:
                pages = read_snapshot(
                    client, connection.collection, self.pinned.to_generation_id, part, limit
                )
            # the next page is fetched while Spark consumes this one
            yield from ahead(pages)


@dataclass
class WrittenBatch(WriterCommitMessage):
    """What one task wrote: rows and putMany requests."""

    rows: int
    requests: int


def put_batches(client: WireClient, options: WriteOptions, batches: Iterator[pa.RecordBatch]) -> WrittenBatch:
    """Sends ``(key, value)`` Arrow batches as putMany requests of bounded size; returns the counts."""
    rows = requests = 0
    pending: list[tuple[bytes, bytes | None]] = []
    pending_bytes = 0
    collection, generation = options.connection.collection, options.generation_id
    for batch in batches:
        keys = batch.column("key").to_pylist()
        values = batch.column("value").to_pylist()
        for key, value in zip(keys, values, strict=True):
            if key is None:
                raise InvalidRequest("a diffstore key must not be null")
            pending.append((key, value))
            pending_bytes += len(key) + (len(value) if value is not None else 0) + 16
            if len(pending) >= options.batch_rows or pending_bytes >= _MAX_BATCH_BYTES:
                client.put_many(collection, pending, generation)
                rows, requests, pending, pending_bytes = rows + len(pending), requests + 1, [], 0
    if pending:
        client.put_many(collection, pending, generation)
        rows, requests = rows + len(pending), requests + 1
    return WrittenBatch(rows, requests)


class DiffstoreWriter(DataSourceArrowWriter):
    """Tasks write into the open generation; the driver commits once (see the module docstring)."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WrittenBatch:
        connection = self.options.connection
        with WireClient(connection.url, connection.codec) as client:
            return put_batches(client, self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if not self.options.commit:
            return
        connection = self.options.connection
        with WireClient(connection.url, connection.codec) as client:
            client.commit_generation(
                connection.collection, self.options.generation_id, self.options.update_readers
            )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if not self.options.abort_on_failure:
            return
        connection = self.options.connection
        with WireClient(connection.url, connection.codec) as client:
            try:
                client.abort_generation(connection.collection, self.options.generation_id)
            except GenerationMismatch:
                pass  # already aborted, or another writer took the generation over: nothing of ours is left


class DiffstoreDataSource(DataSource):
    """The ``diffstore`` format. Options are validated here, on construction, before any task runs."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.options = dict(options)
        self.read_options: ReadOptions | None = None
        self.write_options: WriteOptions | None = None

    @classmethod
    def name(cls) -> str:
        return "diffstore"

    def schema(self) -> StructType:
        return DIFF_SCHEMA if ReadOptions.parse(self.options).is_diff else SNAPSHOT_SCHEMA

    def reader(self, schema: StructType) -> DiffstoreReader:
        return DiffstoreReader(ReadOptions.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DiffstoreWriter:
        if overwrite:
            raise InvalidRequest("the diffstore format only appends into an open generation (mode append)")
        names = {field.name: field.dataType for field in schema.fields}
        if not isinstance(names.get("key"), BinaryType) or not isinstance(names.get("value"), BinaryType):
            raise InvalidRequest(f"writing needs binary columns key and value, got {schema.simpleString()}")
        return DiffstoreWriter(WriteOptions.parse(self.options))


def describe_failure(exc: BaseException) -> str:
    """A short description of a failed Spark job or HTTP call, for logs and stats."""
    if isinstance(exc, DiffstoreError):
        return f"{type(exc).__name__}: {exc.reason}"
    text = str(exc)
    # a task's error travels inside the Java exception's text: prefer a diffstore error, then Spark's class
    found = _DIFFSTORE_CAUSE.findall(text)
    if found:
        return f"{found[-1][0]}: {found[-1][1].strip()}"[:300]
    spark_cause = _SPARK_CAUSE.search(text)
    if spark_cause:
        return f"{type(exc).__name__}: {spark_cause.group(1)}"[:300]
    lines = text.strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


__all__: list[Any] = [
    "DIFF_SCHEMA",
    "SNAPSHOT_SCHEMA",
    "DiffstoreDataSource",
    "DiffstoreReader",
    "DiffstoreWriter",
    "KeyRange",
    "register",
]
