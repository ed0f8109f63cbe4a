"""A+B→C on Spark, end to end: load A and B, run the transform, change A and B, run again, print C.

    python examples/spark_a_plus_b/run.py                 # starts its own server over a temporary store
    python examples/spark_a_plus_b/run.py --url http://127.0.0.1:3030   # or uses a running one

A: user → country, B: user → purchase amount, C: country → total amount (see job.py), in the manual
collections users_country, users_amount and country_total. With --url they are removed at the end
(--keep leaves them); a name that already exists there stops the run before anything is written.
Exit code 0 when C matches a from-scratch recomputation after every run of the transform.
"""

from __future__ import annotations

import argparse
import random
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

from job import country_totals, recompute  # noqa: E402

from diffstore.client import Client, Collection  # noqa: E402
from diffstore.spark import Transform, local_session  # noqa: E402

COUNTRIES = ["DE", "FR", "JP", "US", "BR", "IN"]
NAMES = {"A": "users_country", "B": "users_amount", "C": "country_total"}


@contextmanager
def embedded_server() -> Iterator[str]:
    """A diffstore server over a temporary store, in a thread of this process."""
    import uvicorn

    from diffstore import Store
    from diffstore.server import ServerConfig, create_app

    with tempfile.TemporaryDirectory() as data, Store.open(data) as store:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        app = create_app(store, ServerConfig(port=port))
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the embedded server did not start")
            time.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True
            thread.join(timeout=30)


def write_generation(collection: Collection, items: list[tuple[bytes, bytes | None]]) -> None:
    """One generation of a manual collection: start, putMany, commit."""
    counter = int.from_bytes(collection.generation_id.ljust(8, b"\0")[:8], "big") + 1
    generation = counter.to_bytes(8, "big")
    collection.start_generation(generation)
    collection.put_many(items, generation_id=generation)
    collection.commit_generation(generation)


def contents(collection: Collection) -> dict[bytes, bytes]:
    return {record.key: record.value for record in collection.query()}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="a running diffstore server (default: start one)")
    parser.add_argument("--users", type=int, default=2_000)
    parser.add_argument("--changes", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="with --url: leave the collections on the server")
    args = parser.parse_args()
    if args.url:
        return run(args.url, args)
    with embedded_server() as url:
        return run(url, args)


def run(url: str, args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    names = NAMES
    with Client(url) as client:
        taken = sorted(set(names.values()) & {info.name for info in client.collections()})
        if taken:
            print(f"{', '.join(taken)} already on {url}: remove them (diffstore collections rm NAME)")
            return 1
        created: list[str] = []
        try:
            for name in names.values():
                client.create_collection(name, manual=True)
                created.append(name)
            return run_transforms(url, client, names, rng, args)
        finally:
            if not args.keep:
                for name in created:  # what this run created, and only that
                    client.delete_collection(name)


def user(i: int) -> bytes:
    return f"user{i:06d}".encode()


def run_transforms(
    url: str, client: Client, names: dict[str, str], rng: random.Random, args: argparse.Namespace
) -> int:
    """Loads A and B, runs the transform, changes A and B, runs it again; 0 if C was right both times."""
    a, b, c = (client.collection(names[x]) for x in "ABC")
    write_generation(a, [(user(i), rng.choice(COUNTRIES).encode()) for i in range(args.users)])
    write_generation(b, [(user(i), str(rng.randint(1, 500)).encode()) for i in range(args.users)])
    print(f"loaded {args.users} users into {names['A']} and {names['B']}")

    spark = local_session("spark-a-plus-b")
    transform = Transform(spark, url, names["C"], {"a": names["A"], "b": names["B"]}, country_totals)
    matched = True
    try:
        for label in ("initial load", "after random updates and deletes"):
            for stats in transform.run():
                print(
                    f"round {label}: read {stats.rows_read}, wrote {stats.rows_written} "
                    f"in {stats.seconds:.1f}s"
                )
            totals = contents(c)
            print(f"C ({names['C']}) {label}:")
            for country, total in sorted(totals.items()):
                print(f"  {country.decode():4} {int(total):>10,}")
            right = totals == recompute(contents(a), contents(b))
            matched = matched and right
            print("  matches a from-scratch recomputation:", right)
            if label == "initial load":
                changes_a, changes_b = random_changes(rng, args)
                write_generation(a, sorted(changes_a.items()))
                write_generation(b, sorted(changes_b.items()))
                print(f"applied {len(changes_a)} changes to A and {len(changes_b)} to B")
    finally:
        transform.close()
        spark.stop()
    return 0 if matched else 1


def random_changes(
    rng: random.Random, args: argparse.Namespace
) -> tuple[dict[bytes, bytes | None], dict[bytes, bytes | None]]:
    """Updates and deletes of A and B, some of them to new users."""
    changes_a: dict[bytes, bytes | None] = {}
    changes_b: dict[bytes, bytes | None] = {}
    for _ in range(args.changes):
        who = user(rng.randrange(args.users + args.users // 10))  # some are new users
        roll = rng.random()
        if roll < 0.4:
            changes_a[who] = rng.choice(COUNTRIES).encode()  # moves the user's amount
        elif roll < 0.5:
            changes_a[who] = None  # deleted from A: the user's amount leaves C
        elif roll < 0.9:
            changes_b[who] = str(rng.randint(1, 500)).encode()
        else:
            changes_b[who] = None
    return changes_a, changes_b


if __name__ == "__main__":
    sys.exit(main())
