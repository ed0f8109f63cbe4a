"""The incremental case: one transform round over 1% changed keys vs recomputing C from parquet.

    python benchmarks/incremental.py [--keys 10000000] [--changed 0.001,0.01] [--repeat 3] [--warm 30]

Setup (untimed): ``diffstore serve`` in a child process; A (user → country) and B (user → amount) hold
``--keys`` users each, in diffstore and as parquet files; C = total amount per country, computed once and
stored with the transform's readers at A's and B's generations (what a first round would leave). Then
``--changed`` of A's users move to another country: committed to A, and written as a new parquet file of A
(several shares, comma-separated, run one after the other over the same set-up).

Timed, in the same warm SparkSession (long-running: ``local_session(long_running=True)``, the JVM's full
JIT, as a ``--watch`` transform's, warmed by ``--warm`` untimed rounds of 1,000 changes), alternately
``--repeat`` times (each time over a fresh change):

* incremental: ``Transform.run()`` with the example's ``country_totals`` — one round over A's diff (read by
  Spark tasks when above ``--local-diff-max-rows`` changes, else on the driver: a small round), B's
  amounts of the changed users looked up at the round's pinned generation, C's changes written and
  committed exactly once;
* recompute: ``spark.read.parquet`` of A and B, join, ``groupBy(country).sum(amount)``, collected.

After each round, its inputs read again over HTTP, one request after another, timed (A's diff pages, B's
amounts of the changed users by ``getMany``, C's totals: ``small_rounds.floor_inputs``), and a timed **bare
Spark floor**: ``country_totals`` over those inputs already in the session as local DataFrames, its result
collected with ``toArrow`` (``small_rounds.spark_floor``). A round has at least that to do on Spark, so
recompute / floor bounds the ratio any round that runs the job on Spark can reach; recompute / (floor +
inputs read) bounds a round that reads its inputs one request after another before Spark runs the job
on them (the small rounds' way, except that a round's reads may overlap each other, as its lookups
fetched ahead do; they cannot overlap the job, whose DataFrames are made of the data read). Both are
printed beside the ratio.

Both answers are checked equal. Prints each round's breakdown (plan and start; the diffs read — on the
driver, or by Spark tasks and checkpointed; the job: the function, its lookups and the write; the commit;
the check that finds C caught up), the median seconds of each and the ratio (recompute / incremental,
how many times faster the incremental round is), and the load average: the machine is shared (2 cores,
other jobs running), so compare the ratio, not the seconds. Loading 10M keys takes minutes (two HTTP
loads and two parquet files of 10M rows); ``--keys`` runs it smaller.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "examples" / "spark_a_plus_b"))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from _harness import machine, round_phases  # noqa: E402
from job import country_totals  # noqa: E402
from small_rounds import COUNTRIES, floor_inputs, server, spark_floor, user  # noqa: E402

from diffstore.client import Client  # noqa: E402
from diffstore.rounds import source_reader  # noqa: E402

BATCH = 10_000
FLOOR_READER = "bench-floor"


def amount(i: int) -> int:
    return 1 + i % 997


def load(client: Client, name: str, generation: bytes, items: list[tuple[bytes, bytes]]) -> None:
    collection = client.collection(name)
    collection.start_generation(generation, abort_outdated=True)
    for start in range(0, len(items), BATCH):
        collection.put_many(items[start : start + BATCH], generation_id=generation)
    collection.commit_generation(generation)


def write_parquet(path: Path, keys: list[bytes], column: str, values: list[Any], kind: pa.DataType) -> None:
    table = pa.table({"key": pa.array(keys, pa.binary()), column: pa.array(values, kind)})
    pq.write_table(table, path)


def main() -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--keys", type=int, default=10_000_000, help="users in A and B")
    parser.add_argument(
        "--changed",
        type=lambda text: [float(x) for x in text.split(",")],
        default=[0.01],
        help="share of A's users changed per round; several (0.001,0.01) run in turn over one set-up",
    )
    parser.add_argument("--repeat", type=int, default=3, help="timed rounds of each (median)")
    parser.add_argument("--partitions", type=int, default=4, help="Spark partitions of a large round's reads")
    parser.add_argument(
        "--warm",
        type=int,
        default=30,
        help="untimed rounds of 1,000 changes first (no recompute): the session is long-running, and the "
        "JVM's full JIT compiles Spark's hot paths over its first few dozen rounds",
    )
    parser.add_argument(
        "--local-diff-max-rows",
        type=int,
        default=None,
        help="Transform's local_diff_max_rows (default: its own): diffs up to it are read on the driver",
    )
    args = parser.parse_args()
    print(machine())
    n = args.keys

    from pyspark.sql import functions as F

    from diffstore.spark import Transform, local_session

    with tempfile.TemporaryDirectory() as tmp, server(Path(tmp) / "data") as url:
        started = time.perf_counter()
        client = Client(url, timeout_s=300.0)
        for name in ("A", "B", "C"):
            client.create_collection(name, manual=True)
        keys = [user(i) for i in range(n)]
        countries = [COUNTRIES[i % len(COUNTRIES)] for i in range(n)]
        load(client, "B", b"g0000001", [(k, b"%d" % amount(i)) for i, k in enumerate(keys)])
        load(client, "A", b"g0000001", list(zip(keys, countries, strict=True)))
        parquet = Path(tmp) / "parquet"
        parquet.mkdir()
        write_parquet(parquet / "B.parquet", keys, "amount", [amount(i) for i in range(n)], pa.int64())
        totals: dict[bytes, int] = {}
        for i, country in enumerate(countries):
            totals[country] = totals.get(country, 0) + amount(i)
        load(client, "C", b"g0000001", [(c, b"%d" % t) for c, t in sorted(totals.items())])
        c = client.collection("C")
        for alias, source in (("a", "A"), ("b", "B")):
            c.create_reader(source_reader(alias), source, client.collection(source).generation_id)
        print(f"setup: {n:,} users loaded in {time.perf_counter() - started:.0f}s", flush=True)

        spark = local_session("diffstore-bench-incremental", long_running=True)
        phases: list[tuple[str, float]] = []
        transform = Transform(
            spark,
            url,
            "C",
            {"a": "A", "b": "B"},
            country_totals,
            partitions=args.partitions,
            **({} if args.local_diff_max_rows is None else {"local_diff_max_rows": args.local_diff_max_rows}),
            on_event=lambda event, details: phases.append((event, time.perf_counter())),
        )

        def recompute() -> dict[bytes, int]:
            a = spark.read.parquet(str(parquet / "A.parquet"))
            b = spark.read.parquet(str(parquet / "B.parquet"))
            rows = a.join(b, "key").groupBy("country").agg(F.sum("amount").alias("total")).collect()
            return {bytes(r["country"]): int(r["total"]) for r in rows if r["total"]}

        def stored_c() -> dict[bytes, int]:
            return {r.key: int(r.value) for r in client.collection("C").query()}

        summary: list[str] = []
        step = 0

        def change(changes: int) -> None:
            """Moves ``changes`` of A's users to another country: committed to A (``countries`` follows)."""
            nonlocal step
            step += 1
            moved = [(i * 7919 + step * 104_729) % n for i in range(changes)]
            shift = 1 + step % (len(COUNTRIES) - 1)  # never a multiple of len(COUNTRIES): a real move
            for i in moved:
                countries[i] = COUNTRIES[(COUNTRIES.index(countries[i]) + shift) % len(COUNTRIES)]
            load(client, "A", b"g%07d" % (step + 2), [(keys[i], countries[i]) for i in moved])

        started = time.perf_counter()
        for _ in range(args.warm):  # the JIT compiles Spark's hot paths over a few dozen rounds
            change(1_000)
            transform.run()
        if args.warm:
            print(f"warm-up: {args.warm} rounds of 1,000 changes in {time.perf_counter() - started:.0f}s")
        for changed in args.changed:
            changes = max(1, int(n * changed))
            times: dict[str, list[float]] = {"incremental": [], "recompute": [], "floor": [], "read": []}
            for turn in range(args.repeat + 1):  # the first of each warms the session; not counted
                since = client.collection("A").generation_id
                # holds A's generation before the change from GC while the floor reads its diff
                client.collection("A").create_reader(FLOOR_READER, "A", since)
                change(changes)
                write_parquet(parquet / "A.parquet", keys, "country", countries, pa.binary())
                phases.clear()
                t = time.perf_counter()
                rounds = transform.run()
                incremental = time.perf_counter() - t
                breakdown = round_phases(phases, t, "diffs read", "job (fn, lookups, write)")
                assert len(rounds) == 1, rounds
                t = time.perf_counter()
                expected = recompute()
                full = time.perf_counter() - t
                assert stored_c() == expected, "the incremental C differs from the recomputed one"
                # after the round: its inputs (A's diff, the lookups' answers) read again over HTTP, one
                # request after another (timed alone: what a round must read), then the bare Spark floor
                t = time.perf_counter()
                inputs = floor_inputs(client, since)
                read = time.perf_counter() - t
                floor = sum(spark_floor(spark, inputs))
                client.collection("A").delete_reader(FLOOR_READER)
                if turn:
                    times["incremental"].append(incremental)
                    times["recompute"].append(full)
                    times["floor"].append(floor)
                    times["read"].append(read)
                print(
                    f"  round {step}: incremental {incremental:.2f}s, recompute {full:.2f}s, bare Spark floor"
                    f" {floor:.2f}s, its inputs read over HTTP {read:.2f}s",
                    flush=True,
                )
                print(
                    "    incremental: " + ", ".join(f"{k} {v:.2f}s" for k, v in breakdown.items()), flush=True
                )
            inc, full = statistics.median(times["incremental"]), statistics.median(times["recompute"])
            recompute_times, floors = times["recompute"], times["floor"]
            ceiling = statistics.median([r / f for r, f in zip(recompute_times, floors, strict=True)])
            reads = times["read"]
            with_reads = statistics.median(
                [r / (f + x) for r, f, x in zip(recompute_times, floors, reads, strict=True)]
            )
            summary.append(
                f"{n:,} users, {changes:,} changed ({changed:.1%}): incremental round {inc:.2f}s, "
                f"recompute from parquet {full:.2f}s, ratio {full / inc:.1f}x (median of {args.repeat}); "
                f"bare Spark floor {statistics.median(floors):.2f}s, recompute / floor {ceiling:.1f}x: the"
                " most a round that runs the job on Spark can reach; its inputs read over HTTP"
                f" {statistics.median(reads):.2f}s, recompute / (floor + inputs read) {with_reads:.1f}x: the"
                " most a round that reads its inputs one request after another, then runs the job on Spark,"
                " can reach"
            )
            print(summary[-1], flush=True)
        if len(summary) > 1:
            print("\n".join(summary))
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (2 cores, shared)")
        transform.close()
        client.close()
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
