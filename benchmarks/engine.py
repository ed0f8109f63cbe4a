"""Engine benchmarks (issues 2, 11 and 31): each figure beside its raw py-lmdb baseline, measured in one run.

    .venv/bin/python benchmarks/engine.py [--records 1000000] [--rounds 3] [--only bulk,small,diff,memory]
                                          [--quick] [--dir DIR] [--pure-python]

Figures (N records of ``key-%012d`` with 100-byte values; issue 31's table is printed at the end):
  small generation  start + put_many(1,000 keys spread evenly over N, every N/1000-th) + commit, durable,
                    vs one durable raw putmulti of the same keys into an N-key table   goal ratio <= 1.3
                    (and the same generations in one call, write_generation: one transaction, not three;
                    in a second store loaded alike)
                    (and its floors: LMDB alone writing the rows the engine writes for it -- records, and
                    its keys packed ~75 to a change_chunks row -- in one durable transaction, and in the
                    three the engine's API takes; the same for the per-key layout stores used before
                    change_chunks: records and a changes row per key, two B-tree inserts per key; and
                    for storage layout 1's longer record keys and the shortest conceivable ones -- each
                    way in an LMDB environment of its own; and the branch pages each records table ends
                    with)
  bulk load         put_many of N sorted records (10k batches, one generation) vs raw putmulti of the same
                    records, each round on empty stores                                goal ratio >= 0.8
                    (and the "packed floor": LMDB alone storing the rows the engine writes, built
                    beforehand; the "per-key floor": the same for the per-key layout's rows)
  diff throughput   diff over 100k changed keys vs a raw cursor scan of 100k records   goal ratio >= 0.5
                    (and the "read floor" and "item floor", below)
  diff scaling      diff of 1,000 changed keys spread evenly over N keys vs over 10k keys (each collection's
                    own key range: every N/1000-th key, every 10th)                    goal ratio <= 1.2
                    (and the same with the 1,000 keys side by side)
  diff memory       anonymous RSS growth while iterating a diff of N changes         goal <= 100 MB

``--quick`` is a fast check: 100k records, 2 rounds, fewer small generations (its size ratio compares 100k
with 10k keys, not 1M).

The engine's per-record hot loops run compiled when its optional accelerator was built (``make install``
builds it; the first line says which ran); ``--pure-python`` measures its pure-Python twins instead.

Each figure is measured several times, ours and the baseline side by side (on a shared machine both see the
same load); the medians are printed, and the load average at the start and the end.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import lmdb
from _harness import machine

from diffstore import Store, StoreConfig
from diffstore.engine import changes, layout
from diffstore.engine.tables import load_meta, resolve_seq
from diffstore.engine.types import DiffItem

BATCH = 10_000


def key(i: int) -> bytes:
    return b"key-%012d" % i  # 16 bytes


def value(i: int, salt: int = 0) -> bytes:
    return (b"%08d:%08d:" % (i, salt)).ljust(100, b"v")


def anon_rss_mb() -> float:
    """Anonymous resident memory (the heap), excluding LMDB's file-backed mapped pages."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return 0.0


def batches(n: int) -> Iterator[list[tuple[bytes, bytes]]]:
    """The records in batches, each built when asked (timings leave the building out)."""
    for lo in range(0, n, BATCH):
        yield [(key(i), value(i)) for i in range(lo, min(n, lo + BATCH))]


def load_collection(store: Store, name: str, n: int) -> float:
    coll = store.create_collection(name, manual=True)
    coll.start_generation(b"g0001")
    elapsed = 0.0
    for batch in batches(n):
        start = time.perf_counter()
        coll.put_many(batch, generation_id=b"g0001")
        elapsed += time.perf_counter() - start
    start = time.perf_counter()
    coll.commit_generation(b"g0001")
    return elapsed + time.perf_counter() - start


Rows = list[tuple[bytes, bytes]]


def layout_rows(batch: Rows, seq: int = 1) -> tuple[Rows, Rows]:
    """The rows of the per-key layout (stores written before ``change_chunks``) for a batch of short keys in
    a collection's generation ``seq``: ``records`` (rcid | K | rseq -> 01 value) and ``changes`` (cid | seq |
    K -> b"")."""
    cid, rcid = layout.cid_bytes(1), layout.records_prefix(1)
    records = [
        (layout.record_key(rcid, layout.key_form(k), seq), layout.encode_value(k, v)) for k, v in batch
    ]
    changes = [(layout.change_key(cid, seq, layout.key_form(k)), b"") for k, _ in batch]
    return records, changes


