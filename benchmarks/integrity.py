"""What integrity costs (issue 49): the digest every commit keeps, on a bulk load and on a 1,000-key
generation, against the same engine with the digest switched off, in the same run; a diff (which reads no
digest) likewise; ``check`` of the whole store against a raw py-lmdb scan of every table; listing every
generation's digest (what ``check --against`` reads from each side); ``check --against`` of two servers of
that store (each a copy of it) against listing both sides' generations.

    .venv/bin/python benchmarks/integrity.py [--keys N] [--rounds R] [--generations G] [--changed C]
                                             [--skip-costs]

``--skip-costs`` measures only ``check`` and ``check --against`` (on a store of N keys and G generations of
C changed keys each: issue 49's 10M keys and 10,000 generations).

The baseline of the first three is the engine with ``digests.record_commit`` and ``digests.record_put``
(an appending put's share) replaced by no-ops and records written unsealed (``layout.SEALING`` off: no
checksum computed, stored or verified): the same code, the same store shape, runs alternating so that load
on the machine falls on both alike. A second line per figure measures checksums alone (digests on in
both). The diff reads a store written sealed against one written plain.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lmdb  # noqa: E402
from _harness import diffstore_serve, machine, median, ratio_line  # noqa: E402

from diffstore import Store, StoreConfig  # noqa: E402
from diffstore.engine import check, digests, layout, writes  # noqa: E402


def key(i: int) -> bytes:
    return b"key-%012d" % i


def value(i: int, salt: int = 0) -> bytes:
    return (b"%d-%d-" % (i, salt)) * 8


@contextmanager
def digests_off() -> Iterator[None]:
    original = digests.record_commit
    writes.digests.record_commit = lambda *args: None  # type: ignore[attr-defined]
    put = digests.record_put
    writes.digests.record_put = lambda *args: None  # type: ignore[attr-defined]
    try:
        yield
    finally:
        writes.digests.record_commit = original  # type: ignore[attr-defined]
        writes.digests.record_put = put  # type: ignore[attr-defined]


@contextmanager
def checksums_off() -> Iterator[None]:
    layout.SEALING = False
    try:
        yield
    finally:
        layout.SEALING = True


@contextmanager
def integrity_off() -> Iterator[None]:
    with digests_off(), checksums_off():
        yield


def bulk_load(root: Path, n: int) -> float:
    with Store.open(root, StoreConfig(background=False)) as store:
        coll = store.create_collection("A")
        started = time.perf_counter()
        coll.start_generation(b"1")
        for low in range(0, n, 10_000):
            coll.put_many([(key(i), value(i)) for i in range(low, min(n, low + 10_000))], generation_id=b"1")
        coll.commit_generation(b"1")
        return time.perf_counter() - started


def alternate(
    rounds: int, run: Callable[[], float], off: Callable[[], AbstractContextManager[None]] = integrity_off
) -> tuple[float, float]:
    """Median seconds of ``run`` with integrity on and ``off``, alternating."""
    with_on: list[float] = []
    with_off: list[float] = []
    for turn in range(rounds):
        if turn % 2:  # each goes first half of the time: warm caches favour neither
            with_on.append(run())
        with off():
            with_off.append(run())
        if not turn % 2:
            with_on.append(run())
    return median(with_on), median(with_off)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--generations", type=int, default=2_000)
    parser.add_argument("--changed", type=int, default=1, help="keys each history generation writes")
    parser.add_argument("--skip-costs", action="store_true", help="measure check and check --against only")
    args = parser.parse_args()
    print(machine())
    n = args.keys
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.skip_costs:
            checks(root, args)
            return
        counter = iter(range(1_000_000))
        on, off = alternate(args.rounds, lambda: bulk_load(root / f"bulk{next(counter)}", n))
        print(
            ratio_line(f"bulk load of {n:,} keys in one generation", n / on, n / off, "rec/s", "<= 5% slower")
        )
        on, off = alternate(args.rounds, lambda: bulk_load(root / f"bulk{next(counter)}", n), checksums_off)
        print(ratio_line("  checksums alone", n / on, n / off, "rec/s"))

        store = Store.open(root / "big", StoreConfig(background=False))
        coll = store.create_collection("A")
        coll.write_generation(b"0000", [(key(i), value(i)) for i in range(n)])
        state = {"g": 0}

        def generation() -> float:
            state["g"] += 1
            g = b"%04d" % state["g"]
            items = [(key((j * 7919 + state["g"]) % n), value(j, state["g"])) for j in range(1000)]
            started = time.perf_counter()
            coll.write_generation(g, items)
            return time.perf_counter() - started

        on, off = alternate(args.rounds * 4, generation)
        print(
            ratio_line("1,000-key generation (write_generation)", on * 1e3, off * 1e3, "ms", "<= 5% slower")
        )
        on, off = alternate(args.rounds * 4, generation, checksums_off)
        print(ratio_line("  checksums alone", on * 1e3, off * 1e3, "ms"))
        store.close()

        def diff_store(name: str) -> tuple[Store, Any]:
            opened = Store.open(root / name, StoreConfig(background=False))
            made = opened.create_collection("A")
            made.write_generation(b"0000", [(key(i), value(i)) for i in range(n)])
            for g in (1, 2):
                items = [(key((j * 7919 + g) % n), value(j, g)) for j in range(1000)]
                made.write_generation(b"%04d" % g, items)
            return opened, made

        sealed_store, sealed = diff_store("diff_sealed")
        with checksums_off():
            plain_store, plain = diff_store("diff_plain")

        def diff() -> float:
            # integrity off: the plain store's diff (its rows carry no checksum to verify)
            coll = sealed if layout.SEALING else plain
            started = time.perf_counter()
            for _ in coll.diff(b"0001", b"0002"):
                pass
            return time.perf_counter() - started

        on, off = alternate(args.rounds * 4, diff, checksums_off)
        print(ratio_line("diff of a 1,000-key generation", on * 1e3, off * 1e3, "ms", "<= 5% slower"))

        def query() -> float:
            coll = sealed if layout.SEALING else plain
            started = time.perf_counter()
            coll.query_page(limit=10_000)
            return time.perf_counter() - started

        on, off = alternate(args.rounds * 4, query, checksums_off)
        print(ratio_line("query page of 10,000 records", on * 1e3, off * 1e3, "ms"))

        def point_gets() -> float:
            coll = sealed if layout.SEALING else plain
            started = time.perf_counter()
            for i in range(0, n, max(1, n // 10_000)):
                coll.get(key(i))
            return time.perf_counter() - started

        on, off = alternate(args.rounds * 4, point_gets, checksums_off)
        print(ratio_line("10,000 point gets", on * 1e3, off * 1e3, "ms"))
        sealed_store.close()
        plain_store.close()
        checks(root, args)


def raw_scan(path: Path) -> tuple[float, int]:
    """Seconds to read every row of every table with py-lmdb, and the rows."""
    env = lmdb.open(str(path), max_dbs=64, readonly=True, lock=False)
    started = time.perf_counter()
    with env.begin() as txn:
        rows = 0
        for name, _ in txn.cursor():
            for _row in txn.cursor(db=env.open_db(bytes(name), txn=txn, create=False)):
                rows += 1
    took = time.perf_counter() - started
    env.close()
    return took, rows


def checks(root: Path, args: argparse.Namespace) -> None:
    """``check`` against a raw scan, the digests' listing, and ``check --against`` over HTTP."""
    n = args.keys
    started = time.perf_counter()
    with Store.open(root / "checked", StoreConfig(background=False)) as store:  # every digest kept
        coll = store.create_collection("A")
        coll.start_generation(b"0")
        for low in range(0, n, 100_000):
            items = [(key(i), value(i)) for i in range(low, min(n, low + 100_000))]
            coll.put_many(items, generation_id=b"0")
        coll.commit_generation(b"0")
        for g in range(args.generations):
            changed = sorted({key((g * 7919 + j * 104_729) % n) for j in range(args.changed)})
            coll.write_generation(b"g%06d" % g, [(k, value(g, 1)) for k in changed])
    print(
        f"store of {n:,} keys and {args.generations:,} generations built in"
        f" {time.perf_counter() - started:.1f} s",
        flush=True,
    )

    checked: list[float] = []
    raws: list[float] = []
    for _ in range(max(1, args.rounds // 2)):  # alternating: load on the machine falls on both alike
        took, rows = raw_scan(root / "checked")
        raws.append(took)
        started = time.perf_counter()
        report = check.check_directory(root / "checked")
        checked.append(time.perf_counter() - started)
        assert report.ok, report.problems[:3]
    print(
        ratio_line(
            f"check of {rows:,} rows (raw scan: baseline)", median(checked), median(raws), "s", "<= 3x"
        ),
        flush=True,
    )

    with Store.open(root / "checked", StoreConfig(background=False)) as store:
        coll = store.collection("A")
        started = time.perf_counter()
        listed, before, more = 0, None, True
        while more:
            found, more = coll.digests(before, 10_000)
            listed += len(found)
            before = found[-1].generation_id if found else None
        took = time.perf_counter() - started
        started = time.perf_counter()
        gens, before, more = 0, None, True
        while more:
            ids, more = coll.generations(before, 10_000)
            gens += len(ids)
            before = ids[-1] if ids else None
        plain = time.perf_counter() - started
    print(ratio_line(f"digests of {listed:,} generations (generation list: baseline)", took, plain, "s"))

    against(root, args)


def against(root: Path, args: argparse.Namespace) -> None:
    """``check --against``: two servers, each of a copy of the store, compared at every generation; the
    baseline lists both sides' generation ids through the same clients."""
    from diffstore.client import digest_check
    from diffstore.client._sync import Client

    for side in ("replica", "primary"):
        shutil.copytree(root / "checked", root / side)
    with (
        diffstore_serve(root / "replica") as replica_server,
        diffstore_serve(root / "primary") as primary_server,
        Client(replica_server.url) as replica,
        Client(primary_server.url) as primary,
    ):
        took: list[float] = []
        plain: list[float] = []
        for _ in range(max(1, args.rounds // 2)):
            started = time.perf_counter()
            found = list(digest_check.compare(replica, primary))
            took.append(time.perf_counter() - started)
            assert found and all(f.first_difference is None and f.missing is None for f in found), found
            started = time.perf_counter()
            gens = 0
            for client in (replica, primary):
                before, more = None, True
                while more:
                    ids, more = client.collection("A").generations(before, 1000)  # its largest page
                    gens += len(ids)
                    before = ids[-1] if ids else None
            plain.append(time.perf_counter() - started)
        compared = sum(f.compared for f in found)
        print(
            ratio_line(
                f"check --against: {compared:,} generations compared (both sides' generation lists:"
                " baseline)",
                median(took),
                median(plain),
                "s",
                "<= 10 s",
            )
        )


if __name__ == "__main__":
    main()
