"""The soak (issue 52, part 1): the whole pipeline for a while, faults thrown at it, invariants checked all
the time, resources sampled.

    stream "s" ──produced at a steady rate──▶ streams serve ──▶ ingest ×2 (one active) ──link──▶ A (manual)
    a client writing B (automatic) ─────────────────────────────────────────────────────────────▶ B
    transform --watch ×2 (one active): A + B ──link──▶ C (manual) ──▶ a consumer's view of C
    a replica following the primary ──link──▶ ; a backup every few minutes, ``check``ed

:class:`Soak` starts everything as an operator would (``diffstore`` commands in processes of their own),
:class:`~tests.soak.components.Faults` throws kill -9, SIGSTOP and stalled or cut links at random, and
the checker thread runs the invariants of :mod:`tests.soak.checks` every few seconds. The sampler records
RSS and open fds of every process, the store's file size, reader lags and end-to-end freshness (a record's
append → C readable with it). :meth:`Soak.report` sums it up; ``benchmarks/soak.py`` prints it and plots
the samples.
"""

from __future__ import annotations

import contextlib
import csv
import itertools
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from diffstore.client import Client
from diffstore.errors import DiffstoreError, StorageError
from diffstore.streams.client import StreamClient, StreamError
from diffstore.streams.producer import BufferedProducer, ProducerConfig, ProducerError
from tests.helpers import free_port, wait_until
from tests.soak import checks
from tests.soak.components import Component, Faults, Link, diffstore, python_path, serve

HERE = Path(__file__).resolve().parent
KEYS = 40
COLLECTIONS = ["A", "B", "C"]


@dataclass
class SoakConfig:
    """What one soak run does; the defaults are the 3-minute run of ``make test``."""

    work: Path
    minutes: float = 3.0
    records_per_s: float = 100.0
    fault_every_s: float = 15.0
    backup_every_s: float = 60.0
    check_every_s: float = 3.0
    sample_every_s: float = 2.0
    seed: int = 52
    spark: bool = True
    replica: bool = True
    lease_ttl_ms: int = 3000


@dataclass
class Sample:
    at: float
    rss_mb: dict[str, float]
    fds: dict[str, int]
    store_mb: float
    lag_generations: int


@dataclass
class Run:
    """What the soak saw: violations, harness errors, counts, samples and freshness."""

    violations: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    checks: dict[str, int] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    freshness: list[tuple[float, float]] = field(default_factory=list)  # (seen at, seconds)
    produced: int = 0
    not_now: dict[str, str] = field(default_factory=dict)  # why each check last could not run


