"""Two ``diffstore transform --watch`` runners with a lease over sources written throughout, and the check
that their target holds every change exactly once: shared by the pause test (``test_transform_pause.py``:
SIGSTOP of a runner's process group) and the link-fault test (``test_transform_link_faults.py``: a TCP
proxy between a runner and the server that delays, stalls or cuts its traffic).

The job: ``C[k] = a(k) + "|" + B[k]`` where A's values only grow by appending and ``a(k)`` accumulates
A's appended suffixes into C round by round (C before the round + what A appended since), while B's part
is recomputed from B. So C equals the recomputation ``A[k] + "|" + B[k]`` exactly when every change of A
was applied in exactly one committed generation (twice repeats a suffix, never leaves it out) and no stale
value of B landed (a fenced-out runner's late write would put one back). Beyond that: the lineage of C's
generations is one unbroken chain over A and B, and their lease versions never go back (a fenced-out
runner committed nothing after its successor).

A file at ``PAUSE_HOLD`` makes the job hold its round (its generation open) until the file is removed,
and write ``holding PID`` to ``PAUSE_LOG``: the test then faults the runner inside the round, so it goes on
straight into its writes when the fault ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

from helpers_spark import commit_items, snapshot

from diffstore import Store
from diffstore.engine.types import Reader
from tests.helpers import wait_until

REPO = Path(__file__).resolve().parents[2]
TTL_MS = 3000  # generous: a loaded machine must not delay renewals past it
SPARK_START_S = 240.0  # two JVMs starting at once on a loaded 2-core machine
ROUND_S = 180.0
KEYS = [b"k%02d" % i for i in range(12)]

JOB = textwrap.dedent(
    """
    import os, time
    from pyspark.sql import functions as F
    from diffstore.spark import TARGET

    def combine(spark, diffs, lookup):
        hold, log = os.environ["PAUSE_HOLD"], os.environ["PAUSE_LOG"]
        if os.path.exists(hold):  # the round's generation is open: hold it until the test faults us
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


def last_state(stderr: Path) -> str | None:
    states = [e for e in names_of(stderr) if e in ("active", "standby", "lease lost")]
    return states[-1] if states else None


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


class Runners:
    """Two runners of the job (each the leader of its own process group, so that a pause stops its Spark
    JVM too and the end kills it), the first reaching the server at ``urls[0]``, the second at ``urls[1]``;
    the first round of whichever becomes active is held (see the module)."""

    def __init__(self, tmp_path: Path, urls: list[str], names: dict[str, str]) -> None:
        (tmp_path / "pause_job.py").write_text(JOB)
        self.hold, self.log = tmp_path / "hold", tmp_path / "log"
        self.hold.touch()
        self.log.touch()
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.update(PAUSE_HOLD=str(self.hold), PAUSE_LOG=str(self.log))
        self.stderr = [tmp_path / "runner0.err", tmp_path / "runner1.err"]
        self._files = [err.open("w") for err in self.stderr]
        self.procs = []
        for url, err in zip(urls, self._files, strict=True):
            argv = [
                sys.executable, "-m", "diffstore", "transform", "--url", url, "--job", "pause_job:combine",
                "--target", names["C"], "--source", f"a={names['A']}", "--source", f"b={names['B']}",
                "--watch", "--lease-ttl-ms", str(TTL_MS), "--master", "local[1]", "--partitions", "1",
                "--log-format", "json",
            ]  # fmt: skip
            self.procs.append(
                subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=err,
                                 start_new_session=True)
            )  # fmt: skip

    def held_runner(self) -> int:
        """Waits until the active runner holds its first round and the other stands by; which one holds."""
        log, stderr = self.log, self.stderr
        wait_until(
            lambda: "holding" in log.read_text(), SPARK_START_S, 0.05, "the active runner inside its round"
        )
        held = next(i for i, p in enumerate(self.procs) if p.pid == int(log.read_text().split()[1]))
        other = stderr[1 - held]
        wait_until(lambda: "standby" in names_of(other), SPARK_START_S, 0.05, "the other runner standing by")
        return held

    def active(self) -> int:
        return next(i for i in (0, 1) if last_state(self.stderr[i]) == "active")

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGCONT)
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
        for file in self._files:
            file.close()


@contextlib.contextmanager
def running(tmp_path: Path, urls: list[str], names: dict[str, str]) -> Iterator[Runners]:
    runners = Runners(tmp_path, urls, names)
    try:
        yield runners
    finally:
        runners.close()


def finish_writing(store: Store, writer: SourceWriter, names: dict[str, str]) -> list[Reader]:
    """Stops the writer and waits until the target's readers are at the sources' heads; those heads."""
    writer.stop.set()
    writer.join(60)
    assert writer.error is None, writer.error
    heads = [Reader("from_a", names["A"], store.collection(names["A"]).generation_id),
             Reader("from_b", names["B"], store.collection(names["B"]).generation_id)]  # fmt: skip
    wait_until(
        lambda: store.collection(names["C"]).readers() == heads, ROUND_S, 0.05, "the target to catch up"
    )
    return heads


def assert_fenced_while_faulted(stderr: Path, before: int) -> list[str]:
    """A runner whose fault ended after log line ``before`` committed nothing until it was active again
    (it reported losing its lease, or stood by); its events since."""
    after = [str(e.get("event")) for e in events(stderr)[before:]]
    until_active = after[: after.index("active")] if "active" in after else after
    assert "round committed" not in until_active, until_active
    assert "lease lost" in until_active or "standby" in until_active, until_active
    return after


def assert_exactly_once(
    store: Store, writer: SourceWriter, names: dict[str, str], heads: list[Reader], handovers: int
) -> None:
    """C is the recomputation from A and B (every change exactly once, nothing stale visible), and its
    lineage one unbroken chain over A and B whose lease versions never go back, ``handovers`` at least."""
    assert snapshot(store, names["C"]) == writer.expected()
    target = store.collection(names["C"])
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
    assert versions == sorted(versions) and len(set(versions)) >= handovers
