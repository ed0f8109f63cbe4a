"""Makes ``format("diffstore")`` work in any SparkSession without registering it first.

Spark (4.0+) looks for top-level Python packages named ``pyspark_*`` when a session first resolves a
Python data source, and registers each one's ``DefaultSource`` under its ``name()``. This package is
that hook for :class:`diffstore.spark.datasource.DiffstoreDataSource`; it holds nothing else.
"""

from __future__ import annotations

from diffstore.spark.datasource import DiffstoreDataSource as DefaultSource

__all__ = ["DefaultSource"]
