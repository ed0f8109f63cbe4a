"""A small local SparkSession for tests, examples and benchmarks (settings proven on a 2-core box).

Why each setting: the UI and its port are useless here; two shuffle partitions suit ``local[2]``; the
driver must bind to 127.0.0.1 (else it may pick another interface); a serial GC with C1 only starts the JVM
fastest. Workers must run this very interpreter (``PYSPARK_PYTHON``) and must be able to import
``diffstore`` by module name (Python Data Sources are imported on the workers), so the package's parent
directory is put on ``PYTHONPATH`` when diffstore is not installed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def prepare_worker_environment() -> None:
    """Makes Spark's Python workers run this interpreter and see the ``diffstore`` package."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    package_root = str(Path(__file__).resolve().parents[2])
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if package_root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([package_root, *paths])


def local_builder(app_name: str = "diffstore", cores: int = 2, shuffle_partitions: int = 2) -> Any:
    """A ``SparkSession.builder`` with the settings above (nothing registered: a plain session).

    Also sets ``spark.sql.execution.pyspark.udf.hideTraceback.enabled``, so that an error raised by the
    data source reaches the caller as its one-line message instead of a Python traceback.
    """
    prepare_worker_environment()
    from pyspark.sql import SparkSession

    java_options = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
    return (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", str(cores))
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", "1g")
        .config("spark.driver.extraJavaOptions", java_options)
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.execution.pyspark.udf.hideTraceback.enabled", "true")
        .config("spark.python.worker.reuse", "true")
    )


def local_session(app_name: str = "diffstore", cores: int = 2, shuffle_partitions: int = 2) -> SparkSession:
    """Builds (or returns the existing) local SparkSession with the ``diffstore`` format registered.

    Args:
        app_name: the Spark application name.
        cores: the N of ``local[N]``.
        shuffle_partitions: ``spark.sql.shuffle.partitions``.

    Returns:
        The session; the caller stops it.
    """
    from diffstore.spark.source import register

    spark = local_builder(app_name, cores, shuffle_partitions).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark  # type: ignore[no-any-return]