def packed_layout_rows(batch: Rows, seq: int = 1) -> tuple[Rows, Rows]:
    """The rows the engine writes for a batch of short keys appended to a generation (layout.py):
    ``records``, and the batch's sorted key forms packed into ``change_chunks`` rows -- one B-tree insert
    per ~75 keys instead of a ``changes`` row per key."""
    cid, rcid = layout.cid_bytes(1), layout.records_prefix(1)
    records = [
        (layout.record_key(rcid, layout.key_form(k), seq), layout.encode_value(k, v)) for k, v in batch
    ]
    return records, layout.chunk_rows(cid, seq, sorted(layout.key_form(k) for k, _ in batch))


@dataclass
class BulkRounds:
    """Per round, each on empty stores: seconds of each way to load the N records, and raw's CPU time
    (``time.process_time``: what the fsyncs leave out, which dominate the wall time on a loaded machine)
    over each way's."""

    ours: list[float] = field(default_factory=list)
    raw: list[float] = field(default_factory=list)
    floor: list[float] = field(default_factory=list)  # the per-key layout's rows
    packed: list[float] = field(default_factory=list)  # the rows the engine writes (packed)
    cpu_ratios: list[float] = field(default_factory=list)
    floor_cpu_ratios: list[float] = field(default_factory=list)
    packed_cpu_ratios: list[float] = field(default_factory=list)
    commits: list[float] = field(default_factory=list)  # our final commit (inside ``ours``)


def bulk_rounds(root: Path, n: int, rounds: int) -> BulkRounds:
    """Batch by batch, raw putmulti, then the "per-key floor" (raw putmultis, in append mode, of the rows
    the per-key layout stores, built before the clock starts: what LMDB alone costs for them), then the
    same for the rows the engine writes (the "packed floor"), then put_many of the same batch: on a shared
    machine all four see the same load.
    """
    figures = BulkRounds()
    for index in range(rounds):
        env = lmdb.open(str(root / f"raw{index}"), map_size=1 << 36, max_dbs=2)
        db = env.open_db(b"t")
        floor_env = lmdb.open(str(root / f"floor{index}"), map_size=1 << 36, max_dbs=2)
        floor_records, floor_changes = floor_env.open_db(b"records"), floor_env.open_db(b"changes")
        packed_env = lmdb.open(str(root / f"packed{index}"), map_size=1 << 36, max_dbs=2)
        packed_records, packed_changes = packed_env.open_db(b"records"), packed_env.open_db(b"changes")
        path = root / f"bulk{index}"
        with Store.open(path, StoreConfig(background=False)) as store:
            coll = store.create_collection("big", manual=True)
            coll.start_generation(b"g0001")
            seconds = [0.0] * 4  # raw, floor, packed, ours
            cpus = [0.0] * 4
            for batch in batches(n):
                record_rows, change_rows = layout_rows(batch)
                _, packed_rows = packed_layout_rows(batch)
                marks = [(time.perf_counter(), time.process_time())]
                with env.begin(write=True) as txn:
                    txn.cursor(db=db).putmulti(batch)
                marks.append((time.perf_counter(), time.process_time()))
                with floor_env.begin(write=True) as txn:
                    txn.cursor(db=floor_records).putmulti(record_rows, append=True)
                    txn.cursor(db=floor_changes).putmulti(change_rows, append=True)
                marks.append((time.perf_counter(), time.process_time()))
                with packed_env.begin(write=True) as txn:
                    txn.cursor(db=packed_records).putmulti(record_rows, append=True)
                    txn.cursor(db=packed_changes).putmulti(packed_rows, append=True)
                marks.append((time.perf_counter(), time.process_time()))
                coll.put_many(batch, generation_id=b"g0001")
                marks.append((time.perf_counter(), time.process_time()))
                for way in range(4):
                    seconds[way] += marks[way + 1][0] - marks[way][0]
                    cpus[way] += marks[way + 1][1] - marks[way][1]
            start = time.perf_counter()
            coll.commit_generation(b"g0001")
            figures.commits.append(time.perf_counter() - start)
            seconds[3] += figures.commits[-1]
        for opened in (env, floor_env, packed_env):
            opened.close()
        for name in (f"raw{index}", f"floor{index}", f"packed{index}", f"bulk{index}"):
            shutil.rmtree(root / name)
        figures.raw.append(seconds[0])
        figures.floor.append(seconds[1])
        figures.packed.append(seconds[2])
        figures.ours.append(seconds[3])
        figures.floor_cpu_ratios.append(cpus[0] / cpus[1])
        figures.packed_cpu_ratios.append(cpus[0] / cpus[2])
        figures.cpu_ratios.append(cpus[0] / cpus[3])
    return figures


def change_keys(coll_name: str, store: Store, generation_id: bytes, indices: list[int]) -> None:
    coll = store.collection(coll_name)
    coll.start_generation(generation_id)
    coll.put_many([(key(i), value(i, 7)) for i in indices], generation_id=generation_id)
    coll.commit_generation(generation_id)


