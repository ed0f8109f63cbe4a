"""Two ``diffstore transform --watch`` runners on one target: one active, one standby; kill -9 mid-round.

Real processes (the CLI, each with its own local Spark on one core), a real server in this process. The
job accumulates: ``C[k] = C[k] before the round + the part of A[k] appended since the round's start``, and
A's values only ever grow by appending. So C ends equal to A exactly when every change of A was applied
in exactly one committed generation -- a change applied twice would repeat its suffix, a lost one would
leave it out.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from helpers_spark import commit_items, snapshot

from diffstore import Store
from diffstore.engine.types import Reader
from diffstore.errors import LeaseLost
from diffstore.spark.transform import LEASE_NAME, Transform
from tests.helpers import wait_until

pytest.importorskip("pyspark")

REPO = Path(__file__).resolve().parents[2]
TTL_MS = 3000  # generous: a loaded machine must not delay renewals past it
SPARK_START_S = 180.0  # two JVMs starting at once on a loaded 2-core machine
ROUND_S = 120.0

JOB = textwrap.dedent(
    """
    import os, time
    from pyspark.sql import functions as F
    from diffstore.spark import TARGET

    def accumulate(spark, diffs, lookup):
        hold, log = os.environ["HA_HOLD"], os.environ["HA_LOG"]
        if os.path.exists(hold):  # the generation is open: hold this round until the test kills us
            with open(log, "a") as out:
                out.write(f"holding {os.getpid()}\\n")
            while os.path.exists(hold):
                time.sleep(0.05)
        diff = diffs["a"]
        before = lookup(TARGET, diff.select("key")).withColumnRenamed("value", "before")
        return diff.join(before, "key", "left").select(
            "key",
            F.expr(
                "concat(coalesce(before, X''), substring(toValue, length(coalesce(fromValue, X'')) + 1))"
            ).alias("value"),
        )
    """
)


def events(stderr: Path) -> list[str]:
    """The ``event`` of every JSON log line a runner wrote so far."""
    found = []
    for line in stderr.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                found.append(json.loads(line)["event"])
            except (ValueError, KeyError):
                continue
    return found


def test_a_standby_runner_takes_over_after_kill_9_mid_round(
    tmp_path: Path, server_url: str, store: Store, names: dict[str, str]
) -> None:
    a, c = names["A"], names["C"]
    store.create_collection(a, manual=True)
    store.create_collection(c, manual=True)
    keys = [b"k%02d" % i for i in range(20)]
    values = {k: b"e1-" + k + b";" for k in keys}

    def append(suffix: bytes, to: list[bytes]) -> bytes:
        """Commits a generation of A appending ``suffix`` to the values of ``to``."""
        for k in to:
            values[k] += suffix
        return commit_items(store, a, [(k, values[k]) for k in to])

    g1 = commit_items(store, a, list(values.items()))
    (tmp_path / "ha_job.py").write_text(JOB)
    hold, log = tmp_path / "hold", tmp_path / "log"
    hold.touch()
    log.touch()
    env = {**os.environ, "PYTHONPATH": str(REPO), "HA_HOLD": str(hold), "HA_LOG": str(log)}
    argv = [
        sys.executable, "-m", "diffstore", "transform", "--url", server_url, "--job", "ha_job:accumulate",
        "--target", c, "--source", f"a={a}", "--watch", "--lease-ttl-ms", str(TTL_MS),
        "--master", "local[1]", "--partitions", "1", "--log-format", "json",
    ]  # fmt: skip
    stderr = [tmp_path / "runner0.err", tmp_path / "runner1.err"]
    files = [err.open("w") for err in stderr]
    # each runner in its own session: its Spark JVM is killed with it at the end
    procs = [
        subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=err,
                         start_new_session=True)
        for err in files
    ]  # fmt: skip
    try:
        wait_until(
            lambda: "holding" in log.read_text(), SPARK_START_S, 0.05, "the active runner inside its round"
        )
        victim_pid = int(log.read_text().split()[1])
        victim = next(i for i, p in enumerate(procs) if p.pid == victim_pid)
        survivor = 1 - victim
        wait_until(
            lambda: "standby" in events(stderr[survivor]), SPARK_START_S, 0.05, "the other runner standing by"
        )
        assert "active" not in events(stderr[survivor])
        assert store.collection(c).generation_state()[1] is not None  # mid-round: its generation is open
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].wait(30)
        hold.unlink()
        reader = [Reader("from_a", a, g1)]
        wait_until(lambda: store.collection(c).readers() == reader, ROUND_S, 0.05, "the survivor's round")
        g2 = append(b"e2;", keys[::2])
        g3 = append(b"e3;", keys[1::3])
        reader = [Reader("from_a", a, g3)]
        wait_until(lambda: store.collection(c).readers() == reader, ROUND_S, 0.05, "the next rounds")
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
        for file in files:
            file.close()
    survivor_events = events(stderr[survivor])
    assert "active" in survivor_events
    assert g2 < g3 and snapshot(store, a) == values
    # exactly once: a change applied twice would repeat its suffix in C, a lost one would be missing
    assert snapshot(store, c) == snapshot(store, a)
    assert store.collection(c).generation_state()[1] is None  # the victim's open generation was dropped


def test_a_runner_that_lost_its_lease_mid_round_commits_nothing(
    spark: Any, server_url: str, store: Store, names: dict[str, str]
) -> None:
    """The runner freezes inside a round (its lease keeper stops, as in a long GC pause) until another
    owner took the lease: its commit is refused, the target stays as it was, and it stands by."""
    a, c = names["A"], names["C"]
    store.create_collection(a, manual=True)
    store.create_collection(c, manual=True)
    commit_items(store, a, [(b"k", b"v;")])
    seen: list[str] = []

    def frozen(spark: Any, diffs: dict[str, Any], lookup: Any) -> Any:
        assert transform._guard is not None
        transform._guard.close(release=False)  # no renewal any more, and no release either
        target = store.collection(c)

        def steal() -> bool:
            try:
                target.acquire_lease(LEASE_NAME, "thief", 60_000)
            except LeaseLost:
                return False
            return True

        wait_until(steal, 30, 0.05, "the lease to expire and move")
        return diffs["a"].select("key", "toValue").withColumnRenamed("toValue", "value")

    transform = Transform(
        spark, server_url, c, {"a": a}, frozen, partitions=1, lease_ttl_ms=2000,
        on_event=lambda event, details: seen.append(event),
    )  # fmt: skip
    try:
        assert transform.run(should_stop=lambda: "lease_lost" in seen) == []
    finally:
        transform.close()
    assert seen[:3] == ["active", "planned", "started"] and seen[-2:] == ["failed", "lease_lost"]
    target = store.collection(c)
    assert snapshot(store, c) == {} and target.readers()[0].generation_id is None
    # it could not even abort its generation (fenced out, it changes nothing): the open generation waits,
    # invisible, for the new owner, whose first start drops it
    left = target.generation_state()[1]
    assert left is not None
    [thief] = target.leases()
    assert thief.owner == "thief"
    target.start_generation(left, lease=thief.token)
    assert list(target.query(left)) == []
