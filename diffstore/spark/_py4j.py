"""PySpark's private py4j handles, used in this one module and nowhere else in diffstore.

PySpark offers no public call for either need: making a session the active one of the JVM thread a
Python thread happens to get (the ``diffstore`` format is registered per session), and asking an
:class:`~pyspark.sql.Observation` whether its frame ever ran without blocking on it. If a PySpark release
renames these handles, this module is the only place to change.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Observation, SparkSession


def activate_session(spark: SparkSession) -> None:
    """Makes ``spark`` the active session of the calling thread's JVM thread: a Python thread other
    than the one that built the session gets a fresh JVM thread with no active session, where a format
    registered on the session would not be found."""
    jvm = spark._jvm
    if jvm is not None:
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)


def observed_count(observation: Observation, key: str = "rows", wait_s: float = 2.0) -> int | None:
    """The count an Observation collected under ``key``; ``None`` when its frame was never executed (or
    its plan pruned the observed node), without blocking longer than ``wait_s``."""
    future = observation._jo.future() if observation._jo is not None else None
    deadline = time.monotonic() + wait_s
    while future is not None and not future.isCompleted() and time.monotonic() < deadline:
        time.sleep(0.02)
    if future is None or not future.isCompleted():
        return None
    try:
        return int(observation.get.get(key, 0))
    except Exception:  # noqa: BLE001 - a plan that pruned the observed node completes with an empty row
        return None