def spread(size: int, offset: int, count: int = 1000) -> list[int]:
    """``count`` indices spread evenly over ``range(size)``: every ``size // count``-th, from ``offset``."""
    stride = size // count
    return [j * stride + offset % stride for j in range(count)]


def short_layout_rows(batch: Rows, seq: int = 1) -> tuple[Rows, Rows]:
    """The rows of the shortest versioned layout (none of ours: the least any layout that keeps a row per
    version could write): ``records`` keyed by the key itself and a 2-byte generation seq (18 bytes for these
    keys), and the engine's ``change_chunks`` rows."""
    records = [(k + seq.to_bytes(2, "big"), layout.encode_value(k, v)) for k, v in batch]
    return records, packed_layout_rows(batch, seq)[1]


def layout_1_rows(batch: Rows, seq: int = 1) -> tuple[Rows, Rows]:
    """The rows storage layout 1 wrote (before session 21; engine/migrate.py): the engine's, with records
    keys cid(u32) | K | seq(u64) -- 30 bytes for these keys, where the engine's are 23 (rcid | K | rseq)."""
    records = [
        (layout.record_key_of_layout_1(1, layout.key_form(k), seq), layout.encode_value(k, v))
        for k, v in batch
    ]
    return records, packed_layout_rows(batch, seq)[1]


@dataclass
class SmallGenerations:
    """Seconds per round of each way to write one small generation, side by side; and the branch pages of
    the records table each layout floor ended with."""

    ours: list[float] = field(default_factory=list)  # start + put_many + commit
    ours_one: list[float] = field(default_factory=list)  # write_generation, in a store of its own
    put_many: list[float] = field(default_factory=list)  # put_many alone
    raw: list[float] = field(default_factory=list)  # one raw putmulti of the same pairs
    floor_one: list[float] = field(default_factory=list)  # the per-key layout's rows, one transaction
    floor_three: list[float] = field(default_factory=list)  # the per-key layout's rows, three transactions
    packed_one: list[float] = field(default_factory=list)  # the engine's rows, one transaction
    packed_three: list[float] = field(default_factory=list)  # the engine's rows, three transactions
    short_one: list[float] = field(default_factory=list)  # the shortest layout's rows, one transaction
    layout_1_one: list[float] = field(default_factory=list)  # storage layout 1's rows, one transaction
    ours_cpu: list[float] = field(default_factory=list)
    floor_three_cpu: list[float] = field(default_factory=list)
    raw_cpu: list[float] = field(default_factory=list)
    branch_pages: dict[str, int] = field(default_factory=dict)


class AloneFloor:
    """LMDB alone writing one layout's rows for each small generation, in an environment of its own.

    One environment per way, because LMDB reuses the pages that earlier transactions freed: how many of a
    transaction's writes land on scattered reused pages (a write call each) depends on the transactions
    before it, so two ways interleaved in one environment each pay for the other's pattern (measured: a
    one-transaction floor sharing its environment with a three-transaction one took 1.2-1.3x raw; alone,
    1.6-1.8x, the engine's own figure -- see RESULTS.md, session 21).
    """

    def __init__(self, path: Path, rows: Callable[[Rows, int], tuple[Rows, Rows]], transactions: int) -> None:
        self.rows, self.transactions = rows, transactions
        self.env = lmdb.open(str(path), map_size=1 << 36, max_dbs=4)
        self.records, self.changes = self.env.open_db(b"records"), self.env.open_db(b"changes")
        self.meta = self.env.open_db(b"meta")

    def load(self, batch: Rows) -> None:
        record_rows, change_rows = self.rows(batch, 1)
        with self.env.begin(write=True) as txn:
            txn.cursor(db=self.records).putmulti(record_rows, append=True)
            txn.cursor(db=self.changes).putmulti(change_rows, append=True)

    def write(self, items: Rows, seq: int, generation: bytes) -> float:
        """Seconds to write the rows of generation ``seq`` (built first), durable, in one transaction or
        in three (a metadata row, the rows, a metadata row: the transactions of start_generation, put_many
        and commit_generation)."""
        record_rows, change_rows = self.rows(items, seq)
        start = time.perf_counter()
        if self.transactions == 3:
            with self.env.begin(write=True) as txn:
                txn.put(b"meta", generation + b"open", db=self.meta)
        with self.env.begin(write=True) as txn:
            txn.cursor(db=self.records).putmulti(record_rows)
            txn.cursor(db=self.changes).putmulti(change_rows, append=True)
        if self.transactions == 3:
            with self.env.begin(write=True) as txn:
                txn.put(b"meta", generation + b"committed", db=self.meta)
        return time.perf_counter() - start

    def branch_pages(self) -> int:
        with self.env.begin() as txn:
            return int(txn.stat(self.records)["branch_pages"])

    def close(self) -> None:
        self.env.close()


