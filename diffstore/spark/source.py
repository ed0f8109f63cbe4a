"""The ``diffstore`` format's batch reads and writes: snapshots and diffs in, records of an open generation
out (the format itself, which hands these out, is :mod:`diffstore.spark.datasource`).

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
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, StructType

from diffstore.client import Client, Collection, DiffColumns
from diffstore.engine.types import UNSET, LeaseToken, ReaderUpdate
from diffstore.errors import DiffstoreError, GenerationMismatch, InvalidRequest, LeaseLost, NoSuchReader
from diffstore.spark._clients import new_for, shared_client, shared_for
from diffstore.spark._prefetch import ahead
from diffstore.spark.arrow_columns import binary_batch
from diffstore.spark.options import DEFAULT_BATCH_ROWS, SparkReadOptions, SparkWriteOptions
from diffstore.spark.schemas import (
    DIFF_ARROW,
    DIFF_SCHEMA,
    SNAPSHOT_ARROW,
    SNAPSHOT_SCHEMA,
    WRITTEN_ARROW,
)
from diffstore.tls import ShippedTls

_DIFFSTORE_CAUSE = re.compile(r"diffstore\.errors\.(\w+): ([^\n]*)")
_SPARK_CAUSE = re.compile(r"(\[[A-Z_.]+\][^\n]*)")
_NOT_IMPORTABLE = re.compile(r"No module named '((?:pyspark_)?diffstore[\w.]*)'")
# putMany bodies are capped at 32 MiB by the server; flush well before.
_MAX_BATCH_BYTES = 16 << 20


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


def pin(client: Client, options: SparkReadOptions) -> PinnedRange:
    """Resolves the generations a read will use: explicit ones, else the reader's and the current one."""
    collection = client.collection(options.connection.collection)
    if not options.is_diff:
        generation = options.generation_id or collection.generation_id
        return PinnedRange(False, None, generation)
    from_generation = options.from_generation_id
    if options.from_reader is not None:
        owner = options.from_reader_collection or collection.name
        found = [r for r in client.collection(owner).readers() if r.name == options.from_reader]
        if not found:
            raise NoSuchReader(f"no reader {options.from_reader!r} in collection {owner!r}")
        from_generation = found[0].generation_id
    to_generation = options.to_generation_id or collection.generation_id
    return PinnedRange(True, from_generation, to_generation)


