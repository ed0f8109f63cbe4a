"""What ``diffstore transform`` shows while it runs: a live line per round on a terminal, one line per round
in a pipe (``--watch`` too).

The real command runs in a subprocess (its own local Spark session) against the suite's real server: once
with its stderr on a pseudo-terminal, where a job that waits for a gate file holds the round in its
"computing and writing" stage until the live line has shown it; once with stderr on a pipe and ``--watch``,
where two rounds must leave exactly one line each. The pure part (events to lines) is checked without Spark.
"""

from __future__ import annotations

import io
import logging
import os
import pty
import re
import select
import signal
import subprocess
import sys
from pathlib import Path

from helpers_spark import commit_items

from diffstore import Store, logs
from diffstore.spark.progress import STAGES, TransformProgress
from diffstore.spark.transform import RoundStats
from tests.helpers import close_pipes, wait_until

DEADLINE_S = 300.0
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")

JOB = """
import os
import time


def job(spark, diffs, lookup):
    # holds the round in its compute stage until the test has seen it (or gives up after the deadline)
    deadline = time.monotonic() + {deadline}
    while not os.path.exists({gate!r}) and time.monotonic() < deadline:
        time.sleep(0.05)
    return diffs["a"].selectExpr("key", "toValue AS value")
"""


def _command(tmp_path: Path, url: str, names: dict[str, str], *extra: str) -> list[str]:
    (tmp_path / "gatedjob.py").write_text(JOB.format(gate=str(tmp_path / "gate"), deadline=DEADLINE_S))
    return [
        sys.executable, "-m", "diffstore", "transform", "--url", url, "--job", "gatedjob:job",
        "--target", names["C"], "--source", f"a={names['A']}", "--create-target",
        "--master", "local[1]", "--lease-ttl-ms", "0", *extra,
    ]  # fmt: skip


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "NO_COLOR")}
    return {**env, "TERM": "xterm-256color", "COLUMNS": "200", "LINES": "40"}


def _said(text: str) -> list[str]:
    """The command's own lines (Spark's JVM adds its WARN lines to stderr)."""
    spark = re.compile(
        r"\d\d/\d\d/\d\d |WARNING: |Using Spark's |Setting default log level|To adjust logging"
    )
    return [line for line in text.splitlines() if line and not spark.match(line)]