def small_generations(
    root: Path, store: Store, one_store: Store, name: str, n: int, rounds: int
) -> SmallGenerations:
    """Rounds of one generation of 1,000 keys spread evenly over the N-key collection ``name``, durable.

    Beside each: one durable raw putmulti of the same pairs into a table of the same N pairs (raw), and
    the "layout floors" (:class:`AloneFloor`): LMDB alone writing the rows a layout needs for them, into
    tables holding the same N keys' rows -- the engine's (:func:`packed_layout_rows`) in one transaction
    and in three, the per-key layout's (:func:`layout_rows`) the same, and the shortest layout's
    (:func:`short_layout_rows`) and storage layout 1's (:func:`layout_1_rows`) in one.
    """
    raw_env = lmdb.open(str(root / "small-raw"), map_size=1 << 36, max_dbs=2)
    raw_db = raw_env.open_db(b"t")
    floors = {
        "per-key-one": AloneFloor(root / "small-per-key-one", layout_rows, 1),
        "per-key-three": AloneFloor(root / "small-per-key-three", layout_rows, 3),
        "packed-one": AloneFloor(root / "small-packed-one", packed_layout_rows, 1),
        "packed-three": AloneFloor(root / "small-packed-three", packed_layout_rows, 3),
        "short-one": AloneFloor(root / "small-short-one", short_layout_rows, 1),
        "layout-1-one": AloneFloor(root / "small-layout-1-one", layout_1_rows, 1),
    }
    for batch in batches(n):
        with raw_env.begin(write=True) as txn:
            txn.cursor(db=raw_db).putmulti(batch, append=True)
        for floor in floors.values():
            floor.load(batch)
    coll = store.collection(name)
    # The same generations in one call (write_generation) go to a store of their own, loaded alike, for
    # the reason AloneFloor gives.
    one_call = one_store.collection(name)
    figures = SmallGenerations()
    for r in range(rounds):
        items = [(key(i), value(i, r + 1)) for i in spread(n, r + 1)]
        gen = b"g1%05d" % r

        start, cpu = time.perf_counter(), time.process_time()
        with raw_env.begin(write=True) as txn:
            txn.cursor(db=raw_db).putmulti(items)
        figures.raw.append(time.perf_counter() - start)
        figures.raw_cpu.append(time.process_time() - cpu)

        figures.floor_one.append(floors["per-key-one"].write(items, 2 + r, gen))
        cpu = time.process_time()
        figures.floor_three.append(floors["per-key-three"].write(items, 2 + r, gen))
        figures.floor_three_cpu.append(time.process_time() - cpu)
        figures.packed_one.append(floors["packed-one"].write(items, 2 + r, gen))
        figures.packed_three.append(floors["packed-three"].write(items, 2 + r, gen))
        figures.short_one.append(floors["short-one"].write(items, 2 + r, gen))
        figures.layout_1_one.append(floors["layout-1-one"].write(items, 2 + r, gen))

        start, cpu = time.perf_counter(), time.process_time()
        coll.start_generation(gen)
        middle = time.perf_counter()
        coll.put_many(items, generation_id=gen)
        put_done = time.perf_counter()
        coll.commit_generation(gen)
        figures.ours.append(time.perf_counter() - start)
        figures.ours_cpu.append(time.process_time() - cpu)
        figures.put_many.append(put_done - middle)

        start = time.perf_counter()
        one_call.write_generation(gen, items)
        figures.ours_one.append(time.perf_counter() - start)
    with raw_env.begin() as txn:
        figures.branch_pages["raw"] = int(txn.stat(raw_db)["branch_pages"])
    raw_env.close()
    shutil.rmtree(root / "small-raw")
    for floor_name, floor in floors.items():
        figures.branch_pages[floor_name] = floor.branch_pages()
        floor.close()
        shutil.rmtree(root / f"small-{floor_name}")
    return figures


def diff_once(store: Store, name: str, from_gen: bytes, to_gen: bytes) -> float:
    coll = store.collection(name)
    start = time.perf_counter()
    count = sum(1 for _ in coll.diff(from_generation_id=from_gen, to_generation_id=to_gen))
    elapsed = time.perf_counter() - start
    assert count > 0
    return elapsed


def seek_floor(store: Store, name: str, indices: list[int]) -> float:
    """What LMDB alone pays to reach the versions the keyed way of a diff reads for these keys: a seek to
    each key's record head and a step to its second version (py-lmdb's ``set_range``, ``next`` and
    ``item``), nothing compared or built -- in the engine's own records table."""
    with store.read() as txn:
        prefix = load_meta(txn, store.tables, name).records_prefix
        heads = [layout.record_head(prefix, layout.key_form(key(i))) for i in indices]
        records = txn.cursor(db=store.tables.records)
        set_range, step, item = records.set_range, records.next, records.item
        start = time.perf_counter()
        for head in heads:
            set_range(head)
            item()
            step()
            item()
        return time.perf_counter() - start


