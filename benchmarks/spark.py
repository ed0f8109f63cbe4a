"""A+B→C on Spark: a round over N changed records in A, diffstore vs the same job over parquet.

    python benchmarks/spark.py [--records 1000000] [--workers N]

The server is ``diffstore serve --workers N`` in its own processes (default: as ``serve``'s default, the
number of CPUs, at most 8), so Spark's driver and executors do not share its interpreter.

Setup (untimed): B holds N users' amounts, A N users' countries; one transform round brings C up to
date. Then every user of A moves to another country (N changed records in one generation) and we time:

* diffstore: one transform round — diff A over HTTP by key range, look up B's amounts of the changed users,
  C's totals, aggregate, putMany into C's new generation, commit with reader updates. It runs on the
  same ``Transform`` as the setup's round, as a long-running runner would, so it reuses that round's key
  ranges (``splits_max_age_s``) instead of asking ``/splits`` again;
* parquet: the same ``country_totals`` job in the same session over the same inputs exported to parquet
  (A's and B's diffs; A, B and C as lookup tables joined in Spark), writing its result to parquet.

The parquet job runs once untimed first (the round's ``Transform`` is warm from the setup's round too),
then timed. Prints both wall times, the ratio (goal ≤ 1.2 with the default workers), rows/s, the load
average, and where the round's time goes (planning and starting it; reading the diff by Spark tasks and
checkpointing it; the job: ``fn``'s lookups, aggregation and the putMany tasks; the commit).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "spark_a_plus_b"))

from _harness import diffstore_serve, load_average, machine, round_phases  # noqa: E402
from job import country_totals  # noqa: E402
from small_rounds import BATCH, COUNTRIES, user  # noqa: E402

from diffstore.client import Client  # noqa: E402
from diffstore.server.cli import default_workers  # noqa: E402


def load(client: Client, name: str, generation: bytes, value_of: object, records: int) -> None:
    collection = client.collection(name)
    collection.start_generation(generation)
    for start in range(0, records, BATCH):
        items = [(user(i), value_of(i)) for i in range(start, min(records, start + BATCH))]  # type: ignore[operator]
        collection.put_many(items, generation_id=generation)
    collection.commit_generation(generation)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--workers", type=int, default=default_workers(), help="diffstore serve --workers")
    args = parser.parse_args()
    n = args.records

    from diffstore.spark import TARGET, Transform, local_session

    print(machine())
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        served = stack.enter_context(diffstore_serve(Path(tmp) / "store", "--workers", str(args.workers)))
        url = served.url
        print(f"diffstore serve --workers {args.workers}")
        spark = local_session("diffstore-bench")
        client = Client(url, timeout_s=120.0)
        for name in ("A", "B", "C"):
            client.create_collection(name, manual=True)
        g1, g2 = (1).to_bytes(8, "big"), (2).to_bytes(8, "big")
        t = time.perf_counter()
        load(client, "B", g1, lambda i: b"%d" % (1 + i % 997), n)
        load(client, "A", g1, lambda i: COUNTRIES[i % len(COUNTRIES)], n)
        print(f"loaded 2 x {n:,} records in {time.perf_counter() - t:.1f}s")
        phases: list[tuple[str, float]] = []
        transform = Transform(
            spark,
            url,
            "C",
            {"a": "A", "b": "B"},
            country_totals,
            partitions=args.partitions,
            on_event=lambda event, details: phases.append((event, time.perf_counter())),
        )
        t = time.perf_counter()
        transform.run()
        print(f"initial round (A and B from scratch): {time.perf_counter() - t:.1f}s")
        load(client, "A", g2, lambda i: COUNTRIES[(i + 1 + i % 3) % len(COUNTRIES)], n)

        # the same inputs as parquet, exported before the timed round moves C
        base = Path(tmp) / "parquet"
        diff_a = (
            spark.read.format("diffstore")
            .option("url", url)
            .option("collection", "A")
            .option("generationIdEncoding", "base64")
            .option("fromGenerationId", "AAAAAAAAAAE=")
            .option("toGenerationId", "AAAAAAAAAAI=")
            .option("partitions", str(args.partitions))
            .load()
        )
        diff_a.write.parquet(str(base / "diff_a"))
        spark.createDataFrame([], "key binary, fromValue binary, toValue binary").write.parquet(
            str(base / "diff_b")
        )
        for name in ("A", "B", "C"):
            spark.read.format("diffstore").option("url", url).option("collection", name).load().write.parquet(
                str(base / name)
            )

        phases.clear()
        print(f"load average before the round: {load_average()}")
        t = time.perf_counter()
        rounds = transform.run()
        diffstore_s = time.perf_counter() - t
        where = round_phases(
            phases, t, "diff read by Spark tasks + checkpoint", "job (lookups, aggregation, putMany tasks)"
        )
        assert len(rounds) == 1 and rounds[0].rows_read["a"] in (n, None), rounds

        tables = {
            alias: spark.read.parquet(str(base / name))
            for alias, name in (("a", "A"), ("b", "B"), (TARGET, "C"))
        }

        def lookup(alias: str, keys):  # type: ignore[no-untyped-def]
            return keys.select("key").join(tables[alias], "key", "left")

        def parquet_job() -> float:
            t = time.perf_counter()
            diffs = {
                "a": spark.read.parquet(str(base / "diff_a")),
                "b": spark.read.parquet(str(base / "diff_b")),
            }
            country_totals(spark, diffs, lookup).write.mode("overwrite").parquet(str(base / "out"))
            return time.perf_counter() - t

        parquet_job()  # warm, as the round's Transform is
        print(f"load average before the parquet job: {load_average()}")
        parquet_s = parquet_job()

        ratio = diffstore_s / parquet_s
        print(f"changed records in A: {n:,}")
        print(f"diffstore round: {diffstore_s:.2f}s  ({n / diffstore_s:,.0f} rows/s)")
        print(f"parquet job:     {parquet_s:.2f}s  ({n / parquet_s:,.0f} rows/s)")
        print(f"ratio: {ratio:.2f}x (goal <= 1.2x with the default workers)")
        print("the round: " + ", ".join(f"{k} {v:.2f}s" for k, v in where.items()))
        print(f"load average after: {load_average()}")
        transform.close()
        client.close()
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