class Soak:
    def __init__(self, config: SoakConfig) -> None:
        self.config = config
        self.run = Run()
        self.rng = random.Random(config.seed)
        self.logs = config.work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.components: dict[str, Component] = {}
        self.links: dict[str, Link] = {}
        self.done = threading.Event()
        self.acknowledged: dict[int, float] = {}  # sequence number → when it was appended
        self.ack_lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.view_file = config.work / "consumer-view.json"
        self.faults: Faults | None = None

    # --- set-up ------------------------------------------------------------------------------

    def start(self) -> None:
        work = self.config.work
        primary, self.url = serve("primary", work / "primary", self.logs, "--commit-delay-ms", "20")
        self.components["primary"] = primary.start()
        self.admin = Client(self.url, timeout_s=60)
        self.admin.create_collection("A", manual=True)
        self.admin.create_collection("B", manual=False)
        self.admin.collection("B").put_many([(b"key-%d" % k, b"|b0") for k in range(KEYS)])
        self.checker = checks.ExactlyOnce(Client(self.url, timeout_s=60))
        self.checker.start()

        port = free_port()
        self.streams_url = f"hstream://127.0.0.1:{port}"
        streams = Component(
            "streams",
            diffstore("streams", "serve", "--data", str(work / "streams"), "--port", str(port)),
            self.logs / "streams.log",
            self._streams_ready,
        )
        self.components["streams"] = streams.start()
        with StreamClient(self.streams_url) as client:
            client.create_stream("s", shard_count=2)
            client.create_subscription("sub", "s", ack_timeout_s=30, max_unacked_records=20_000)

        self.links["ingest"] = Link("ingest", self.url)
        for name in ("ingest-1", "ingest-2"):
            command = diffstore(
                "ingest", "--hstream", self.streams_url, "--subscription", "sub", "--collection", "A",
                "--url", self.links["ingest"].url, "--mapper", "soak_jobs:mapper", "--window-records", "500",
                "--window-ms", "50", "--lease-ttl-ms", str(self.config.lease_ttl_ms),
            )  # fmt: skip
            self.components[name] = Component(name, command, self.logs / f"{name}.log").start()

        if self.config.spark:
            self.links["transform"] = Link("transform", self.url)
            for name in ("transform-1", "transform-2"):
                command = diffstore(
                    "transform", "--url", self.links["transform"].url, "--job", "soak_jobs:join",
                    "--target", "C", "--source", "a=A", "--source", "b=B", "--watch", "--create-target",
                    "--lease-ttl-ms", str(self.config.lease_ttl_ms), "--master", "local[1]",
                )  # fmt: skip
                self.components[name] = Component(name, command, self.logs / f"{name}.log").start()
            wait_until(self._c_exists, 300, interval=0.5, what="the transform's first round")
            consumer = Component(
                "consumer",
                [sys.executable, str(HERE / "consumer_proc.py"), self.url, str(self.view_file)],
                self.logs / "consumer.log",
            )
            self.components["consumer"] = consumer.start()

        if self.config.replica:
            self.links["replica"] = Link("replica", self.url)
            replica, self.replica_url = serve(
                "replica", work / "replica", self.logs, "--replica-of", self.links["replica"].url
            )
            self.components["replica"] = replica.start()

        self._thread(self._produce, "produce")
        self._thread(self._write_b, "write-b")
        self._thread(self._check, "check")
        self._thread(self._sample, "sample")
        if self.config.spark:
            self._thread(self._watch_freshness, "freshness")
        self._thread(self._backups, "backups")
        self.faults = Faults(self.components, self.links, self.config.fault_every_s, self.config.seed)

    def _streams_ready(self) -> bool:
        try:
            with StreamClient(self.streams_url) as probe:
                probe.check_reachable(1.0)
                probe.describe_cluster()
            return True
        except StreamError:
            return False

    def _c_exists(self) -> bool:
        try:
            return bool(self.admin.collection("C").generation_id)
        except DiffstoreError:
            return False

    def _thread(self, target: object, name: str) -> None:
        def run() -> None:
            try:
                target()  # type: ignore[operator]
            except Exception as exc:  # noqa: BLE001 -- the report shows it
                self.run.errors.append(f"{name}: {type(exc).__name__}: {exc}")

        thread = threading.Thread(target=run, name=f"soak-{name}", daemon=True)
        self.threads.append(thread)
        thread.start()

    # --- the load ------------------------------------------------------------------------------

    def _produce(self) -> None:
        """``records_per_s`` records a second (key-N → an 8-digit sequence number), in batches of 10; a
        streams server that is away is waited for (its records are sent again: only acknowledged ones
        count)."""
        seqs = itertools.count()
        interval = 10 / self.config.records_per_s
        while not self.done.is_set():
            try:
                with (
                    StreamClient(self.streams_url) as client,
                    BufferedProducer(
                        client, "s", ProducerConfig(batch_max_records=50, linger_ms=5)
                    ) as producer,
                ):
                    while not self.done.wait(interval):
                        batch = [(next(seqs), time.monotonic()) for _ in range(10)]
                        futures = [
                            (seq, at, producer.append(b"%08d" % seq, key=f"key-{self.rng.randrange(KEYS)}"))
                            for seq, at in batch
                        ]
                        producer.flush()
                        for seq, at, future in futures:
                            future.result(timeout=60)
                            with self.ack_lock:
                                self.acknowledged[seq] = at
                        self.run.produced = len(self.acknowledged)
            except (StreamError, ProducerError, TimeoutError, OSError) as exc:
                self._note("produce", exc)
                self.done.wait(0.5)

    def _write_b(self) -> None:
        """B's values change now and then (an automatic collection: each put commits by itself)."""
        with Client(self.url, timeout_s=30) as client:
            for n in itertools.count(1):
                if self.done.wait(0.5):
                    return
                with contextlib.suppress(DiffstoreError, httpx.HTTPError):
                    client.collection("B").put(b"key-%d" % self.rng.randrange(KEYS), b"|b%d" % n)

    def _note(self, where: str, exc: BaseException) -> None:
        self.run.checks[f"{where}: waited ({type(exc).__name__})"] = (
            self.run.checks.get(f"{where}: waited ({type(exc).__name__})", 0) + 1
        )

    # --- the checks ------------------------------------------------------------------------------

    def _count(self, name: str, n: int = 1) -> None:
        self.run.checks[name] = self.run.checks.get(name, 0) + n

    def _check(self) -> None:
        replica = Client(self.replica_url, timeout_s=30) if self.config.replica else None
        with Client(self.url, timeout_s=30) as client:
            while not self.done.wait(self.config.check_every_s):
                self.check_once(client, replica)
        if replica is not None:
            replica.close()

    def check_once(self, client: Client, replica: Client | None) -> None:
        steps: list[tuple[str, object]] = [("A exactly once", lambda: self.checker.step())]
        if self.config.spark:
            steps += [
                ("C = A+B", lambda: checks.c_matches_sources(client)),
                ("view = C", lambda: checks.view_matches_c(client, self.view_file)),
            ]
        if replica is not None:
            steps.append(("replica = primary", lambda: checks.replica_matches(client, replica, COLLECTIONS)))
        for name, step in steps:
            try:
                step()  # type: ignore[operator]
                self._count(name)
            except checks.Violation as exc:
                self.run.violations.append(f"{name}: {exc}")
            except (checks.NotNow, DiffstoreError, StorageError, httpx.HTTPError, OSError) as exc:
                self._count(f"{name}: not now")
                self.run.not_now[name] = f"{type(exc).__name__}: {exc}"
        for name, component in self.components.items():
            lock = self.faults.lock if self.faults is not None else contextlib.nullcontext()
            with lock:  # type: ignore[attr-defined]
                if component.process is not None and not component.running():
                    self.run.violations.append(
                        f"{name} exited by itself ({component.exit_code()}): {component.tail(10)}"
                    )
                    component.start()  # as its supervisor would

    def _backups(self) -> None:
        backups = self.config.work / "backups"
        backups.mkdir(exist_ok=True)
        for n in itertools.count(1):
            if self.done.wait(self.config.backup_every_s):
                return
            out = backups / f"b{n}"
            made = subprocess_run([*diffstore("backup", "--url", self.url, str(out))])
            if made != 0:
                self._count("backup: not now (the server was away)")
                shutil.rmtree(out, ignore_errors=True)
                continue
            try:
                with Client(self.url, timeout_s=30) as client:
                    checks.backup_matches(client, out, diffstore(), COLLECTIONS)
                self._count("backup checked and equal")
            except checks.Violation as exc:
                self.run.violations.append(f"backup {out}: {exc}")
            except (DiffstoreError, httpx.HTTPError, OSError):
                self._count("backup compare: not now")
            shutil.rmtree(out, ignore_errors=True)

    # --- what is measured ----------------------------------------------------------------------

    def _watch_freshness(self) -> None:
        """Each time C commits, every key's value names the newest record of A it reflects: the time from
        that record's append to now is its freshness (each record counted once, when first seen)."""
        seen: set[int] = set()
        warm_from: float | None = None  # records appended before C's first round here are the start-up's
        with Client(self.url, timeout_s=60) as client:
            while not self.done.is_set():
                try:
                    c = client.collection("C")
                    for _ in c.watch(timeout_ms=2_000):
                        now = time.monotonic()
                        if warm_from is None:
                            warm_from = now
                            continue
                        for record in c.query():
                            seq = int(record.value.split(b"|", 1)[0])
                            with self.ack_lock:
                                appended = self.acknowledged.get(seq)
                            if appended is not None and appended >= warm_from and seq not in seen:
                                seen.add(seq)
                                self.run.freshness.append((now, now - appended))
                        if self.done.is_set():
                            return
                except (DiffstoreError, httpx.HTTPError, OSError, ValueError):
                    self.done.wait(0.2)

    def _sample(self) -> None:
        data_file = self.config.work / "primary" / "data.mdb"
        while not self.done.wait(self.config.sample_every_s):
            rss: dict[str, float] = {}
            fds: dict[str, int] = {}
            for name, component in self.components.items():
                if component.pid is None:
                    continue
                with contextlib.suppress(psutil.Error):
                    tree = [psutil.Process(component.pid)]
                    tree += tree[0].children(recursive=True)
                    rss[name] = sum(p.memory_info().rss for p in tree) / 2**20
                    fds[name] = sum(p.num_fds() for p in tree)
            size = data_file.stat().st_size / 2**20 if data_file.exists() else 0.0
            self.run.samples.append(Sample(time.monotonic(), rss, fds, size, self._lag()))

    def _lag(self) -> int:
        try:
            text = httpx.get(f"{self.url}/metrics", timeout=5).text
        except httpx.HTTPError:
            return -1
        lag = 0
        for line in text.splitlines():
            if line.startswith("diffstore_reader_lag_generations{"):
                lag = max(lag, int(float(line.rsplit(" ", 1)[1])))
        return lag

    # --- the run ---------------------------------------------------------------------------------

    def soak(self) -> Run:
        """Runs the faults for ``minutes``, then lets the pipeline catch up and checks the end state."""
        assert self.faults is not None
        self.faults.start()
        self.done.wait(self.config.minutes * 60)
        self.faults.stop()
        self.run.errors += self.faults.errors
        self.done.set()
        for thread in self.threads:
            thread.join(120)
        self.finish()
        return self.run

    def finish(self) -> None:
        """Everything acknowledged reaches A exactly once, C and the view catch up, the replica equals."""
        with Client(self.url, timeout_s=60) as client:
            acknowledged = set(self.acknowledged)

            def caught_up() -> bool:
                while self.checker.step():
                    pass
                return not self.checker.missing(acknowledged)

            try:
                wait_until(caught_up, 300, interval=0.5, what="every acknowledged record in A")
            except AssertionError:
                missing = self.checker.missing(acknowledged)
                self.run.violations.append(f"{len(missing)} acknowledged records not in A: {missing[:10]}")
            if self.config.spark:
                self._settled(lambda: self._c_final(client), "C = A+B")
                self._settled(lambda: self._view_final(client), "view = C")
            if self.config.replica:
                with Client(self.replica_url, timeout_s=60) as replica:
                    self._settled(
                        lambda: (
                            checks.replica_matches(client, replica, COLLECTIONS) == len(COLLECTIONS)
                            and all(
                                replica.collection(n).generation_id == client.collection(n).generation_id
                                for n in COLLECTIONS
                            )
                        ),
                        "replica = primary at the end",
                    )

    def _c_final(self, client: Client) -> bool:
        checks.c_matches_sources(client)
        return self._c_caught_up(client)

    def _view_final(self, client: Client) -> bool:
        return checks.view_matches_c(client, self.view_file) == client.collection("C").generation_id

    def _c_caught_up(self, client: Client) -> bool:
        c = {r.name: r.generation_id for r in client.collection("C").readers()}
        return (
            c.get("from_a") == client.collection("A").generation_id
            and c.get("from_b") == client.collection("B").generation_id
        )

    def _settled(self, holds: object, name: str) -> None:
        def attempt() -> bool:
            try:
                return bool(holds())  # type: ignore[operator]
            except (checks.NotNow, DiffstoreError, httpx.HTTPError):
                return False
            except checks.Violation as exc:
                self.run.violations.append(f"{name}: {exc}")
                return True

        try:
            wait_until(attempt, 300, interval=0.5, what=name)
            self._count(f"{name} (final)")
        except AssertionError as exc:
            self.run.violations.append(f"{name}: {exc}")

    def stop(self) -> None:
        self.done.set()
        if self.faults is not None and self.faults.thread.is_alive():
            self.faults.stop()
        for component in reversed(list(self.components.values())):
            component.stop()
        for link in self.links.values():
            link.close()
        with contextlib.suppress(Exception):
            self.admin.close()
        with contextlib.suppress(Exception):
            self.checker.client.close()

    # --- the figures -----------------------------------------------------------------------------

    def report(self) -> str:
        run, faults = self.run, self.faults.thrown if self.faults else []
        lines = [
            f"records acknowledged: {len(self.acknowledged):,}; checks: "
            + ", ".join(f"{k} {v}" for k, v in sorted(run.checks.items())),
            f"faults: {len(faults)} (" + ", ".join(f"{f.kind} {f.target}" for f in faults) + ")",
            f"invariant violations: {len(run.violations)}",
            *(f"  VIOLATION {v}" for v in run.violations),
            *(f"  harness error {e}" for e in run.errors),
            *(f"  last 'not now' of {k}: {v}" for k, v in sorted(run.not_now.items())),
        ]
        lines += growth_lines(run.samples, self.config.minutes)
        between = [s for at, s in run.freshness if self.faults is None or not self.faults.in_fault(at, 10.0)]
        if between:
            lines.append(
                f"freshness (append -> C readable) between faults: p50 {pct(between, 50) * 1e3:.0f} ms, "
                f"p99 {pct(between, 99) * 1e3:.0f} ms over {len(between):,} records (goal p99 <= 250 ms)"
            )
        return "\n".join(lines)

    def write_samples(self, path: Path) -> None:
        names = sorted({n for s in self.run.samples for n in s.rss_mb})
        with path.open("w", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(["t_s", "store_mb", "lag_generations", *(f"rss_mb:{n}" for n in names),
                             *(f"fds:{n}" for n in names)])  # fmt: skip
            t0 = self.run.samples[0].at if self.run.samples else 0.0
            for s in self.run.samples:
                writer.writerow(
                    [f"{s.at - t0:.1f}", f"{s.store_mb:.1f}", s.lag_generations,
                     *(f"{s.rss_mb.get(n, 0):.1f}" for n in names), *(s.fds.get(n, 0) for n in names)]
                )  # fmt: skip


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


def growth_lines(samples: list[Sample], minutes: float) -> list[str]:
    """RSS growth of each process after the warm-up (the first 10 minutes, or the first sixth of a short
    run) and the store's size in the steady state (the second half), max against min."""
    if len(samples) < 4:
        return []
    t0 = samples[0].at
    warm = min(600.0, minutes * 60 / 6)
    after = [s for s in samples if s.at - t0 >= warm] or samples
    lines = []
    for name in sorted({n for s in after for n in s.rss_mb}):
        values = [s.rss_mb[name] for s in after if name in s.rss_mb]
        if values:
            lines.append(
                f"RSS {name}: {values[0]:.0f} -> {values[-1]:.0f} MB after warm-up "
                f"({(values[-1] / values[0] - 1) * 100:+.0f}%, goal <= +10%); max fds "
                f"{max(s.fds.get(name, 0) for s in after)}"
            )
    steady = [s.store_mb for s in samples if s.at - t0 >= minutes * 30] or [s.store_mb for s in samples]
    lines.append(
        f"store size in the second half: {min(steady):.0f}..{max(steady):.0f} MB "
        f"({(max(steady) / max(min(steady), 1e-9) - 1) * 100:.0f}% spread, goal <= 20%)"
    )
    return lines


def subprocess_run(command: list[str]) -> int:
    env = {**os.environ, "PYTHONPATH": python_path()}
    return subprocess.run(command, capture_output=True, env=env, timeout=600).returncode
