"""Small transform rounds in a warm session: seconds per round over 10, 1,000 and 10,000 changed records.

    python benchmarks/small_rounds.py [--records 100000] [--rounds 3] [--sizes 10,1000,10000] [--warm 30]
                                      [--connect | --remote sc://…]

Setup (untimed): ``diffstore serve`` in a child process (as in production: the server does not share
the driver's interpreter); A (user → country) and B (user → amount) hold ``--records`` users each; the
example's ``country_totals`` job brings C up to date, and ``--warm`` small rounds of each mode warm the
session, a long-running one (``local_session(long_running=True)``: the JVM's full JIT). Timed:
``Transform.run()`` after a commit of N changed users in A (a round and the check that finds C caught
up), alternately

* on the small-round path (``local_diff_max_rows=10_000``, so that every size here takes it: diffs
  read on the driver, lookups and the result's write from the driver) and
* on the path every round took before (``local_diff_max_rows=0``: diffs read by Spark tasks and
  checkpointed, lookups by Spark tasks, the result written by Spark tasks) — the baseline,

both on the same session and collections. Also timed, as the floor no runner goes below: the bare HTTP
work of a round from one Python process (diff of A, the changed users' amounts in B by ``getMany``, a
generation of C with a putMany and a commit). Prints the median seconds per round of each, the ratio of
the small-round path to the old one, where the small-round path spends its time (planning and starting
the round; the job: the user's function with its lookups, collecting and writing the result; the commit;
the check that finds C caught up), the load average, and how soon a watching runner plans a round after a
commit to a source. Also timed: the small-round path with the session's settings left alone
(``small_round_conf={}``: adaptive execution on, the session's shuffle partitions), the ratio saying what
:data:`~diffstore.spark.small_rounds.SMALL_ROUND_CONF` buys. Goal: <= 0.4 s for <= 1,000 changes.
Also counted (classic session): the Spark jobs and stages a small round runs (a job group per round,
read from ``statusTracker``) — each costs Spark's per-job planning and scheduling whatever its size.

Also timed, as the floor Spark itself sets for this job's shape on this machine: the **bare Spark
floor**, the same ``country_totals`` over the same small inputs already in the session as local
DataFrames (A's diff of the round, B's empty diff, B's amounts of A's changed users, C's totals; made
untimed with ``createDataFrame``, no diffstore at all), collected with ``toArrow`` under
``SMALL_ROUND_CONF``. Printed beside the small round with the ratio round / floor, and split as the
round's job is: ``fn`` (building its DataFrames; in the round also the lookups) and the result
(``toArrow``; in the round also the putMany).

``--connect`` then stops the local session, starts a Spark Connect server from pyspark's own ``bin/``
(``spark-submit --class …SparkConnectServer``, ``local[2]``, the settings of the tests' server) and times
the small-round path through it over the same collections: the ratio Connect / classic per size (goal
<= 2x). The two run one after the other (a process holds one kind of session), so the load average of
each is printed with it. The machine is shared and noisy: compare ratios, not single runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "spark_a_plus_b"))

from _harness import diffstore_serve, load_average, machine  # noqa: E402
from job import country_totals  # noqa: E402

from diffstore.client import Client  # noqa: E402
from diffstore.rounds import next_generation_id  # noqa: E402

COUNTRIES = [b"DE", b"FR", b"JP", b"US", b"BR", b"IN", b"CN", b"GB"]
BATCH = 10_000


def user(i: int) -> bytes:
    return b"user%09d" % i


def commit(client: Client, name: str, items: list[tuple[bytes, bytes]]) -> bytes:
    """One generation of ``name`` holding ``items``; returns its id."""
    collection = client.collection(name)
    generation = next_generation_id(collection.generation_id)
    collection.start_generation(generation, abort_outdated=True)
    for start in range(0, len(items), BATCH):
        collection.put_many(items[start : start + BATCH], generation_id=generation)
    collection.commit_generation(generation)
    return generation


@contextmanager
def server(data: Path) -> Iterator[str]:
    """``diffstore serve`` in a child process; yields its URL once it answers."""
    with diffstore_serve(data, "--no-sync") as served:
        yield served.url


def watch_latency(spark: object, url: str, client: Client) -> float:
    """Median ms between the return of a commit to source B and a watching runner's next planned round."""
    from diffstore.spark import Transform

    planned: list[float] = []
    caught_up = threading.Event()

    def on_event(event: str, details: dict[str, object]) -> None:
        if event == "planned":
            planned.append(time.perf_counter())
        elif event == "caught_up":
            caught_up.set()

    stop = threading.Event()
    watcher = Transform(spark, url, "C", {"a": "A", "b": "B"}, country_totals, on_event=on_event)  # type: ignore[arg-type]
    thread = threading.Thread(target=lambda: watcher.run(watch=True, should_stop=stop.is_set), daemon=True)
    thread.start()
    gaps = []
    for i in range(5):
        assert caught_up.wait(120)
        time.sleep(0.5)  # let the runner settle into its long poll
        caught_up.clear()
        before = len(planned)
        commit(client, "B", [(user(i), b"%d" % (i + 2))])
        committed = time.perf_counter()
        deadline = time.monotonic() + 60
        while len(planned) == before and time.monotonic() < deadline:
            time.sleep(0.001)
        gaps.append((planned[before] - committed) * 1000)
    assert caught_up.wait(120)
    stop.set()
    thread.join(120)
    watcher.close()
    return statistics.median(gaps)