def raw_scan_once(store: Store, count: int) -> float:
    with store.env.begin() as txn:
        start = time.perf_counter()
        seen = 0
        for _k, _v in txn.cursor(db=store.tables.records):
            seen += 1
            if seen == count:
                break
        return time.perf_counter() - start


def read_floor(store: Store, name: str, generation_id: bytes, count: int) -> tuple[float, float, float]:
    """The least any diff over this layout must read per changed key, iterated with nothing built and
    nothing compared: (its entry in the run of the generation (engine/changes.py) and its two versions in
    ``records``, adjacent here -- the keyed way; only the two versions -- the scan; the same two consumed
    by a C-level loop, ``collections.deque``, as the compiled scan consumes them: what py-lmdb's iterator
    alone costs any loop, a tuple and two bytes objects per record, with no Python step per record)."""

    def once() -> tuple[float, float, float]:
        with store.read() as txn:
            meta = load_meta(txn, store.tables, name)
            seq = resolve_seq(txn, store.tables, meta, generation_id)
            start = time.perf_counter()
            forms = changes.forms(txn, store.tables, meta.cid_prefix, seq)
            read = sum(1 for _ in itertools.islice(forms, count))
            middle = time.perf_counter()
            records = txn.cursor(db=store.tables.records)
            records.set_range(meta.records_prefix)
            read += sum(1 for _ in itertools.islice(records.iternext(), 2 * count))
            end = time.perf_counter()
            assert read == 3 * count
            records.set_range(meta.records_prefix)
            c_start = time.perf_counter()
            collections.deque(itertools.islice(records.iternext(), 2 * count), maxlen=0)
            return end - start, end - middle, time.perf_counter() - c_start

    return once()


def item_floor(store: Store, name: str, count: int) -> float:
    """The least a diff written in Python costs per changed key here: step over its two versions (adjacent
    in this benchmark's layout) and build the item from slices of them, with no comparison at all -- what
    is left when every check of the real loop is taken away."""

    def items(txn: lmdb.Transaction, prefix: bytes) -> Iterator[DiffItem]:
        new = tuple.__new__
        old = b""
        start = len(prefix)  # the key: the record key without its prefix, 00 00 and rseq (m | m bytes | m)
        records = txn.cursor(db=store.tables.records)
        records.set_range(prefix)
        for index, (record_key, raw) in enumerate(itertools.islice(records.iternext(), 2 * count)):
            if index & 1:
                yield new(DiffItem, (record_key[start : -4 - record_key[-1]], old[1:], raw[1:], ()))
            else:
                old = raw

    def once() -> float:
        with store.read() as txn:
            prefix = load_meta(txn, store.tables, name).records_prefix
            start = time.perf_counter()
            made = sum(1 for _ in items(txn, prefix))
            elapsed = time.perf_counter() - start
            assert made == count
            return elapsed

    return once()


