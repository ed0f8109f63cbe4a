"""Fixtures of the Spark suite: ONE local SparkSession and ONE real diffstore server for the whole run.

With ``DIFFSTORE_TEST_SPARK_REMOTE=sc://…`` the session is one of that Spark Connect server instead
(``test_spark_connect.py`` runs suites so, in a child pytest: a process that opened a Connect session
is in Connect mode for good, so it cannot also hold the local session); with
``DIFFSTORE_TEST_SPARK_MASTER=spark://…`` a classic driver's on that cluster (``test_spark_cluster.py``:
a process holds one SparkContext). ``connect_remote`` starts a
standalone cluster and a Connect server on it, once per run, for the tests that need them.

The server is a real uvicorn serving :func:`diffstore.server.create_app` over a real Store (LMDB) in a
temporary directory, on a free 127.0.0.1 port, in a thread of the test process; Spark's Python workers
reach it over HTTP exactly as executors of a cluster would. Tests keep apart by using fresh collection
names (:func:`names`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from diffstore import Store
from diffstore.server import ServerConfig, create_app
from diffstore.spark.session import local_builder
from tests.helpers import serving

# pyspark is an optional extra: without it only the Spark-free tests of this directory run
if importlib.util.find_spec("pyspark") is None:
    collect_ignore_glob = [
        "test_spark_anywhere.py",
        "test_spark_cluster.py",
        "test_spark_connect.py",
        "test_spark_install.py",
        "test_spark_ranges.py",
        "test_spark_session.py",
        "test_spark_source.py",
        "test_spark_streaming.py",
        "test_spark_tls.py",
        "test_spark_transform.py",
        "test_preview.py",
        "test_transform_progress.py",
    ]


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    path: Path = tmp_path_factory.mktemp("spark-store")
    with Store.open(path) as opened:
        yield opened


@contextlib.contextmanager
def _serve(store: Store, token: str | None = None) -> Iterator[str]:
    app = create_app(store, ServerConfig(token=token))
    with serving(uvicorn.Server(uvicorn.Config(app, log_level="warning"))) as url:
        yield url


@pytest.fixture(scope="session")
def server_url(store: Store) -> Iterator[str]:
    with _serve(store) as url:
        yield url


TOKEN = "s3cret-token"


@pytest.fixture(scope="session")
def token_server_url(store: Store) -> Iterator[str]:
    """The same store served by a second server that requires ``Authorization: Bearer`` :data:`TOKEN`."""
    with _serve(store, TOKEN) as url:
        yield url


REMOTE_ENV = "DIFFSTORE_TEST_SPARK_REMOTE"
MASTER_ENV = "DIFFSTORE_TEST_SPARK_MASTER"


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    """A plain ``SparkSession.builder`` session: nothing registers the ``diffstore`` format in it, so every
    test also checks that the format is found by itself (``pyspark_diffstore``) or registered on use.
    Under ``DIFFSTORE_TEST_SPARK_REMOTE``: a session of that Connect server (see the module doc)."""
    master = os.environ.get(MASTER_ENV)
    if master:  # a classic driver on a cluster, configured by the cluster's spark-defaults.conf
        from diffstore.spark import master_session

        on_cluster = master_session(master, "diffstore-tests")
        on_cluster.sparkContext.setLogLevel("ERROR")
        yield on_cluster
        on_cluster.stop()
        return
    remote = os.environ.get(REMOTE_ENV)
    if remote:
        from diffstore.spark import connect_session

        connected = connect_session(remote, "diffstore-tests")
        yield connected
        connected.stop()
        return
    session = local_builder("diffstore-tests").getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def names() -> Iterator[dict[str, str]]:
    """Fresh collection names A, B, C for one test."""
    tag = uuid.uuid4().hex[:8]
    yield {name: f"{name}_{tag}" for name in ("A", "B", "C")}


@pytest.fixture(scope="session")
def connect_remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``sc://…`` of a Spark Connect server whose jobs run on a standalone cluster (a Master, two Workers
    of one core; executors in JVMs of their own), all started here and killed at the end of the run —
    or the server ``DIFFSTORE_TEST_SPARK_REMOTE`` names, when set."""
    if os.environ.get(REMOTE_ENV):
        yield os.environ[REMOTE_ENV]
        return
    from clusters import connect_server, standalone_cluster

    work = tmp_path_factory.mktemp("spark-cluster")
    with standalone_cluster(work) as cluster, connect_server(work, cluster.master) as server:
        yield server.remote