def bare_http_round(client: Client, since: bytes, target_counter: int) -> float:
    """The HTTP work of one round from this process, no Spark: seconds."""
    from diffstore.spark.lookup import get_many

    started = time.perf_counter()
    a, b, c = client.collection("A"), client.collection("B"), client.collection("C_bare")
    page = a.diff_page_columns(since, limit=10_000)
    b_at = b.generation_id
    amounts: dict[bytes, bytes] = {}
    get_many(b, b_at, sorted(page.keys), amounts)
    totals: dict[bytes, int] = {}
    for key, old, new in zip(page.keys, page.from_values, page.to_values, strict=True):
        amount = int(amounts.get(key, b"0"))
        if old is not None:
            totals[old] = totals.get(old, 0) - amount
        if new is not None:
            totals[new] = totals.get(new, 0) + amount
    generation = target_counter.to_bytes(8, "big")
    c.start_generation(generation, abort_outdated=True)
    c.put_many([(k, str(v).encode()) for k, v in sorted(totals.items())], generation_id=generation)
    c.commit_generation(generation)
    return time.perf_counter() - started


def floor_inputs(client: Client, since: bytes) -> dict[str, Any]:
    """What a round of A's changes since ``since`` works on, as Arrow tables: A's diff, B's (empty) diff,
    B's amounts of A's changed users, C's totals (the lookups' answers, every key each needs)."""
    import pyarrow as pa

    from diffstore.spark.lookup import get_many
    from diffstore.spark.schemas import DIFF_ARROW, LOOKUP_ARROW

    a, b, c = client.collection("A"), client.collection("B"), client.collection("C")
    columns: tuple[list[bytes], list[bytes | None], list[bytes | None]] = ([], [], [])
    cursor: str | None = None
    while True:  # every page of A's diff (one generation: no split range)
        page = a.diff_page_columns(since, limit=10_000, cursor=cursor)
        for column, part in zip(columns, (page.keys, page.from_values, page.to_values), strict=True):
            column.extend(part)
        cursor = page.cursor
        if cursor is None:
            break
    diff_a = pa.Table.from_arrays([pa.array(col, pa.binary()) for col in columns], schema=DIFF_ARROW)
    keys = sorted(columns[0])
    amounts: dict[bytes, bytes] = {}
    get_many(b, b.generation_id, keys, amounts)
    totals = c.query_page_columns(c.generation_id, limit=10_000)

    def lookup_table(ks: list[bytes], vs: list[bytes | None]) -> pa.Table:
        columns = [pa.array(ks, pa.binary()), pa.array(vs, pa.binary())]
        return pa.Table.from_arrays(columns, schema=LOOKUP_ARROW)

    return {
        "a": diff_a,
        "b": DIFF_ARROW.empty_table(),
        "lookup a": lookup_table([], []),
        "lookup b": lookup_table(keys, [amounts.get(k) for k in keys]),
        "lookup target": lookup_table(list(totals.keys), list(totals.values)),
    }


