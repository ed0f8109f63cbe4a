"""Real Spark deployments for the tests: a standalone cluster and a Spark Connect server.

Both are started from pyspark's own ``bin/`` (no separate Spark install): a Master and two Workers of one
core each (``spark-class``), whose executors run in JVMs of their own, and a Spark Connect server
(``spark-submit --class …SparkConnectServer``) whose driver runs its jobs on that cluster. Each JVM runs in
its own process group and is killed, group and all, when its context ends, so that nothing outlives the
test session (a Worker's executors are its children).

Executors and the Connect server's Python workers run this interpreter (``spark.pyspark.python``): that
is where diffstore is installed, as it must be on every executor of a real cluster.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pyspark

from diffstore.spark.session import QUICK_START_JAVA_OPTIONS
from tests.helpers import free_port

SPARK_HOME = Path(pyspark.__file__).parent
STARTUP_DEADLINE_S = 180.0
_JAVA_OPTIONS = QUICK_START_JAVA_OPTIONS


def _environment(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    env.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOG_DIR=str(work / "logs"),
        SPARK_WORKER_DIR=str(work / "worker"),
        SPARK_NO_DAEMONIZE="1",
        SPARK_DAEMON_MEMORY="256m",
        SPARK_DAEMON_JAVA_OPTS=_JAVA_OPTIONS,
        PYSPARK_PYTHON=sys.executable,
    )
    return env


@contextlib.contextmanager
def _process(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A JVM in its own process group, its output in ``log``; the group is killed at the end."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        process = subprocess.Popen(
            argv,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)


def _wait(what: str, ready: Any, processes: list[subprocess.Popen[bytes]], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_DEADLINE_S
    while not ready():
        for process in processes:
            if process.poll() is not None:
                raise RuntimeError(f"{what} exited: {log.read_text(errors='replace')[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{what} not ready in {STARTUP_DEADLINE_S} s: {log.read_text(errors='replace')[-3000:]}"
            )
        time.sleep(0.25)


@dataclass(frozen=True)
class Cluster:
    master: str  # spark://127.0.0.1:P
    work: Path


@contextlib.contextmanager
def standalone_cluster(work: Path, workers: int = 2) -> Iterator[Cluster]:
    """A Master and ``workers`` Workers (one core, 1 GiB each) on 127.0.0.1, ready when all registered."""
    env = _environment(work)
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port, ui = free_port(), free_port()
    master = f"spark://127.0.0.1:{port}"
    with contextlib.ExitStack() as stack:
        log = work / "logs" / "master.out"
        started = [
            stack.enter_context(
                _process(
                    [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"]
                    + ["--port", str(port), "--webui-port", str(ui)],
                    env,
                    log,
                )
            )
        ]
        for i in range(workers):
            started.append(
                stack.enter_context(
                    _process(
                        [spark_class, "org.apache.spark.deploy.worker.Worker", master, "--host", "127.0.0.1"]
                        + ["--cores", "1", "--memory", "1g", "--webui-port", str(free_port())]
                        + ["--work-dir", str(work / f"worker-{i}")],
                        env,
                        work / "logs" / f"worker-{i}.out",
                    )
                )
            )

        def registered() -> bool:
            try:
                state = httpx.get(f"http://127.0.0.1:{ui}/json/", timeout=5).json()
            except (httpx.HTTPError, ValueError):
                return False
            return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE") >= workers

        _wait("the standalone cluster", registered, started, log)
        yield Cluster(master, work)


def cluster_settings(cores_max: int) -> dict[str, str]:
    """The Spark settings of an application on the test cluster: small executors, this interpreter."""
    return {
        "spark.cores.max": str(cores_max),
        "spark.executor.cores": "1",
        "spark.executor.memory": "512m",
        "spark.driver.memory": "1g",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.extraJavaOptions": _JAVA_OPTIONS,
        "spark.executor.extraJavaOptions": _JAVA_OPTIONS,
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.pyspark.python": sys.executable,
        "spark.python.worker.reuse": "true",
    }


def cluster_conf(cores_max: int) -> list[str]:
    """:func:`cluster_settings` as ``spark-submit`` arguments."""
    pairs = cluster_settings(cores_max)
    return [arg for key, value in pairs.items() for arg in ("--conf", f"{key}={value}")]


def spark_conf_dir(path: Path, cores_max: int) -> Path:
    """A ``SPARK_CONF_DIR`` whose ``spark-defaults.conf`` holds :func:`cluster_settings`: how a cluster's
    own configuration reaches a driver that sets nothing itself (``master_session``, ``--master``)."""
    path.mkdir(parents=True, exist_ok=True)
    lines = [f"{key} {value}" for key, value in cluster_settings(cores_max).items()]
    (path / "spark-defaults.conf").write_text("\n".join(lines) + "\n")
    return path


@dataclass(frozen=True)
class ConnectServer:
    remote: str  # sc://127.0.0.1:P
    log: Path


@contextlib.contextmanager
def connect_server(
    work: Path, master: str, cores_max: int = 2, settings: Mapping[str, str] | None = None
) -> Iterator[ConnectServer]:
    """A Spark Connect server whose driver runs its jobs on ``master``; ready when its port answers.
    ``settings`` go after (and so over) :func:`cluster_settings`."""
    env = _environment(work)
    del env["SPARK_DAEMON_MEMORY"]  # the launcher would size the server's driver by it, as a daemon's
    port = free_port()
    log = work / "logs" / "connect.out"
    argv = [
        str(SPARK_HOME / "bin" / "spark-submit"),
        "--class",
        "org.apache.spark.sql.connect.service.SparkConnectServer",
        "--name",
        "diffstore-tests-connect",
        "--master",
        master,
        *cluster_conf(cores_max),
        "--conf",
        f"spark.connect.grpc.binding.port={port}",
        "--conf",
        "spark.connect.grpc.binding.address=127.0.0.1",
        *[arg for key, value in (settings or {}).items() for arg in ("--conf", f"{key}={value}")],
        "spark-internal",
    ]
    with _process(argv, env, log) as process:

        def answers() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2):
                    return True
            except OSError:
                return False

        _wait("the Spark Connect server", answers, [process], log)
        yield ConnectServer(f"sc://127.0.0.1:{port}", log)
