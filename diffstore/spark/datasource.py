"""The ``diffstore`` format itself: the Python Data Source that Spark resolves ``format("diffstore")`` to.

It validates options on the driver and hands out the readers and writers of :mod:`diffstore.spark.source`
(batch) and :mod:`diffstore.spark.streaming` (Structured Streaming); see those modules for what a read
and a write do. ``pyspark_diffstore`` registers it in every session; :func:`register` does it by hand.
"""

from __future__ import annotations

import os

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, DataSourceStreamWriter
from pyspark.sql.types import StructType

from diffstore.errors import GenerationMismatch, InvalidRequest
from diffstore.spark._clients import new_for
from diffstore.spark.options import SparkReadOptions, SparkStreamReadOptions, SparkWriteOptions
from diffstore.spark.schemas import DIFF_SCHEMA, SNAPSHOT_SCHEMA, STREAM_SCHEMA
from diffstore.spark.source import DiffstoreReader, DiffstoreWriter, check_writable
from diffstore.spark.streaming import DiffstoreStreamReader, stream_writer


def register(spark: SparkSession) -> None:
    """Registers the ``diffstore`` format with a session (workers must be able to import diffstore)."""
    spark.dataSource.register(DiffstoreDataSource)


class DiffstoreDataSource(DataSource):
    """The ``diffstore`` format. Options are validated here, on construction, before any task runs."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.options = dict(options)
        self.read_options: SparkReadOptions | None = None
        self.write_options: SparkWriteOptions | None = None
        # Drawn when the source is resolved; the sink's tasks of one run share it (see spark.streaming).
        self.run_tag = os.urandom(8)

    @classmethod
    def name(cls) -> str:
        return "diffstore"

    def schema(self) -> StructType:
        # Spark asks for the schema before telling a stream read from a batch read: a stream read is
        # recognised by its stream-only option startingGeneration.
        if any(key.lower() == "startinggeneration" for key in self.options):
            SparkStreamReadOptions.parse(self.options)  # bad options fail load(), not the query's start
            return STREAM_SCHEMA
        return DIFF_SCHEMA if SparkReadOptions.parse(self.options).is_diff else SNAPSHOT_SCHEMA

    def reader(self, schema: StructType) -> DiffstoreReader:
        return DiffstoreReader(SparkReadOptions.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DiffstoreWriter:
        if overwrite:
            raise InvalidRequest("the diffstore format only appends into an open generation (mode append)")
        check_writable(schema)
        options = SparkWriteOptions.parse(self.options)
        connection = options.connection
        # Checked here, on the driver, so that a wrong generation fails as one line before any task runs.
        with new_for(connection) as client:
            state = client.collection(connection.collection).state()
        if state.next_generation_id != options.generation_id:
            raise GenerationMismatch(
                f"generation {options.generation_id!r} is not open in {connection.collection!r} "
                f"(open: {state.next_generation_id!r})"
            )
        return DiffstoreWriter(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if schema != STREAM_SCHEMA:
            raise InvalidRequest(
                "a diffstore stream read needs the option startingGeneration (earliest, latest or an id)"
            )
        return DiffstoreStreamReader(SparkStreamReadOptions.parse(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        if overwrite:
            raise InvalidRequest("the diffstore sink appends (outputMode append or update)")
        return stream_writer(self.options, schema, self.run_tag)


__all__ = ["DiffstoreDataSource", "register"]
