"""Small transform rounds in a warm session: seconds per round over 10, 1,000 and 10,000 changed records.

    python benchmarks/spark_rounds.py [--records 100000] [--rounds 3]

Setup (untimed): A (user → country) and B (user → amount) hold ``--records`` users each; the example's
``country_totals`` job brings C up to date, then one more small round warms the session. Timed: rounds
that each follow a commit of N changed users in A, alternately

* with small diffs read on the driver and handed to Spark as local data (``local_diff_max_rows``, the
  default) and
* without (``local_diff_max_rows=0``: every diff read by Spark tasks and checkpointed), the baseline,

both on the same session and collections. Prints the median seconds per round of each and their ratio.
Goal: ≤ 1.0 s for ≤ 1,000 changes. The machine is shared and noisy: compare ratios, not single runs.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "spark_a_plus_b"))

from job import country_totals  # noqa: E402

from diffstore.client import Client  # noqa: E402

COUNTRIES = [b"DE", b"FR", b"JP", b"US", b"BR", b"IN", b"CN", b"GB"]
BATCH = 10_000


def user(i: int) -> bytes:
    return b"user%09d" % i


def commit(client: Client, name: str, items: list[tuple[bytes, bytes]]) -> None:
    collection = client.collection(name)
    counter = int.from_bytes(collection.generation_id[:8].ljust(8, b"\0"), "big") + 1
    generation = counter.to_bytes(8, "big")
    collection.start_generation(generation)
    for start in range(0, len(items), BATCH):
        collection.put_many(items[start : start + BATCH], generation_id=generation)
    collection.commit_generation(generation)


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


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per size and mode (median)")
    parser.add_argument("--sizes", default="10,1000,10000", help="changed records per round")
    args = parser.parse_args()
    n = args.records

    import uvicorn

    from diffstore import Store
    from diffstore.server import ServerConfig, create_app
    from diffstore.spark import Transform, local_session

    with tempfile.TemporaryDirectory() as tmp, Store.open(Path(tmp) / "store") as store:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        server = uvicorn.Server(
            uvicorn.Config(
                create_app(store, ServerConfig(port=port)), host="127.0.0.1", port=port, log_level="warning"
            )
        )
        threading.Thread(target=server.run, daemon=True).start()
        while not server.started:
            time.sleep(0.01)
        url = f"http://127.0.0.1:{port}"
        spark = local_session("diffstore-bench-rounds")
        client = Client(url, timeout_s=120.0)
        for name in ("A", "B", "C"):
            client.create_collection(name, manual=True)
        commit(client, "B", [(user(i), b"%d" % (1 + i % 997)) for i in range(n)])
        commit(client, "A", [(user(i), COUNTRIES[i % len(COUNTRIES)]) for i in range(n)])
        transforms = {
            "local": Transform(spark, url, "C", {"a": "A", "b": "B"}, country_totals),
            "spark": Transform(spark, url, "C", {"a": "A", "b": "B"}, country_totals, local_diff_max_rows=0),
        }
        transforms["spark"].run()  # the initial round (100k changes)
        step = 0

        def timed_round(mode: str, changes: int) -> float:
            nonlocal step
            step += 1
            commit(client, "A", [(user((i * 7919 + step) % n), COUNTRIES[step % 8]) for i in range(changes)])
            t = time.perf_counter()
            rounds = transforms[mode].run()
            assert len(rounds) == 1, rounds
            return time.perf_counter() - t

        for mode in transforms:  # warm both paths
            timed_round(mode, 10)
        print(f"{n:,} users in A and B; country_totals; seconds per round (median of {args.rounds})")
        for changes in (int(s) for s in args.sizes.split(",")):
            times: dict[str, list[float]] = {"local": [], "spark": []}
            for _ in range(args.rounds):
                for mode in transforms:  # alternate, so that load changes hit both alike
                    times[mode].append(timed_round(mode, changes))
            local, spark_s = statistics.median(times["local"]), statistics.median(times["spark"])
            print(
                f"{changes:>7,} changes: local diffs {local:6.2f}s   Spark-read diffs {spark_s:6.2f}s   "
                f"ratio {local / spark_s:.2f}x"
            )
        latency = watch_latency(spark, url, client)
        print(f"--watch: {latency:.0f} ms from a commit to B (the second source) to the next round's plan")
        print("  (median of 5; goal <= 100 ms)")
        for transform in transforms.values():
            transform.close()
        client.close()
        spark.stop()
        server.should_exit = True
    return 0


if __name__ == "__main__":
    sys.exit(main())
