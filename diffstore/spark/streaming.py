"""Structured Streaming on diffstore: a source of a collection's changes and an exactly-once sink.

Source — ``spark.readStream.format("diffstore").option("url", U).option("collection", "A").load()``:

- An offset is a committed generation of A (``{"generationId": base64}``). Each micro-batch is the diff
  of A over (previous offset, new offset]: columns ``key``, ``fromValue``, ``toValue`` and
  ``generationId`` (the batch's end generation, where ``toValue`` holds). A key changed several times
  inside one batch appears once, with its first ``fromValue`` and last ``toValue``.
- ``startingGeneration``: ``earliest`` (the default: everything, from before the first generation),
  ``latest`` (changes committed after the query starts) or a generation id (UTF-8, or base64 with
  ``generationIdEncoding=base64``). A query restarted from its checkpoint resumes at its checkpointed
  offset instead.
- GC: the source keeps a reader ``readerName`` (default ``spark_stream``) in A, created at the starting
  generation and moved to an offset when Spark commits it, so A's GC never collects what the query has
  yet to read. Spark does not reliably call ``commit`` for the last batch before a query stops, so the
  reader may stay one batch behind: GC holds back a little more, never less. Give each query over the same
  collection its own ``readerName``; delete the reader when the query is retired.

Sink — ``df.writeStream.format("diffstore").option("url", U).option("collection", "C")
.option("checkpointLocation", P).start()``:

- C is a manual collection; rows are ``key`` and ``value`` (binary; a null value deletes the key). Each
  micro-batch becomes one generation of C, committed once.
- Exactly once: the commit of a batch's generation also moves a reader ``readerName`` (default
  ``spark_sink``) of C, whose 8-byte generation is the batch id, in the same storage transaction. A batch
  replayed after a failure (Spark replays the last uncommitted batch on restart) is recognised by that
  reader: its tasks write nothing and its commit changes nothing. The reader's target is
  ``spark-sink://<readerName>``, not a collection, so GC ignores it.
- Tasks learn their batch id from Spark's task-local property ``streaming.sql.batchId``. The batch's
  generation id is ``counter + batchId (8 bytes) + run tag (8 bytes)``: every task of one batch computes
  the same id (C does not move while a batch runs, and the tasks share the writer and its run tag) and
  the first to have rows starts it; the run tag tells a dead run's leftover of the same batch, which is
  aborted, from this run's. Tasks report the generation to the driver's ``commit`` in their messages.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow
from pyspark.sql.types import BinaryType, StructType

from diffstore.client import Client, Collection
from diffstore.engine.types import ReaderUpdate
from diffstore.errors import InvalidRequest, NotManual, ReaderExists
from diffstore.rounds import ensure_readers, next_generation_id
from diffstore.spark._clients import new_for, shared_for
from diffstore.spark.options import SparkStreamReadOptions, SparkStreamWriteOptions
from diffstore.spark.schemas import STREAM_ARROW, STREAM_SCHEMA
from diffstore.spark.source import KeyRange, PinnedRange, put_batches, read_diff

BATCH_ID_PROPERTY = "streaming.sql.batchId"
_BATCH_BYTES = 8
_RUN_TAG_BYTES = 8


# -- offsets and options (pure) -----------------------------------------------------------------------------


def to_offset(generation_id: bytes) -> dict[str, str]:
    """A generation id as a Spark offset (a JSON-able dict)."""
    return {"generationId": base64.b64encode(generation_id).decode("ascii")}


def from_offset(offset: dict[str, Any]) -> bytes:
    """Inverse of :func:`to_offset`."""
    return base64.b64decode(offset["generationId"])


def batch_generation(current: bytes, open_generation: bytes | None, batch_id: int, run_tag: bytes) -> bytes:
    """The generation of micro-batch ``batch_id`` of the run ``run_tag``, given C's state.

    ``open_generation`` is C's open generation unless it already is this batch's (then it is returned):
    the id sorts above both ``current`` and a leftover open generation, so starting it with
    ``abortOutdated`` drops the leftover.
    """
    if open_generation is not None and is_batch_generation(open_generation, batch_id, run_tag):
        return open_generation
    return next_generation_id(current, open_generation, batch_tag(batch_id) + run_tag)


def batch_tag(batch_id: int) -> bytes:
    return batch_id.to_bytes(_BATCH_BYTES, "big")


def is_batch_generation(generation_id: bytes, batch_id: int, run_tag: bytes | None = None) -> bool:
    """Whether ``generation_id`` is one of micro-batch ``batch_id`` (of the run ``run_tag``, when given)."""
    if len(generation_id) != 8 + _BATCH_BYTES + _RUN_TAG_BYTES or generation_id[8:16] != batch_tag(batch_id):
        return False
    return run_tag is None or generation_id[16:] == run_tag


def committed_batch(marker: bytes | None) -> int:
    """The last batch id a sink reader records (-1: none yet)."""
    if not marker:
        return -1
    return int.from_bytes(marker, "big")


# -- source -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GenerationRange(InputPartition):
    """One micro-batch's changes over ``(from_generation_id, to_generation_id]`` in ``[from_key, to_key)``."""

    from_generation_id: bytes
    to_generation_id: bytes
    keys: KeyRange


class DiffstoreStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Lives in one Python process on the driver for the whole query; ``read`` runs on executors."""

    def __init__(self, options: SparkStreamReadOptions) -> None:
        self.options = options
        self._target: bytes | None = None  # availableNow: never read past the generation current at start
        with self._client() as client:
            collection = client.collection(options.connection.collection)
            current = collection.generation_id
            if options.starting == "earliest":
                start = b""
            elif options.starting == "latest":
                start = current
            else:
                start = options.starting  # type: ignore[assignment]
                if start > current:
                    raise InvalidRequest(
                        f"startingGeneration {start!r} is above the current generation {current!r}"
                    )
            self._start = start
            try:
                collection.create_reader(options.reader_name, None, start or None)
            except ReaderExists:
                pass  # a restarted query: the reader is where the last committed offset left it

    def _client(self) -> Client:
        connection = self.options.connection
        return new_for(connection)

    def initialOffset(self) -> dict[str, str]:
        return to_offset(self._start)

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, str]:
        with self._client() as client:
            current = client.collection(self.options.connection.collection).generation_id
        if self._target is not None and current > self._target:
            current = self._target
        return to_offset(current)

    def prepareForTriggerAvailableNow(self) -> None:
        with self._client() as client:
            self._target = client.collection(self.options.connection.collection).generation_id

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        first, last = from_offset(start), from_offset(end)
        if first >= last:
            return []
        return [GenerationRange(first, last, KeyRange(None, None))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, GenerationRange)
        connection = self.options.connection
        collection = shared_for(connection).collection(connection.collection)
        pinned = PinnedRange(True, partition.from_generation_id, partition.to_generation_id)
        for batch in read_diff(collection, pinned, partition.keys, self.options.page_limit):
            generation = pa.array([partition.to_generation_id] * batch.num_rows, pa.binary())
            yield pa.RecordBatch.from_arrays([*batch.columns, generation], schema=STREAM_ARROW)

    def commit(self, end: dict[str, Any]) -> None:
        """Moves the GC-holding reader to ``end`` (everything up to it has been processed)."""
        with self._client() as client:
            client.collection(self.options.connection.collection).update_reader(
                self.options.reader_name, from_offset(end) or None
            )


# -- sink -------------------------------------------------------------------------------------------------


@dataclass
class SinkBatch(WriterCommitMessage):
    """What one task of a micro-batch wrote, and into which generation (``None``: it had no rows, or the
    batch had been committed before)."""

    rows: int
    requests: int
    generation_id: bytes | None = None


class DiffstoreStreamWriter(DataSourceStreamArrowWriter):
    """Tasks put into the batch's generation; the driver commits it with the batch-id reader."""

    def __init__(self, options: SparkStreamWriteOptions, run_tag: bytes) -> None:
        self.options = options
        self.run_tag = run_tag

    @property
    def marker_name(self) -> str:
        return f"spark/{self.options.reader_name}"

    def _collection(self, client: Client) -> Collection:
        return client.collection(self.options.connection.collection)

    def _marker(self, collection: Collection) -> bytes | None:
        target = f"spark-sink://{self.options.reader_name}"
        return ensure_readers(collection, {self.marker_name: target})[self.marker_name].generation_id

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkBatch:
        context = TaskContext.get()
        batch_text = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
        if batch_text is None:
            raise InvalidRequest("the diffstore sink runs in streaming queries only (no batch id)")
        batch_id = int(batch_text)
        connection = self.options.connection
        collection = self._collection(shared_for(connection))
        first = next(iterator, None)
        if first is None:
            return SinkBatch(0, 0)
        if committed_batch(self._marker(collection)) >= batch_id:
            return SinkBatch(0, 0)  # a replay of a committed batch: apply nothing twice
        state = collection.state()
        generation = batch_generation(
            state.generation_id or b"", state.next_generation_id, batch_id, self.run_tag
        )
        collection.start_generation(generation, abort_outdated=True)

        def batches() -> Iterator[pa.RecordBatch]:
            yield first
            yield from iterator

        written = put_batches(collection, generation, self.options.batch_rows, batches())
        return SinkBatch(written.rows, written.requests, generation)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        with new_for(self.options.connection) as client:
            collection = self._collection(client)
            marker = self._marker(collection)
            state = collection.state()
            if committed_batch(marker) >= batchId:
                self._abort_batch(collection, state.next_generation_id, batchId)
                return
            # The tasks report the generation they wrote into (the commit runs in a process of its own,
            # with a writer whose run tag is not theirs).
            written = {m.generation_id for m in messages if isinstance(m, SinkBatch) and m.generation_id}
            if len(written) > 1:
                raise InvalidRequest(f"the tasks of batch {batchId} wrote into {len(written)} generations")
            if written:
                generation = written.pop()
            else:  # no task had rows: the batch still commits one (empty) generation with its batch id
                generation = batch_generation(
                    state.generation_id or b"", state.next_generation_id, batchId, self.run_tag
                )
                collection.start_generation(generation, abort_outdated=True)
            collection.commit_generation(
                generation, [ReaderUpdate(self.marker_name, batch_tag(batchId), marker)]
            )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        with new_for(self.options.connection) as client:
            collection = self._collection(client)
            self._abort_batch(collection, collection.state().next_generation_id, batchId)

    def _abort_batch(self, collection: Collection, open_generation: bytes | None, batch_id: int) -> None:
        """Aborts the open generation if it is one of ``batch_id`` (of this run or a dead one's)."""
        if open_generation is not None and is_batch_generation(open_generation, batch_id):
            collection.abort_generation(open_generation)