def test_on_a_terminal_the_round_shows_its_stage_and_rows(
    server_url: str, store: Store, names: dict[str, str], tmp_path: Path
) -> None:
    store.create_collection(names["A"], manual=True)
    commit_items(store, names["A"], [(b"k1", b"v1"), (b"k2", b"v2"), (b"k3", b"v3")])
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        _command(tmp_path, server_url, names),
        cwd=tmp_path,
        env=_env(),
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=follower,
    )
    os.close(follower)
    received = bytearray()

    def shown() -> str:
        return ANSI.sub("", received.decode("utf-8", "replace"))

    def read_some() -> bool:
        """Reads what the terminal got; False once the command closed it."""
        ready, _, _ = select.select([leader], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: every writer of the terminal has exited
                return False
            if not chunk:
                return False
            received.extend(chunk)
        return True

    try:
        wait_until(lambda: not read_some() or "computing and writing" in shown(), DEADLINE_S, 0, "the stage")
        live = shown()
        assert "round 1 · computing and writing · read a 3" in live, live
        (tmp_path / "gate").touch()
        wait_until(lambda: not read_some(), DEADLINE_S, 0, "the command to finish")
        assert process.wait(DEADLINE_S) == 0, shown()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(leader)
    said = shown()
    assert re.search(r"committed \S+ \(a \S+→\S+\): read a 3, wrote 3, [\d.]+ s", said), said
    assert "caught up after 1 round" in said, said
    assert {record.key: record.value for record in store.collection(names["C"]).query()} == {
        b"k1": b"v1",
        b"k2": b"v2",
        b"k3": b"v3",
    }


def test_in_a_pipe_watch_says_one_line_per_round(
    server_url: str, store: Store, names: dict[str, str], tmp_path: Path
) -> None:
    store.create_collection(names["A"], manual=True)
    commit_items(store, names["A"], [(b"k1", b"v1"), (b"k2", b"v2")])
    (tmp_path / "gate").touch()
    stderr = tmp_path / "stderr"
    with stderr.open("w") as err:
        process = subprocess.Popen(
            _command(tmp_path, server_url, names, "--watch"),
            cwd=tmp_path,
            env=_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        wait_until(lambda: "caught up" in stderr.read_text(), DEADLINE_S, 0.1, "the first round")
        commit_items(store, names["A"], [(b"k1", None), (b"k3", b"v3")])
        wait_until(lambda: stderr.read_text().count("committed") == 2, DEADLINE_S, 0.1, "the second round")
        process.send_signal(signal.SIGINT)
        assert process.wait(DEADLINE_S) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        close_pipes(process)
    said = _said(stderr.read_text())
    assert "\x1b" not in stderr.read_text()  # nothing drawn: no terminal
    assert len(said) == 3, said
    assert re.fullmatch(r"committed \S+ \(a null→\S+\): read a 2, wrote 2, [\d.]+ s", said[0]), said
    assert said[1] == f"caught up after 1 round; following {names['A']}", said
    assert re.fullmatch(r"committed \S+ \(a \S+→\S+\): read a 2, wrote 2, [\d.]+ s", said[2]), said
    assert {record.key: record.value for record in store.collection(names["C"]).query()} == {
        b"k2": b"v2",
        b"k3": b"v3",
    }


def _stats(rows: int) -> RoundStats:
    return RoundStats(b"g1", {"a": (None, b"x")}, {"a": rows}, rows, 1, 0, 0.5)


def test_the_stages_draw_the_live_line_and_are_debug_records_in_json() -> None:
    clock = iter(float(n) for n in range(100))
    text = io.StringIO()
    console = logs.console()
    console.file = text
    progress = TransformProgress(
        logs.Reporter(console, logging.getLogger("test"), "text"), {"a": "A"}, watch=True, live=True,
        clock=lambda: next(clock),
    )  # fmt: skip
    assert progress.line() == "checking the sources"
    progress.on_event("planned", {"ranges": {"a": (None, b"x")}})
    progress.on_event("started", {"generation": b"g1", "attempt": 1})
    progress.on_event("read", {"generation": b"g1", "rows_read": {"a": 1500}})
    assert progress.line().endswith("computing and writing · read a 1,500 · 1.0 s")
    progress.on_event("written", {"generation": b"g1", "rows_read": {"a": 1500}, "rows_written": 7})
    assert "committing · read a 1,500 · wrote 7" in progress.line()
    assert text.getvalue() == ""  # the stages only draw the live line
    progress.on_event("committed", {"stats": _stats(1500)})
    progress.on_event("caught_up", {"rounds": 1})
    progress.on_event("caught_up", {"rounds": 1})
    assert text.getvalue().splitlines() == [
        "committed g1 (a null→x): read a 1,500, wrote 1,500, 0.5 s",
        "caught up after 1 round; following A",
    ]
    assert progress.line() == "caught up; following A"

    records: list[logging.LogRecord] = []
    logger = logging.getLogger("test.progress")
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        json_progress = TransformProgress(logs.Reporter(console, logger, "json"), {"a": "A"}, watch=False)
        for stage in STAGES:
            json_progress.on_event(stage, {"generation": b"g1", "ranges": {"a": (None, b"x")}})
        json_progress.on_event("committed", {"stats": _stats(2)})
    finally:
        logger.removeHandler(handler)
    assert [(r.levelno, r.getMessage()) for r in records] == [
        *((logging.DEBUG, f"round {stage}") for stage in STAGES),
        (logging.INFO, "round committed"),
    ]