def ranges_of(cuts: list[bytes]) -> list[KeyRange]:
    """The key ranges that ascending ``cuts`` make: ``[None, c1), [c1, c2) ... [cN, None)``."""
    bounds: list[bytes | None] = [None, *cuts, None]
    return [KeyRange(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]


def key_ranges(client: Client, collection: str, count: int, pinned: PinnedRange) -> list[KeyRange]:
    """Up to ``count`` key ranges with the server's ``/splits``: of the keys visible at the pinned
    generation for a snapshot, of the keys changed in the pinned range for a diff (cutting those costs what
    the diff does, not what the collection holds)."""
    if count < 2:
        return [KeyRange(None, None)]
    handle = client.collection(collection)
    if pinned.is_diff:
        from_generation_id = pinned.from_generation_id or b""
        return ranges_of(handle.splits(count, pinned.to_generation_id, from_generation_id=from_generation_id))
    return ranges_of(handle.splits(count, pinned.to_generation_id))


def read_snapshot(
    collection: Collection, generation_id: bytes, part: KeyRange, limit: int
) -> Iterator[pa.RecordBatch]:
    """Yields the records of one key range at ``generation_id``, one Arrow batch per page."""
    page = collection.query_page_columns(generation_id, None, part.from_key, part.to_key, limit)
    while True:
        if page.keys:
            yield binary_batch(SNAPSHOT_ARROW, page.keys, page.values)
        if page.cursor is None:
            return
        page = collection.query_page_columns(cursor=page.cursor)


def read_diff(
    collection: Collection, pinned: PinnedRange, part: KeyRange, limit: int
) -> Iterator[pa.RecordBatch]:
    """Yields the changes of one key range between the pinned generations, one Arrow batch per page.

    The server may answer a lower ``toGenerationId`` than asked (a huge range); the remaining steps are
    then read too and merged per key (first ``fromValue``, last ``toValue``), which holds this range's
    changed keys in memory only in that rare case.
    """
    target = pinned.to_generation_id

    def first_page(start: bytes | None) -> DiffColumns:
        return collection.diff_page_columns(
            start or b"", target, from_key=part.from_key, to_key=part.to_key, limit=limit
        )

    page = first_page(pinned.from_generation_id)
    if page.to_generation_id == target:
        while True:
            if page.keys:
                yield binary_batch(DIFF_ARROW, page.keys, page.from_values, page.to_values)
            if page.cursor is None:
                return
            page = collection.diff_page_columns(cursor=page.cursor)
    merged: dict[bytes, list[bytes | None]] = {}
    while True:
        keys = cast(list[bytes], page.keys.to_list())  # keys are never absent
        for key, from_value, to_value in zip(keys, page.from_values, page.to_values, strict=True):
            entry = merged.setdefault(key, [from_value, to_value])
            entry[1] = to_value
        if page.cursor is not None:
            page = collection.diff_page_columns(cursor=page.cursor)
            continue
        if page.to_generation_id == target or page.from_generation_id == page.to_generation_id:
            break
        page = first_page(page.to_generation_id)
    rows = [(key, f, t) for key, (f, t) in sorted(merged.items()) if f != t]
    for start in range(0, len(rows), limit):
        columns = zip(*rows[start : start + limit], strict=True)
        yield pa.RecordBatch.from_arrays([pa.array(c, pa.binary()) for c in columns], schema=DIFF_ARROW)


class DiffstoreReader(DataSourceReader):
    """Built on the driver: pins the generation range and cuts the key ranges once per scan."""

    def __init__(self, options: SparkReadOptions) -> None:
        self.options = options
        connection = options.connection
        with new_for(connection) as client:
            self.pinned = pin(client, options)
            if options.split_keys is not None:
                self.ranges = ranges_of(list(options.split_keys))
            else:
                self.ranges = key_ranges(client, connection.collection, options.partitions, self.pinned)

    def partitions(self) -> list[InputPartition]:
        return list(self.ranges)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        part = partition if isinstance(partition, KeyRange) else KeyRange(None, None)
        connection = self.options.connection
        limit = self.options.page_limit
        collection = shared_for(connection).collection(connection.collection)
        if self.pinned.is_diff:
            pages = read_diff(collection, self.pinned, part, limit)
        else:
            pages = read_snapshot(collection, self.pinned.to_generation_id, part, limit)
        # the next page is fetched while Spark consumes this one
        yield from ahead(pages)


@dataclass
class WrittenBatch(WriterCommitMessage):
    """What one task wrote: rows and putMany requests."""

    rows: int
    requests: int


def put_batches(
    collection: Collection,
    generation_id: bytes,
    batch_rows: int,
    batches: Iterator[pa.RecordBatch],
    lease: LeaseToken | None = None,
) -> WrittenBatch:
    """Sends ``(key, value)`` Arrow batches as putMany requests of bounded size (fenced by ``lease``, the
    token the generation was started under, if any); returns the counts."""
    rows = requests = 0
    pending: list[tuple[bytes, bytes | None]] = []
    pending_bytes = 0
    for batch in batches:
        keys = batch.column("key").to_pylist()
        values = batch.column("value").to_pylist()
        for key, value in zip(keys, values, strict=True):
            if key is None:
                raise InvalidRequest("a diffstore key must not be null")
            pending.append((key, value))
            pending_bytes += len(key) + (len(value) if value is not None else 0) + 16
            if len(pending) >= batch_rows or pending_bytes >= _MAX_BATCH_BYTES:
                collection.put_many(pending, generation_id=generation_id, lease=lease)
                rows, requests, pending, pending_bytes = rows + len(pending), requests + 1, [], 0
    if pending:
        collection.put_many(pending, generation_id=generation_id, lease=lease)
        rows, requests = rows + len(pending), requests + 1
    return WrittenBatch(rows, requests)


def put_partition(
    url: str,
    codec: str,
    collection: str,
    generation_id: bytes,
    token: str | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    lease: LeaseToken | None = None,
    tls: ShippedTls | None = None,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function that puts a partition's ``key``, ``value`` rows into the open generation
    ``generation_id`` (fenced by ``lease``, the token it was started under, if any) and answers one row:
    how many it put (:data:`WRITTEN_SCHEMA`)."""

    def put(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        target = shared_client(url, codec, token, tls).collection(collection)
        written = put_batches(target, generation_id, batch_rows, batches, lease)
        yield pa.RecordBatch.from_arrays([pa.array([written.rows], pa.int64())], schema=WRITTEN_ARROW)

    return put


def check_writable(schema: StructType) -> None:
    """Raises :class:`InvalidRequest` unless ``schema`` has binary columns ``key`` and ``value``."""
    names = {field.name: field.dataType for field in schema.fields}
    if not isinstance(names.get("key"), BinaryType) or not isinstance(names.get("value"), BinaryType):
        raise InvalidRequest(f"writing needs binary columns key and value, got {schema.simpleString()}")


def reader_updates(entries: Iterable[Mapping[str, Any]]) -> list[ReaderUpdate]:
    """``{"readerName", "generationId", "expectedGenerationId"?}`` entries as the client's updates
    (an absent ``expectedGenerationId`` means no compare-and-set)."""
    return [
        ReaderUpdate(entry["readerName"], entry["generationId"], entry.get("expectedGenerationId", UNSET))
        for entry in entries
    ]


class DiffstoreWriter(DataSourceArrowWriter):
    """Tasks write into the open generation; the driver commits once (see the module docstring)."""

    def __init__(self, options: SparkWriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WrittenBatch:
        connection, options = self.options.connection, self.options
        collection = shared_for(connection).collection(connection.collection)
        return put_batches(collection, options.generation_id, options.batch_rows, iterator, options.lease)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if not self.options.commit:
            return
        connection = self.options.connection
        with new_for(connection) as client:
            client.collection(connection.collection).commit_generation(
                self.options.generation_id, reader_updates(self.options.update_readers), self.options.lease
            )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if not self.options.abort_on_failure:
            return
        connection = self.options.connection
        with new_for(connection) as client:
            try:
                client.collection(connection.collection).abort_generation(
                    self.options.generation_id, self.options.lease
                )
            except (GenerationMismatch, LeaseLost):
                pass  # already aborted, or another writer took the generation over: nothing of ours is left


def describe_failure(exc: BaseException) -> str:
    """A short description of a failed Spark job or HTTP call, for logs and stats."""
    if isinstance(exc, DiffstoreError):
        return f"{type(exc).__name__}: {exc.reason}"
    text = str(exc)
    missing = _NOT_IMPORTABLE.search(text)
    if missing:  # the data source or a task's function was unpickled where diffstore is not installed
        return (
            f"{type(exc).__name__}: Spark's Python workers cannot import {missing.group(1)}: "
            "install diffstore where the executors run (pip install 'diffstore[spark]', or ship an "
            "environment with spark.archives) and point spark.pyspark.python (PYSPARK_PYTHON) at that "
            "interpreter"
        )
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
    "DiffstoreReader",
    "DiffstoreWriter",
    "KeyRange",
]