def stream_writer(options: Mapping[str, str], schema: StructType, run_tag: bytes) -> DiffstoreStreamWriter:
    """Validates the sink's options and input schema and checks on the driver that C is manual."""
    parsed = SparkStreamWriteOptions.parse(options)
    names = {field.name: field.dataType for field in schema.fields}
    if not isinstance(names.get("key"), BinaryType) or not isinstance(names.get("value"), BinaryType):
        raise InvalidRequest(
            f"the diffstore sink needs binary columns key and value, got {schema.simpleString()}"
        )
    connection = parsed.connection
    with new_for(connection) as client:
        if not client.collection(connection.collection).state().manual:
            raise NotManual(
                f"the diffstore sink writes into a manual collection; {connection.collection!r} is not"
            )
    return DiffstoreStreamWriter(parsed, run_tag)


def new_run_tag() -> bytes:
    """The tag of one query run (drawn when the data source is resolved, i.e. when a query starts)."""
    return os.urandom(_RUN_TAG_BYTES)


__all__ = [
    "STREAM_SCHEMA",
    "DiffstoreStreamReader",
    "DiffstoreStreamWriter",
    "SparkStreamReadOptions",
    "SparkStreamWriteOptions",
    "batch_generation",
    "committed_batch",
    "from_offset",
    "to_offset",
]
