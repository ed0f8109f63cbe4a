"""What a scrape of reader lag costs: ``overview.overview`` (the /overview route and every /metrics scrape).

    .venv/bin/python benchmarks/overview_lag.py [--readers 100] [--generations 20000]

Builds a store whose collection ``src`` has G committed generations and R readers spread evenly over them
(the farthest G behind). Printed, in milliseconds: the baseline -- the old way, one walk over the gens
index per reader from its position to the current generation (the sum of the lags), measured in this run
-- then the first overview (one walk for every reader: the largest lag), a repeat with nothing written
(the cached snapshot), and one after a commit (one generation more per reader), each with its ratio to the
baseline. The machine is shared with other jobs: figures move between runs (print the load average too).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _harness import machine  # noqa: E402

from diffstore.engine import layout, overview  # noqa: E402
from diffstore.engine.store import Store  # noqa: E402
from diffstore.engine.tables import load_meta, resolve_seq  # noqa: E402
from diffstore.engine.types import StoreConfig  # noqa: E402


def baseline(store: Store) -> float:
    """The old count: one walk per reader from its position up to the current generation."""
    started = time.perf_counter()
    tables = store.tables
    with store.read() as txn:
        meta = load_meta(txn, tables, "src")
        last = layout.gen_key(meta.cid_prefix, meta.generation_seq)
        for reader in store.collection("c").readers():
            after = max(resolve_seq(txn, tables, meta, reader.generation_id or b""), 0)
            cursor = txn.cursor(db=tables.gens)
            if cursor.set_range(layout.gen_key(meta.cid_prefix, after + 1)):
                for key in cursor.iternext(values=False):
                    if key > last:
                        break
    return time.perf_counter() - started


def timed(store: Store) -> float:
    started = time.perf_counter()
    overview.overview(store)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--readers", type=int, default=100)
    parser.add_argument("--generations", type=int, default=20_000)
    args = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory() as directory:
        with Store.open(directory, StoreConfig(background=False, sync=False)) as store:
            src = store.create_collection("src")
            owner = store.create_collection("c")
            for g in range(args.generations + 1):
                src.start_generation(b"%08d" % g)
                src.commit_generation(b"%08d" % g)
            for n in range(args.readers):
                owner.create_reader(f"r{n}", "src", b"%08d" % (n * args.generations // args.readers))
            base = baseline(store)
            first = timed(store)
            repeat = timed(store)
            src.start_generation(b"%08d" % (args.generations + 1))
            src.commit_generation(b"%08d" % (args.generations + 1))
            after_commit = timed(store)
    load = os.getloadavg()[0]
    print(f"load average {load:.1f}; {args.readers} readers over {args.generations} generations")
    print(f"baseline (a walk per reader)  {base * 1000:9.2f} ms")
    for label, seconds in (("first overview", first), ("repeat, nothing written", repeat),
                           ("after one commit", after_commit)):  # fmt: skip
        print(f"{label:<29} {seconds * 1000:9.2f} ms   {seconds / base:.4f}x the baseline")


if __name__ == "__main__":
    main()
