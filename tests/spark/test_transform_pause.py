"""Two ``diffstore transform --watch`` runners with a lease; the active one is paused (SIGSTOP of its whole
process group: the driver, its lease keeper and its Spark JVM) until the standby takes over, then resumed
(SIGCONT), several times, while the sources are written throughout.

The job: ``C[k] = a(k) + "|" + B[k]`` where A's values only grow by appending and ``a(k)`` accumulates
A's appended suffixes into C round by round (C before the round + what A appended since), while B's part
is recomputed from B. So C equals the recomputation ``A[k] + "|" + B[k]`` exactly when every change of A
was applied in exactly one committed generation (twice repeats a suffix, never leaves it out) and no stale
value of B landed (a paused runner's late write would put one back). Beyond that: the lineage of C's
generations is one unbroken chain over A and B, their lease versions never go back (a resumed runner
committed nothing after its successor), and a resumed runner reports ``lease lost`` and commits nothing
until it is active again.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from helpers_spark import commit_items, snapshot

from diffstore import Store
from diffstore.engine.types import Reader
from tests.faults import paused

pytest.importorskip("pyspark")

REPO = Path(__file__).resolve().parents[2]
TTL_MS = 3000  # generous: a loaded machine must not delay renewals past it
SPARK_START_S = 240.0  # two JVMs starting at once on a loaded 2-core machine
ROUND_S = 180.0
PAUSES = 3
KEYS = [b"k%02d" % i for i in range(12)]

JOB = textwrap.dedent(
    """
    import os, time
    from pyspark.sql import functions as F
    from diffstore.spark import TARGET

    def combine(spark, diffs, lookup):
        hold, log = os.environ["PAUSE_HOLD"], os.environ["PAUSE_LOG"]
        if os.path.exists(hold):  # the round's generation is open: hold it until the test pauses us
            with open(log, "a") as out:
                out.write(f"holding {os.getpid()}\\n")
            while os.path.exists(hold):
                time.sleep(0.05)
        a = diffs["a"].select("key", F.col("fromValue").alias("fa"), F.col("toValue").alias("ta"))
        keys = a.select("key").union(diffs["b"].select("key")).distinct()
        before = lookup(TARGET, keys).withColumnRenamed("value", "before")
        b = lookup("b", keys).withColumnRenamed("value", "vb")
        rows = keys.join(a, "key", "left").join(before, "key", "left").join(b, "key", "left")
        a_before = F.coalesce(F.substring_index(F.col("before").cast("string"), "|", 1), F.lit(""))
        appended = F.expr("substring(cast(ta as string), length(coalesce(cast(fa as string), '')) + 1)")
        a_part = F.when(F.col("ta").isNull(), a_before).otherwise(F.concat(a_before, appended))
        value = F.concat(a_part, F.lit("|"), F.coalesce(F.col("vb").cast("string"), F.lit("")))
        return rows.select("key", value.cast("binary").alias("value"))
    """
)


def events(stderr: Path) -> list[dict[str, object]]:
    """Every JSON log line a runner wrote so far."""
    found = []
    for line in stderr.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
    return found


def names_of(stderr: Path) -> list[str]:
    return [str(e.get("event")) for e in events(stderr)]


def wait_for(condition, what: str, deadline_s: float) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class SourceWriter(threading.Thread):
    """Commits generations of A (appending to values) and B (new values) until stopped."""

    def __init__(self, store: Store, a: str, b: str) -> None:
        super().__init__(daemon=True)
        self.store, self.a, self.b = store, a, b
        self.rng = random.Random(25)
        self.values_a = {k: b"a0-" + k + b";" for k in KEYS}
        self.values_b = {k: b"b0" for k in KEYS[::2]}
        self.stop = threading.Event()
        self.commits = 0
        self.error: BaseException | None = None
        commit_items(store, a, list(self.values_a.items()))
        commit_items(store, b, list(self.values_b.items()))

    def step(self) -> None:
        self.commits += 1
        touched = self.rng.sample(KEYS, 3)
        if self.commits % 2:
            for k in touched:
                self.values_a[k] += b"a%d;" % self.commits
            commit_items(self.store, self.a, [(k, self.values_a[k]) for k in touched])
        else:
            for k in touched:
                self.values_b[k] = b"b%d" % self.commits
            commit_items(self.store, self.b, [(k, self.values_b[k]) for k in touched])

    def run(self) -> None:
        try:
            while not self.stop.wait(0.3):
                self.step()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def expected(self) -> dict[bytes, bytes]:
        return {
            k: self.values_a.get(k, b"") + b"|" + self.values_b.get(k, b"")
            for k in set(self.values_a) | set(self.values_b)
        }


def last_state(stderr: Path) -> str | None:
    states = [e for e in names_of(stderr) if e in ("active", "standby", "lease lost")]
    return states[-1] if states else None


def pause_until_taken_over(
    proc: subprocess.Popen[bytes], mine: Path, other: Path, hold: Path | None = None
) -> int:
    """Stops the active runner's process group until the other runner is active, then resumes it and
    waits until it stands by; returns how many log lines it wrote before it resumed.

    With ``hold`` the runner is inside a round, held by the job: the hold is lifted while it is stopped,
    so it resumes straight into its writes. Without, it is paused once it committed one more round.
    """
    if hold is None:
        done = names_of(mine).count("round committed")
        wait_for(lambda: names_of(mine).count("round committed") > done, "the active runner's round", ROUND_S)
    taken = names_of(other).count("active")
    with paused(proc, group=True):
        if hold is not None:
            hold.unlink()
        wait_for(lambda: names_of(other).count("active") > taken, "the standby to take over", ROUND_S)
        before = len(events(mine))
    wait_for(lambda: last_state(mine) != "active", "the resumed runner to stand by", ROUND_S)
    return before


def test_paused_runners_hand_over_and_commit_nothing_after_they_resume(
    tmp_path: Path, server_url: str, store: Store, names: dict[str, str]
) -> None:
    a, b, c = names["A"], names["B"], names["C"]
    for name in (a, b, c):
        store.create_collection(name, manual=True)
    writer = SourceWriter(store, a, b)
    (tmp_path / "pause_job.py").write_text(JOB)
    hold, log = tmp_path / "hold", tmp_path / "log"
    hold.touch()  # the first active runner holds its first round: it is paused there
    log.touch()
    env = {**os.environ, "PYTHONPATH": str(REPO), "PAUSE_HOLD": str(hold), "PAUSE_LOG": str(log)}
    argv = [
        sys.executable, "-m", "diffstore", "transform", "--url", server_url, "--job", "pause_job:combine",
        "--target", c, "--source", f"a={a}", "--source", f"b={b}", "--watch",
        "--lease-ttl-ms", str(TTL_MS), "--master", "local[1]", "--partitions", "1", "--log-format", "json",
    ]  # fmt: skip
    stderr = [tmp_path / "runner0.err", tmp_path / "runner1.err"]
    files = [err.open("w") for err in stderr]
    # each runner leads its own process group: a pause stops its Spark JVM too, and the end kills it
    procs = [
        subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=err,
                         start_new_session=True)
        for err in files
    ]  # fmt: skip
    resumed: list[tuple[int, int]] = []  # (runner, how many of its log lines were written before it resumed)
    try:
        wait_for(lambda: "holding" in log.read_text(), "the active runner inside its round", SPARK_START_S)
        held = next(i for i, p in enumerate(procs) if p.pid == int(log.read_text().split()[1]))
        wait_for(
            lambda: "standby" in names_of(stderr[1 - held]), "the other runner standing by", SPARK_START_S
        )
        writer.start()
        resumed.append((held, pause_until_taken_over(procs[held], stderr[held], stderr[1 - held], hold)))
        for _ in range(PAUSES - 1):
            active = next(i for i in (0, 1) if last_state(stderr[i]) == "active")
            resumed.append(
                (active, pause_until_taken_over(procs[active], stderr[active], stderr[1 - active]))
            )
        writer.stop.set()
        writer.join(60)
        assert writer.error is None, writer.error
        heads = [Reader("from_a", a, store.collection(a).generation_id),
                 Reader("from_b", b, store.collection(b).generation_id)]  # fmt: skip
        wait_for(lambda: store.collection(c).readers() == heads, "the target to catch up", ROUND_S)
    finally:
        writer.stop.set()
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGCONT)
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
        for file in files:
            file.close()
    assert writer.commits >= PAUSES
    # C is the recomputation from A and B: every change exactly once, nothing stale visible
    assert snapshot(store, c) == writer.expected()
    # a resumed runner committed nothing before it was active again; the held one went on with its round,
    # and its writes (or its commit) were refused
    for i, (runner, before) in enumerate(resumed):
        after = [str(e.get("event")) for e in events(stderr[runner])[before:]]
        until_active = after[: after.index("active")] if "active" in after else after
        assert "round committed" not in until_active, until_active
        assert "lease lost" in until_active or "standby" in until_active, until_active
        if i == 0:
            failed = [
                e for e in events(stderr[runner])[before:] if e.get("event") == "round failed, retrying"
            ]
            assert failed and "leaselost" in str(failed[0].get("error")).lower(), after
    # the lineage: one unbroken chain over A and B, with lease versions that never go back
    target = store.collection(c)
    generations, more = target.generations(limit=1000)
    assert not more
    generations = sorted(g for g in generations if g)
    positions: dict[str, bytes | None] = {"from_a": None, "from_b": None}
    versions = []
    for generation in generations:
        for source in target.lineage(generation).sources:
            assert source.from_generation_id == positions[source.reader_name], (generation, source)
            positions[source.reader_name] = source.to_generation_id
        versions.append(int.from_bytes(generation[8:16], "big"))
    assert positions == {"from_a": heads[0].generation_id, "from_b": heads[1].generation_id}
    assert versions == sorted(versions) and len(set(versions)) >= PAUSES