def spark_floor(spark: Any, tables: dict[str, Any]) -> tuple[float, float]:
    """The bare Spark floor of one round: ``country_totals`` over ``tables`` made local DataFrames
    (untimed), its result collected with ``toArrow``; returns (seconds of fn, seconds of toArrow)."""
    from diffstore.spark import TARGET
    from diffstore.spark.schemas import DIFF_SCHEMA, LOOKUP_SCHEMA
    from diffstore.spark.small_rounds import SMALL_ROUND_CONF, session_conf

    with session_conf(spark, SMALL_ROUND_CONF):
        diffs = {alias: spark.createDataFrame(tables[alias], DIFF_SCHEMA) for alias in ("a", "b")}
        answers = {
            alias: spark.createDataFrame(tables[f"lookup {name}"], LOOKUP_SCHEMA)
            for alias, name in (("a", "a"), ("b", "b"), (TARGET, "target"))
        }
        started = time.perf_counter()
        result = country_totals(spark, diffs, lambda alias, keys: answers[alias]).select("key", "value")
        built = time.perf_counter()
        result.toArrow()
        return built - started, time.perf_counter() - built


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per size and mode (median)")
    parser.add_argument("--sizes", default="10,1000,10000", help="changed records per round")
    parser.add_argument(
        "--warm",
        type=int,
        default=30,
        help="untimed rounds of 10 changes per mode first: the session is long-running (the JVM's full "
        "JIT, as a --watch transform's), which compiles Spark's hot paths over its first few dozen rounds "
        "(after 10, rounds of 1,000 changes still took 0.47-0.57 s; after 30, 0.33-0.41 s)",
    )
    parser.add_argument(
        "--connect",
        action="store_true",
        help="after the local session's rounds, time the small-round path through a Spark Connect server "
        "started here (pyspark's own bin/) and print the ratio to the local session's",
    )
    parser.add_argument(
        "--remote",
        metavar="sc://HOST:PORT",
        help="run the rounds through this Spark Connect server instead of a local session (its Python "
        "must import diffstore); compare with a run without it at the same load",
    )
    args = parser.parse_args()
    print(machine())
    n = args.records

    from diffstore.spark import Transform, connect_session, local_session

    with tempfile.TemporaryDirectory() as tmp, server(Path(tmp) / "data") as url:
        if args.remote:
            spark = connect_session(args.remote, "diffstore-bench-small-rounds")
        else:
            spark = local_session("diffstore-bench-small-rounds", long_running=True)
        client = Client(url, timeout_s=120.0)
        for name in ("A", "B", "C", "C_bare"):
            client.create_collection(name, manual=True)
        commit(client, "B", [(user(i), b"%d" % (1 + i % 997)) for i in range(n)])
        commit(client, "A", [(user(i), COUNTRIES[i % len(COUNTRIES)]) for i in range(n)])
        # holds back GC of A's changes until the bare round has read them again
        c_bare = client.collection("C_bare")
        c_bare.create_reader("a", "A", client.collection("A").generation_id)
        phases: list[tuple[str, float]] = []

        rows_read: dict[str, Any] = {}

        def on_event(event: str, details: dict[str, Any]) -> None:
            phases.append((event, time.perf_counter()))
            if event == "read":
                rows_read.update(details["rows_read"])

        sources = {"a": "A", "b": "B"}
        fn_seconds: list[float] = []

        def timed_fn(spark_: Any, diffs: Any, lookup: Any) -> Any:
            started = time.perf_counter()
            try:
                return country_totals(spark_, diffs, lookup)
            finally:
                fn_seconds.append(time.perf_counter() - started)

        transforms = {
            "small": Transform(
                spark, url, "C", sources, timed_fn, on_event=on_event, local_diff_max_rows=10_000
            ),
            "old": Transform(spark, url, "C", sources, country_totals, local_diff_max_rows=0),
            # the small-round path with the session's own settings (AQE, shuffle partitions) left alone
            "untuned": Transform(
                spark, url, "C", sources, country_totals, local_diff_max_rows=10_000, small_round_conf={}
            ),
        }
        transforms["old"].run()  # the initial round (all records)
        step = 0
        breakdown: dict[int, list[dict[str, float]]] = {}

        last_change: list[bytes] = []  # A's generation before the last change

        def change(changes: int) -> bytes:
            nonlocal step
            step += 1
            before = client.collection("A").generation_id
            commit(client, "A", [(user((i * 7919 + step) % n), COUNTRIES[step % 8]) for i in range(changes)])
            last_change[:] = [before]
            return before

        jobs: dict[int, list[tuple[int, int]]] = {}
        tracker = None if args.remote else spark.sparkContext.statusTracker()

        def timed_round(mode: str, changes: int) -> float:
            change(changes)
            phases.clear()
            rows_read.clear()
            fn_seconds.clear()
            group = f"round-{step}-{mode}"
            if tracker is not None:
                spark.sparkContext.setJobGroup(group, group)
            t = time.perf_counter()
            rounds = transforms[mode].run()
            elapsed = time.perf_counter() - t
            assert len(rounds) == 1, rounds
            if tracker is not None and mode == "small":
                ids = tracker.getJobIdsForGroup(group)
                stages = sum(len(info.stageIds) for j in ids if (info := tracker.getJobInfo(j)) is not None)
                jobs.setdefault(changes, []).append((len(ids), stages))
            if mode == "small":
                # each round reads exactly one change of A (more would measure another size)
                assert 0 < rows_read.get("a", 0) <= changes, (rows_read, changes)
                at = dict(phases)
                breakdown.setdefault(changes, []).append(
                    {
                        "plan+start": at["started"] - t,
                        "diff pages": at["read"] - at["started"],
                        "job (fn, lookups, write)": at["written"] - at["read"],
                        "of the job fn with its lookups": sum(fn_seconds),
                        "commit": at["committed"] - at["written"],
                        "caught-up check": at["caught_up"] - at["committed"],
                    }
                )
            return elapsed

        for _ in range(args.warm):  # warm every path (JIT, Python workers, connection pools)
            for mode in transforms:
                timed_round(mode, 10)
        breakdown.clear()
        jobs.clear()
        classic_small: dict[int, float] = {}
        print(f"{n:,} users in A and B; country_totals; server in a child process; median of {args.rounds}")
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (2 cores, shared)")
        for changes in (int(s) for s in args.sizes.split(",")):
            times: dict[str, list[float]] = {"small": [], "old": [], "untuned": [], "bare": []}
            floor_parts: list[tuple[float, float]] = []
            for _ in range(args.rounds):
                for mode in transforms:  # alternate, so that load changes hit both alike
                    times[mode].append(timed_round(mode, changes))
                # the bare round and the floor redo the change the last round consumed: a change of
                # their own would leave A ahead of C, and the next round would read two changes
                since = last_change[0]
                times["bare"].append(bare_http_round(client, since, 1_000_000 + step))
                if not args.remote:
                    floor_parts.append(spark_floor(spark, floor_inputs(client, since)))
                c_bare.update_reader("a", client.collection("A").generation_id)
            small, old, untuned, bare = (
                statistics.median(times[m]) for m in ("small", "old", "untuned", "bare")
            )
            print(
                f"{changes:>7,} changes: small-round path {small:6.2f}s   old path {old:6.2f}s   "
                f"ratio {small / old:.2f}x   untuned session {untuned:6.2f}s ratio {small / untuned:.2f}x   "
                f"(bare HTTP floor {bare:5.2f}s)"
            )
            parts = {k: statistics.median(p[k] for p in breakdown[changes]) for k in breakdown[changes][0]}
            print("          small-round path: " + ", ".join(f"{k} {v:.2f}s" for k, v in parts.items()))
            if floor_parts:
                floor = statistics.median(f + r for f, r in floor_parts)
                built, collected = (statistics.median(p[i] for p in floor_parts) for i in (0, 1))
                print(
                    "          bare Spark floor (country_totals over local DataFrames + toArrow) "
                    f"{floor:.2f}s "
                    f"(fn {built:.2f}s, toArrow {collected:.2f}s): small round / floor {small / floor:.2f}x"
                    + ("   -- the floor itself is above the 0.4 s goal" if floor > 0.4 else "")
                )
            if changes in jobs:
                counted = sorted(set(jobs[changes]))
                print(
                    "          Spark jobs (stages) per small round: "
                    + ", ".join(f"{j} ({st})" for j, st in counted)
                )
            classic_small[changes] = small
        latency = watch_latency(spark, url, client)
        print(f"--watch: {latency:.0f} ms from a commit to B (the second source) to the next round's plan")
        print("  (median of 5; goal <= 100 ms)")
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        for transform in transforms.values():
            transform.close()
        spark.stop()
        if args.connect and not args.remote:
            connect_rounds(Path(tmp), url, client, change, classic_small, args.sizes, args.rounds, args.warm)
        client.close()
    return 0