@dataclass
class Row:
    """A row of issue 31's table: our figure, the raw baseline beside it, their ratio and its goal."""

    figure: str
    ours: str
    raw: str
    ratio: float
    goal: str
    met: bool


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def rounds_of(values: list[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=None, help="N (default 1,000,000; --quick: 100,000)")
    parser.add_argument("--rounds", type=int, default=None, help="side-by-side rounds (3; --quick: 2)")
    parser.add_argument("--small-rounds", type=int, default=None, help="small generations (default 30)")
    parser.add_argument("--quick", action="store_true", help="a fast check: smaller N, fewer rounds")
    parser.add_argument(
        "--only", default="bulk,small,diff,memory", help="figures to measure (bulk,small,diff,memory)"
    )
    parser.add_argument("--dir", default=None, help="where to put the stores (default: a temp dir)")
    parser.add_argument(
        "--pure-python", action="store_true", help="measure without the compiled accelerator (its twins)"
    )
    args = parser.parse_args()
    print(machine())
    if args.pure_python:
        layout.ACCEL = None  # what the engine reads at each call: its pure-Python twins run
    accel = "pure Python" if layout.ACCEL is None else f"compiled accelerator ({layout.ACCEL.__name__})"
    n = args.records or (100_000 if args.quick else 1_000_000)
    rounds = args.rounds or (2 if args.quick else 3)
    small_rounds = args.small_rounds or (10 if args.quick else 30)
    only = set(args.only.split(","))
    root = Path(args.dir or tempfile.mkdtemp(prefix="diffstore-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    median = statistics.median
    table: list[Row] = []
    print(f"engine benchmarks: {n:,} records, {rounds} rounds (a shared machine: medians, ratios per round)")
    print(f"hot loops: {accel}; load average {load_average()}")
    try:
        if "bulk" in only:
            bulk = bulk_rounds(root, n, rounds)
            ours, raw, floor, commits = bulk.ours, bulk.raw, bulk.floor, bulk.commits
            cpu_ratios, floor_cpu_ratios = bulk.cpu_ratios, bulk.floor_cpu_ratios
            ratios = [r / o for o, r in zip(ours, raw, strict=True)]
            print(
                f"bulk load       {n / median(ours):12,.0f} rec/s   "
                f"raw putmulti {n / median(raw):12,.0f} rec/s   ratio {median(ratios):.2f} "
                f"(goal >= 0.8; rounds {rounds_of(ratios)}; the final commit of the {n:,}-key generation"
                f" {fmt_ms(median(commits))} of it)"
            )
            floor_ratios = [r / f for f, r in zip(floor, raw, strict=True)]
            print(
                f"  per-key floor {n / median(floor):12,.0f} rec/s   LMDB alone writing the per-key layout's"
                f" rows (records, and a changes row per key, built beforehand): ratio"
                f" {median(floor_ratios):.2f} to raw putmulti"
            )
            packed_ratios = [r / p for p, r in zip(bulk.packed, raw, strict=True)]
            print(
                f"  packed floor  {n / median(bulk.packed):12,.0f} rec/s   LMDB alone writing the rows the"
                f" engine writes (records, and a batch's sorted key forms packed ~75 to a change_chunks row,"
                f" built beforehand): ratio {median(packed_ratios):.2f} to raw putmulti (rounds"
                f" {rounds_of(packed_ratios)}; CPU {1 / median(bulk.packed_cpu_ratios):.2f}x raw's)"
            )
            print(
                f"  CPU time      put_many used {1 / median(cpu_ratios):.2f}x the CPU time of raw putmulti"
                f" (ratio {median(cpu_ratios):.2f}; the fsyncs, which dominate a loaded machine, left out);"
                f" the packed floor {1 / median(bulk.packed_cpu_ratios):.2f}x, the per-key floor"
                f" {1 / median(floor_cpu_ratios):.2f}x"
            )
            table.append(
                Row(
                    "bulk load, sorted keys",
                    f"{n / median(ours):,.0f} rec/s",
                    f"putmulti {n / median(raw):,.0f} rec/s (packed floor {median(packed_ratios):.2f}x)",
                    median(ratios),
                    ">= 0.8",
                    median(ratios) >= 0.8,
                )
            )
        with Store.open(root / "store", StoreConfig(background=False)) as store:
            load_collection(store, "big", n)
            load_collection(store, "small", 10_000)
            if "small" in only:
                table.extend(small_figures(root, store, n, small_rounds))
            if "diff" in only:
                table.extend(diff_figures(store, n, rounds))
            if "memory" in only:
                big = store.collection("big")
                before = anon_rss_mb()
                peak = before
                for index, _item in enumerate(big.diff(from_generation_id=b"", to_generation_id=b"g0001")):
                    if index % 50_000 == 0:
                        peak = max(peak, anon_rss_mb())
                peak = max(peak, anon_rss_mb())
                print(
                    f"diff memory     anonymous RSS growth {peak - before:6.1f} MB "
                    f"over a diff of {n:,} changes (goal <= 100 MB)"
                )
        end_load = load_average()
        print(f"load average at the end {end_load}")
        if table:
            print()
            print(f"issue 31's table ({n:,} records; {accel}; load average at the end {end_load}):")
            print("| figure | engine | raw py-lmdb, same run | ratio | goal |")
            print("|---|---|---|---|---|")
            for row in table:
                met = "met" if row.met else "NOT met"
                print(f"| {row.figure} | {row.ours} | {row.raw} | {row.ratio:.2f} | {row.goal} {met} |")
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


def small_figures(root: Path, store: Store, n: int, small_rounds: int) -> list[Row]:
    median = statistics.median
    with Store.open(root / "store-one", StoreConfig(background=False)) as one_store:
        load_collection(one_store, "big", n)
        small = small_generations(root, store, one_store, "big", n, small_rounds)
    shutil.rmtree(root / "store-one")

    def ratio(seconds: list[float]) -> float:
        return median([s / r for s, r in zip(seconds, small.raw, strict=True)])

    cpu_ratio = median([o / r for o, r in zip(small.ours_cpu, small.raw_cpu, strict=True)])
    three_cpu = median([f / r for f, r in zip(small.floor_three_cpu, small.raw_cpu, strict=True)])
    pages = small.branch_pages
    print(
        f"small generation median {fmt_ms(median(small.ours))}"
        f" (put_many alone {fmt_ms(median(small.put_many))}) on {n:,} keys, 1,000 spread;"
        f" one raw durable putmulti of the same keys {fmt_ms(median(small.raw))}"
        f"   ratio {ratio(small.ours):.2f} (goal <= 1.3; median of {len(small.raw)}; CPU time ratio"
        f" {cpu_ratio:.2f})"
    )
    print(
        f"  in one call   {fmt_ms(median(small.ours_one))} write_generation (start + put_many + commit in one"
        f" transaction; the same keys in a store of its own, loaded alike)   ratio"
        f" {ratio(small.ours_one):.2f} (goal <= 1.3)"
    )
    print(
        "  layout floors: LMDB alone writing a layout's rows for the same generations, each way in an"
        " environment of its own:"
    )
    print(
        f"    the engine's rows (records, and the keys packed into change_chunks rows): one transaction"
        f" {fmt_ms(median(small.packed_one))}, ratio {ratio(small.packed_one):.2f} (write_generation's"
        f" floor); three {fmt_ms(median(small.packed_three))}, ratio {ratio(small.packed_three):.2f}"
    )
    print(
        f"    the per-key layout's rows (records, and a changes row per key): one transaction"
        f" {fmt_ms(median(small.floor_one))}, ratio {ratio(small.floor_one):.2f}; three"
        f" {fmt_ms(median(small.floor_three))}, ratio {ratio(small.floor_three):.2f} (CPU time ratio"
        f" {three_cpu:.2f})"
    )
    print(
        f"    storage layout 1's rows (30-byte record keys: cid(u32) | K | seq(u64); the engine's are 23):"
        f" one transaction {fmt_ms(median(small.layout_1_one))}, ratio {ratio(small.layout_1_one):.2f}"
    )
    print(
        f"    the shortest versioned layout's rows (18-byte record keys: the key and a 2-byte seq): one"
        f" transaction {fmt_ms(median(small.short_one))}, ratio {ratio(small.short_one):.2f}"
    )
    print(
        f"  why: a generation adds a row per key beside its older version (raw overwrites in place), and"
        f" 1,000 spread keys dirty nearly every branch page; the records table's branch pages at the end:"
        f" raw {pages['raw']}, the engine's rows {pages['packed-one']}, layout 1's"
        f" {pages['layout-1-one']}, the shortest {pages['short-one']} (longer keys, fewer to a page; the"
        f" first inserts split the pages the bulk load filled)"
    )
    return [
        Row(
            "small generation: start + put_many(1,000 spread keys) + commit",
            f"{fmt_ms(median(small.ours))} (put_many {fmt_ms(median(small.put_many))})",
            f"one durable putmulti {fmt_ms(median(small.raw))}"
            f" (layout floor, 3 txns: {ratio(small.packed_three):.2f}x)",
            ratio(small.ours),
            "<= 1.3",
            ratio(small.ours) <= 1.3,
        ),
        Row(
            "the same in one call: write_generation",
            fmt_ms(median(small.ours_one)),
            f"one durable putmulti {fmt_ms(median(small.raw))}"
            f" (layout floor, 1 txn: {ratio(small.packed_one):.2f}x; layout 1's:"
            f" {ratio(small.layout_1_one):.2f}x)",
            ratio(small.ours_one),
            "<= 1.3",
            ratio(small.ours_one) <= 1.3,
        ),
    ]


def diff_figures(store: Store, n: int, rounds: int) -> list[Row]:
    # 1,000 changed keys, spread evenly (a seek per key) and side by side (a scan), on N and on 10k keys
    # Each diff spans exactly the generation of its 1,000 changes: from the generation before it (on "big"
    # that is the last small generation when those ran, not g0001, or the diff would span their changes).
    rows = []
    before: dict[str, bytes] = {}
    spread_keys: dict[str, list[int]] = {}
    for name, size in (("big", n), ("small", 10_000)):
        stride = size // 1000
        before[name] = store.collection(name).generation_id
        spread_keys[name] = spread(size, stride // 2)
        change_keys(name, store, b"s1", spread_keys[name])
        change_keys(name, store, b"s2", [size // 2 + j for j in range(1000)])
    for label, from_gen, to_gen in (("spread", None, b"s1"), ("side by side", b"s1", b"s2")):
        runs = max(15, 2 * rounds + 1)
        big, small, seeks_big, seeks_small = [], [], [], []
        for _ in range(runs):
            big.append(diff_once(store, "big", from_gen or before["big"], to_gen))
            small.append(diff_once(store, "small", from_gen or before["small"], to_gen))
            if label == "spread":
                seeks_big.append(seek_floor(store, "big", spread_keys["big"]))
                seeks_small.append(seek_floor(store, "small", spread_keys["small"]))
        ratios = [b / s for b, s in zip(big, small, strict=True)]
        ratio = statistics.median(ratios)
        print(
            f"diff 1k keys    {fmt_ms(statistics.median(big))} on {n:,} keys, "
            f"{fmt_ms(statistics.median(small))} on 10k keys, {label}   "
            f"ratio {ratio:.2f} (goal <= 1.2; median of {runs}, "
            f"best {min(big) * 1000:.2f} vs {min(small) * 1000:.2f} ms: {min(big) / min(small):.2f})"
        )
        if label == "spread":
            seek_ratio = statistics.median([b / s for b, s in zip(seeks_big, seeks_small, strict=True)])
            print(
                f"  seek floor    {fmt_ms(statistics.median(seeks_big))} vs"
                f" {fmt_ms(statistics.median(seeks_small))}   LMDB alone reaching the same keys' two versions"
                f" (a seek and a step each, nothing compared or built): ratio {seek_ratio:.2f}; the rest of"
                f" the diff: {fmt_ms(statistics.median(big) - statistics.median(seeks_big))} vs"
                f" {fmt_ms(statistics.median(small) - statistics.median(seeks_small))}"
            )
            rows.append(
                Row(
                    f"diff of 1,000 spread changes, {n:,} keys vs 10k keys",
                    f"{fmt_ms(statistics.median(big))} vs {fmt_ms(statistics.median(small))}",
                    "",
                    ratio,
                    "<= 1.2",
                    ratio <= 1.2,
                )
            )

    through = min(100_000, n)
    coll = store.create_collection("through", manual=True)
    coll.start_generation(b"1")
    for lo in range(0, through, BATCH):
        coll.put_many([(key(i), value(i)) for i in range(lo, lo + BATCH)], generation_id=b"1")
    coll.commit_generation(b"1")
    coll.start_generation(b"2")
    for lo in range(0, through, BATCH):
        coll.put_many([(key(i), value(i, 1)) for i in range(lo, lo + BATCH)], generation_id=b"2")
    coll.commit_generation(b"2")
    diffs, scans, made, keyed_floors, scan_floors, c_floors = [], [], [], [], [], []
    for _ in range(max(7, rounds)):  # each figure beside the others, each round: they see the same load
        diffs.append(diff_once(store, "through", b"1", b"2"))
        scans.append(raw_scan_once(store, through))
        made.append(item_floor(store, "through", through))
        keyed_floor, scan_floor, c_floor = read_floor(store, "through", b"2", through)
        keyed_floors.append(keyed_floor)
        scan_floors.append(scan_floor)
        c_floors.append(c_floor)
    ratios = [s / d for d, s in zip(diffs, scans, strict=True)]
    ratio = statistics.median(ratios)
    print(
        f"diff throughput {through / statistics.median(diffs):12,.0f} items/s   "
        f"raw scan {through / statistics.median(scans):12,.0f} rec/s   "
        f"ratio {ratio:.2f} (goal >= 0.5; median of {len(ratios)})"
    )
    median = statistics.median
    keyed_ratio = median([s / f for f, s in zip(keyed_floors, scans, strict=True)])
    scan_ratio = median([s / f for f, s in zip(scan_floors, scans, strict=True)])
    c_ratio = median([s / f for f, s in zip(c_floors, scans, strict=True)])
    print(
        f"  read floor    {through / median(keyed_floors):12,.0f} items/s   only reading the 3 entries the"
        f" keyed way needs per changed key (change, old and new version): ratio {keyed_ratio:.2f} to the raw"
        f" scan; the 2 the scan needs (old and new version) {through / median(scan_floors):,.0f} items/s:"
        f" ratio {scan_ratio:.2f}; the same 2 consumed by a C-level loop, as the compiled scan consumes"
        f" them (py-lmdb's tuple and two bytes per record, nothing built) {through / median(c_floors):,.0f}"
        f" items/s: ratio {c_ratio:.2f}"
    )
    made_ratios = [s / m for m, s in zip(made, scans, strict=True)]
    print(
        f"  item floor    {through / statistics.median(made):12,.0f} items/s   stepping over both versions"
        f" and building each item in Python, no check at all: ratio {statistics.median(made_ratios):.2f}"
        " to the raw scan (measured beside the diff, each round)"
    )
    rows.append(
        Row(
            f"diff throughput ({through:,} changed keys)",
            f"{through / statistics.median(diffs):,.0f} items/s",
            f"cursor scan {through / statistics.median(scans):,.0f} rec/s (read floor {scan_ratio:.2f}x,"
            f" C-level {c_ratio:.2f}x)",
            ratio,
            ">= 0.5",
            ratio >= 0.5,
        )
    )
    return rows


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
