"""Sessions for diffstore's entry points: a small local one (settings proven on a 2-core box), one on a
cluster master, one of a Spark Connect server — each with the ``diffstore`` format registered.

Why each setting: the UI and its port are useless here; two shuffle partitions suit ``local[2]``; the
driver must bind to 127.0.0.1 (else it may pick another interface); a serial GC with C1 only starts the
JVM fastest (a long-running session keeps the full JIT). PySpark's DataFrame debugging
(``spark.python.sql.dataFrameDebugging.enabled``, a static setting) is off: with it, every column
function and DataFrame method of a classic session captures the Python call site and hands it to the JVM
(five py4j calls more each), which was 20% of a small transform round of 10 changes (0.76 s against
0.55-0.60 s; ``benchmarks/small_rounds.py``); an error then names the failing expression without the
Python line that built it. Workers must run this very interpreter (``PYSPARK_PYTHON``) and must be able
to import ``diffstore`` by module name (Python Data Sources are imported on the workers), so the
package's parent directory is put on ``PYTHONPATH`` when diffstore is not installed.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DATAFRAME_DEBUGGING = "spark.python.sql.dataFrameDebugging.enabled"
"""A static setting (at the driver's start): off in the sessions made here (see the module doc)."""
QUICK_START_JAVA_OPTIONS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
"""The driver JVM's options of a local session: C1 only, the quickest start on a small machine."""
LONG_RUNNING_JAVA_OPTIONS = "-XX:+UseSerialGC"
"""The same with the JVM's full JIT, for a long-running session (:func:`local_builder`)."""


def prepare_worker_environment() -> None:
    """Makes Spark's Python workers run this interpreter and see the ``diffstore`` package."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    package_root = str(Path(__file__).resolve().parents[2])
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if package_root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([package_root, *paths])


def local_builder(
    app_name: str = "diffstore", cores: int = 2, shuffle_partitions: int = 2, *, long_running: bool = False
) -> Any:
    """A ``SparkSession.builder`` with the settings above (nothing registered: a plain session).

    Also sets ``spark.sql.execution.pyspark.udf.hideTraceback.enabled``, so that an error raised by the
    data source reaches the caller as its one-line message instead of a Python traceback.

    ``long_running`` (a ``--watch`` transform, a service): the driver's JVM compiles with its full JIT
    instead of stopping at C1. The optimizing compiler costs CPU while it compiles, which on 2 cores
    slows a young session (20 small queries after the first took 4.5-6.8 s against 3.3-4.5 s), and
    then runs Spark's analyzer and py4j hot paths faster: warm small rounds of 10 changes took 0.38-0.43 s
    against 0.43-0.53 s (medians of 30, three sessions each; ``benchmarks/RESULTS.md``).
    """
    prepare_worker_environment()
    from pyspark.sql import SparkSession

    java_options = LONG_RUNNING_JAVA_OPTIONS if long_running else QUICK_START_JAVA_OPTIONS
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
        .config(DATAFRAME_DEBUGGING, "false")
    )


def local_session(
    app_name: str = "diffstore", cores: int = 2, shuffle_partitions: int = 2, *, long_running: bool = False
) -> SparkSession:
    """Builds (or returns the existing) local SparkSession with the ``diffstore`` format registered.

    Args:
        app_name: the Spark application name.
        cores: the N of ``local[N]``.
        shuffle_partitions: ``spark.sql.shuffle.partitions``.
        long_running: the JVM's full JIT, for a session that runs many rounds (see :func:`local_builder`).

    Returns:
        The session; the caller stops it.
    """
    from diffstore.spark.datasource import register

    spark = local_builder(app_name, cores, shuffle_partitions, long_running=long_running).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark  # type: ignore[no-any-return]


def require_pyspark(what: str = "diffstore's Spark front") -> None:
    """Raises a one-line :class:`ModuleNotFoundError` that names the fix when pyspark (or pyarrow) is
    missing, instead of the bare ``No module named 'pyspark'`` of the first import."""
    import importlib.util

    for module in ("pyspark", "pyarrow"):
        if importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(
                f"{what} needs {module}, which is not installed: pip install 'diffstore[spark]' "
                "(from a clone: pip install '.[spark]')",
                name=module,
            )


CONNECT_PROBE_TIMEOUT_S = 5.0


def connect_session(remote: str, app_name: str = "diffstore") -> SparkSession:
    """A session of the Spark Connect server at ``remote`` (``sc://host:port``), the format registered.

    The server's Python workers (and its executors') run the data source, so diffstore must be installed
    where they run (docs/spark.md, "Clusters, Spark Connect, managed platforms").

    Raises:
        ConnectionError: nothing answers at ``remote`` (one line saying what to start), instead of the
            Connect client's retries for minutes.
        ModuleNotFoundError: pyspark's Connect client misses a package (one line naming the extra).
    """
    require_pyspark("Spark Connect")
    address = urlparse(remote)
    if address.scheme != "sc" or not address.hostname:
        raise ValueError(f"a Spark Connect address looks like sc://host:15002, got {remote!r}")
    port = address.port or 15002
    try:
        with socket.create_connection((address.hostname, port), timeout=CONNECT_PROBE_TIMEOUT_S):
            pass
    except OSError as exc:
        raise ConnectionError(
            f"no Spark Connect server answers at {remote} ({exc.strerror or exc}): start one "
            "(sbin/start-connect-server.sh, or spark-submit --class "
            "org.apache.spark.sql.connect.service.SparkConnectServer) or fix the address"
        ) from None
    try:
        from pyspark.sql.connect import utils
        from pyspark.sql.pandas import utils as pandas_utils

        # what pyspark's Connect client checks when it starts, without its doctest shortcut (which exits
        # a `python -c` process)
        for check in (
            pandas_utils.require_minimum_pandas_version,
            pandas_utils.require_minimum_pyarrow_version,
            utils.require_minimum_grpc_version,
            utils.require_minimum_grpcio_status_version,
            utils.require_minimum_googleapis_common_protos_version,
            utils.require_minimum_zstandard_version,
        ):
            check()
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"the Spark Connect client needs more packages ({exc}): pip install 'diffstore[spark]'"
        ) from None
    from pyspark.sql import SparkSession

    from diffstore.spark.datasource import register

    spark = SparkSession.builder.remote(remote).appName(app_name).getOrCreate()
    # a runtime SQL setting, so it may be set over Connect: the data source's errors then reach the
    # caller as one line instead of a Python traceback
    spark.conf.set("spark.sql.execution.pyspark.udf.hideTraceback.enabled", "true")
    register(spark)
    return spark


def master_session(master: str, app_name: str = "diffstore") -> SparkSession:
    """A session on a cluster ``master`` (``spark://…``, ``yarn``, ``k8s://…``), the format registered.

    Nothing of :func:`local_builder`'s is set but the one-line errors and the driver's DataFrame debugging
    (off, see the module doc): the cluster's own configuration
    (``spark-defaults.conf``, ``--conf``) decides the rest, and its executors must have diffstore
    installed (``PYSPARK_PYTHON`` names their interpreter).

    A driver started as a plain ``python`` (not by ``spark-submit``) runs its Python processes — the
    data source's planner on the driver, and the executors' workers — with the interpreter that
    ``PYSPARK_PYTHON`` names; ``spark.pyspark.python`` in ``spark-defaults.conf`` does not reach them.
    Unset, Spark takes whatever ``python3`` is first on ``PATH``, which need not have diffstore (or
    pyarrow) at all; so this defaults it to the driver's own interpreter (executors then need diffstore
    at that same path, or set ``PYSPARK_PYTHON`` to theirs).
    """
    require_pyspark("a Spark session")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from diffstore.spark.datasource import register

    spark = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.sql.execution.pyspark.udf.hideTraceback.enabled", "true")
        .config(DATAFRAME_DEBUGGING, "false")
        .getOrCreate()
    )
    register(spark)
    return spark
