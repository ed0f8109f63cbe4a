"""``diffstore transform`` checks its collections over HTTP before it starts Spark.

Each case runs the real command in a subprocess against a real server, with a ``pyspark`` on PYTHONPATH
that leaves a marker file and refuses to import: a case that fails before Spark leaves no marker.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import LiveServer, running_server

DEADLINE_S = 60.0
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with running_server(tmp_path / "data") as live:
        yield live


def transform(tmp_path: Path, url: str, *argv: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Runs ``diffstore transform`` with a job from ``tmp_path``; returns it and the Spark marker's path."""
    fake = tmp_path / "fake"
    (fake / "pyspark").mkdir(parents=True, exist_ok=True)
    marker = tmp_path / "spark-imported"
    (fake / "pyspark" / "__init__.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nraise ImportError('this test forbids Spark')\n"
    )
    (tmp_path / "myjob.py").write_text("def job(spark, diffs, lookup):\n    return diffs['a']\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), str(REPO)])}
    done = subprocess.run(
        [sys.executable, "-m", "diffstore", "transform", "--url", url, "--job", "myjob:job", *argv],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        cwd=tmp_path,
        env=env,
    )
    return done, marker


def only_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_a_missing_target_fails_in_one_line_before_spark(server: LiveServer, tmp_path: Path) -> None:
    server.store.create_collection("A")
    done, marker = transform(tmp_path, server.url, "--target", "C", "--source", "a=A")
    assert only_line(done) == (
        f"diffstore transform: no target collection 'C' at {server.url}: create it with "
        "'diffstore collections create C --manual' or pass --create-target (noSuchCollection)"
    )
    assert not marker.exists()  # Spark was never imported, let alone started
    assert [info.name for info in server.store.collections()] == ["A"]


def test_a_missing_source_or_an_automatic_target_fails_before_spark(
    server: LiveServer, tmp_path: Path
) -> None:
    server.store.create_collection("A")
    server.store.create_collection("auto", manual=False)
    done, marker = transform(tmp_path, server.url, "--target", "C", "--source", "a=nope", "--create-target")
    assert only_line(done) == (
        f"diffstore transform: no source collection 'nope' at {server.url} (noSuchCollection)"
    )
    done, marker = transform(tmp_path, server.url, "--target", "auto", "--source", "a=A")
    assert only_line(done).startswith("diffstore transform: the target 'auto' is not a manual collection")
    assert not marker.exists()
    assert [info.name for info in server.store.collections()] == ["A", "auto"]  # nothing created


def test_create_target_creates_a_manual_target_before_spark(server: LiveServer, tmp_path: Path) -> None:
    server.store.create_collection("A")
    done, marker = transform(tmp_path, server.url, "--target", "C", "--source", "a=A", "--create-target")
    assert marker.exists()  # then went on to Spark (which this test forbids; the real run is in the docs)
    assert done.returncode != 0
    assert server.store.collection("C").manual