def connect_rounds(
    work: Path,
    url: str,
    client: Client,
    change: Any,
    classic: dict[int, float],
    sizes: str,
    rounds: int,
    warm: int,
) -> None:
    """The small-round path through a Spark Connect server (``local[2]``) started from pyspark's own
    ``bin/`` as the tests start theirs; prints seconds per round and the ratio to ``classic``."""
    sys.path.insert(0, str(ROOT / "tests" / "spark"))
    from clusters import connect_server

    from diffstore.spark import Transform, connect_session
    from diffstore.spark.session import DATAFRAME_DEBUGGING, LONG_RUNNING_JAVA_OPTIONS

    # a long-running server, as the local session is: the full JIT, PySpark's DataFrame debugging off
    # (a static setting of the server, which its clients read)
    long_running = {"spark.driver.extraJavaOptions": LONG_RUNNING_JAVA_OPTIONS, DATAFRAME_DEBUGGING: "false"}
    with connect_server(work / "connect", "local[2]", settings=long_running) as served:
        spark = connect_session(served.remote, "diffstore-bench-small-rounds-connect")
        transform = Transform(
            spark, url, "C", {"a": "A", "b": "B"}, country_totals, local_diff_max_rows=10_000
        )
        transform.run()  # catch up with the local session's last rounds

        def timed(changes: int) -> float:
            change(changes)
            t = time.perf_counter()
            assert len(transform.run()) == 1
            return time.perf_counter() - t

        for _ in range(warm):  # warm the server's session (its JIT) and Python workers
            timed(10)
        print(f"Spark Connect (local[2] server, same collections); load average {load_average()}")
        for changes in (int(s) for s in sizes.split(",")):
            median = statistics.median(timed(changes) for _ in range(rounds))
            print(
                f"{changes:>7,} changes: small-round path through Connect {median:6.2f}s   "
                f"local session {classic[changes]:6.2f}s   ratio {median / classic[changes]:.2f}x "
                f"(goal <= 2x; load average {load_average()})"
            )
        transform.close()
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
