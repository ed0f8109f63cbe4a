"""Spark Connect on a real cluster: the transform suite and the user paths through a Connect server whose
jobs run on a standalone cluster (``connect_remote``), and ``diffstore transform --remote``.

A process that opened a Connect session stays in Connect mode (pyspark keys it on an environment
variable), so the suites run in a child pytest whose ``spark`` fixture is the Connect session
(``conftest.REMOTE_ENV``): ``test_spark_transform.py`` — the very tests the local session runs — and
``test_spark_anywhere.py`` (data source batch and streaming with a restart, leases, preview, lineage).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REMOTE_ENV
from helpers_spark import commit_items, load_example_job, snapshot

from diffstore import Store
from tests.helpers import free_port

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "spark_a_plus_b"
HERE = Path(__file__).resolve().parent
DEADLINE_S = 1800.0  # seven tests through Connect on a cluster, on a loaded 2-core machine


@pytest.mark.timeout(DEADLINE_S + 60)
def test_the_transform_suite_through_spark_connect_on_a_cluster(connect_remote: str, tmp_path: Path) -> None:
    env = {**os.environ, REMOTE_ENV: connect_remote}
    env.pop("SPARK_REMOTE", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-x",
            "-p",
            "no:cacheprovider",
            "--basetemp",
            str(tmp_path / "t"),
        ]
        + [str(HERE / "test_spark_transform.py"), str(HERE / "test_spark_anywhere.py")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and " failed" not in done.stdout, done.stdout[-2000:]


def _command(url: str, remote: str, names: dict[str, str]) -> list[str]:
    argv = [str(Path(sys.executable).parent / "diffstore"), "transform", "--url", url, "--remote", remote]
    argv += ["--job", "job:country_totals", "--target", names["C"]]
    return argv + ["--source", f"a={names['A']}", "--source", f"b={names['B']}", "--lease-ttl-ms", "0"]


def test_the_command_line_runs_rounds_through_spark_connect(
    connect_remote: str, server_url: str, store: Store, names: dict[str, str]
) -> None:
    for name in names.values():
        store.create_collection(name, manual=True)
    commit_items(store, names["A"], [(b"u1", b"DE"), (b"u2", b"FR"), (b"u3", b"DE")])
    commit_items(store, names["B"], [(b"u1", b"10"), (b"u2", b"20"), (b"u3", b"5")])
    env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
    for changes in ([], [(b"u1", None), (b"u2", b"DE")]):
        if changes:
            commit_items(store, names["A"], changes)
        done = subprocess.run(
            _command(server_url, connect_remote, names), cwd=EXAMPLE, env=env, capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        expected = load_example_job().recompute(snapshot(store, names["A"]), snapshot(store, names["B"]))
        assert snapshot(store, names["C"]) == expected and expected


def test_a_connect_server_that_is_down_is_one_line(
    server_url: str, store: Store, names: dict[str, str]
) -> None:
    for name in names.values():
        store.create_collection(name, manual=True)
    remote = f"sc://127.0.0.1:{free_port()}"  # a port nothing listens on
    done = subprocess.run(
        _command(server_url, remote, names), cwd=EXAMPLE, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(
        f"diffstore transform: no Spark Connect server answers at {remote} (Connection refused): start one"
    ), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert store.collection(names["C"]).generation_id == b""  # nothing written
