"""What recording lineage costs a commit with reader updates (issue 18).

    .venv/bin/python benchmarks/lineage_commit.py [--rounds 2000] [--readers 2] [--dir DIR]

A commit with ``updateReaders`` now also writes one lineage row per moved reader (and looks up whether the
reader's target is a collection), in the same transaction. This script measures, on an unsynced store (so
that fsync does not hide the difference), the median latency of the round a transform makes — start +
put_many of 10 keys + commit moving N readers — with lineage recorded, and the same rounds with the recording
switched off (``lineage.record`` patched to do nothing: the baseline, as before issue 18), interleaved in the
same run, and prints both medians and their ratio. It also times ``lineage(g)`` and
a depth-3 walk. The machine is shared and noisy: repeat a run before trusting a difference of a few percent.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

from _harness import machine

from diffstore import Store, StoreConfig
from diffstore.engine import lineage


def _after(generation_id: bytes) -> int:
    return int.from_bytes(generation_id or b"\x00", "big") + 1


def _rounds(store: Store, name: str, rounds: int, readers: int) -> list[float]:
    c = store.collection(name)
    sources = [store.collection(f"src{i}") for i in range(readers)]
    timings = []
    for _ in range(rounds):
        n = _after(c.generation_id)
        g = n.to_bytes(8, "big")
        updates = [(f"from_{i}", s.generation_id) for i, s in enumerate(sources)]
        started = time.perf_counter()
        c.start_generation(g)
        c.put_many([(b"k%d" % ((n * 7 + k) % 5000), b"v%d" % n) for k in range(10)], generation_id=g)
        c.commit_generation(g, updates)
        timings.append(time.perf_counter() - started)
        for s in sources:  # the sources move between rounds, as they would in a pipeline
            sg = _after(s.generation_id).to_bytes(8, "big")
            s.start_generation(sg)
            s.commit_generation(sg)
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    print(machine())
    root = Path(tempfile.mkdtemp(dir=args.dir))
    try:
        with Store.open(root / "store", StoreConfig(sync=False, background=False)) as store:
            for i in range(args.readers):
                store.create_collection(f"src{i}", manual=True)
            for name in ("with", "without"):
                target = store.create_collection(name, manual=True)
                for i in range(args.readers):
                    target.create_reader(f"from_{i}", collection=f"src{i}")
                    target.create_reader(f"keep_{name}_{i}", collection=f"src{i}")  # all generations stay
            with_readers = store.collection("with")
            # interleaved quarters, so that drift of the machine hits both alike
            moved, still = [], []
            for _ in range(4):
                moved += _rounds(store, "with", args.rounds // 4, args.readers)
                with mock.patch.object(lineage, "record", lambda *args: None):
                    still += _rounds(store, "without", args.rounds // 4, args.readers)
            last = with_readers.generation_id
            started = time.perf_counter()
            for _ in range(1000):
                with_readers.lineage(last)
            own = (time.perf_counter() - started) / 1000
            started = time.perf_counter()
            for _ in range(100):
                walk = with_readers.lineage(last, depth=3)
            deep = (time.perf_counter() - started) / 100
        with_ms, without_ms = statistics.median(moved) * 1000, statistics.median(still) * 1000
        print(f"round moving {args.readers} readers, lineage recorded: median {with_ms:.3f} ms")
        print(f"same round, recording off (baseline): median {without_ms:.3f} ms")
        print(f"ratio: {with_ms / without_ms:.2f}x")
        print(f"lineage(g): {own * 1e6:.0f} us; depth 3 walk ({len(walk.sources)} sources): ", end="")
        print(f"{deep * 1e6:.0f} us")
        print("(shared, noisy machine: repeat before trusting small differences)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
