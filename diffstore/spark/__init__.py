"""Spark front of diffstore: the ``diffstore`` data source and the exactly-once transform runner.

pyspark is an optional extra, so nothing here imports it until a Spark name is used: ``import
diffstore.spark`` (and ``diffstore.spark.cli``, which the ``diffstore`` command loads) works without it.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "DiffstoreDataSource": "diffstore.spark.datasource",
    "PreviewTooLarge": "diffstore.spark.preview",
    "RoundStats": "diffstore.spark.transform",
    "TARGET": "diffstore.spark.plan",
    "Transform": "diffstore.spark.transform",
    "TransformError": "diffstore.spark.transform",
    "connect_session": "diffstore.spark.session",
    "local_session": "diffstore.spark.session",
    "master_session": "diffstore.spark.session",
    "register": "diffstore.spark.datasource",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'diffstore.spark' has no attribute {name!r}")
    from diffstore.spark.session import require_pyspark

    require_pyspark(f"diffstore.spark.{name}")  # one line naming the extra, not "No module named 'pyspark'"
    return getattr(importlib.import_module(module), name)
