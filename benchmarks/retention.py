"""What a retention policy costs: point reads on a collection with a policy against one without, and the
disk a kept history takes against none kept.

    .venv/bin/python benchmarks/retention.py [--generations 2000] [--keys 2000] [--reads 20000]

Two manual collections in one store get the same ``--generations`` commits, each rewriting 100 of ``--keys``
keys (100-byte values); a reader of each follows its current generation, so without a policy GC collects
every old version. One collection keeps the last ``--generations`` generations (``keepGenerations``: the
whole history); the other has no policy (the baseline). Measured in the same run: point reads per second
at the current generation (each read finds the readable floor, which with a policy is the retention floor:
walked once, then cached), and the bytes of live records each collection holds once GC is done (the cost
in disk), each beside its baseline. The machine is shared: compare the ratios, not the figures.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from _harness import machine, median, ratio_line

from diffstore import Store, StoreConfig
from diffstore.engine.types import RetentionPolicy


def fill(store: Store, name: str, policy: RetentionPolicy | None, generations: int, keys: int) -> None:
    c = store.create_collection(name, manual=True, retention=policy or RetentionPolicy())
    rng = random.Random(7)
    c.create_reader("r")
    for number in range(1, generations + 1):
        gen = b"%08d" % number
        c.start_generation(gen)
        chosen = sorted({rng.randrange(keys) for _ in range(100)})
        c.put_many([(b"key-%06d" % k, rng.randbytes(100)) for k in chosen], generation_id=gen)
        c.commit_generation(gen, update_readers=[("r", gen)])


def record_bytes(store: Store, name: str) -> int:
    """Bytes of the record rows (keys and values) the collection holds."""
    prefix = store.collection(name)._meta().records_prefix
    total = 0
    with store.read() as txn:
        cursor = txn.cursor(db=store.tables.records)
        if cursor.set_range(prefix):
            for key, value in cursor:
                if not key.startswith(prefix):
                    break
                total += len(key) + len(value)
    return total


def reads_per_second(store: Store, name: str, keys: int, reads: int) -> float:
    c = store.collection(name)
    rng = random.Random(11)
    wanted = [b"key-%06d" % rng.randrange(keys) for _ in range(reads)]
    started = time.perf_counter()
    for key in wanted:
        c.get(key)
    return reads / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generations", type=int, default=2000)
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--reads", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory() as directory:
        with Store.open(Path(directory), StoreConfig(background=False)) as store:
            fill(
                store, "kept", RetentionPolicy(keep_generations=args.generations), args.generations, args.keys
            )
            fill(store, "plain", None, args.generations, args.keys)
            while store.run_background_once():
                pass
            ours, base = [], []
            for _ in range(args.rounds):  # alternately, so load changes hit both alike
                ours.append(reads_per_second(store, "kept", args.keys, args.reads))
                base.append(reads_per_second(store, "plain", args.keys, args.reads))
            shape = f"{args.generations} generations of 100 keys rewritten among {args.keys}"
            print(f"{shape}, a reader at the current one")
            print(ratio_line("point reads, policy", median(ours), median(base), "reads/s", "goal: about 1"))
            kept, plain = record_bytes(store, "kept"), record_bytes(store, "plain")
            print(ratio_line("record bytes, policy", kept / 2**20, plain / 2**20, "MiB", "the history kept"))


if __name__ == "__main__":
    main()
