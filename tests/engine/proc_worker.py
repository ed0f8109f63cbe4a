"""A second process over a store, for tests/engine/test_processes.py: ``python proc_worker.py MODE DIR ...``.

Each mode prints one JSON line with what it did, or ``ready`` and waits, as the mode says.
"""

from __future__ import annotations

import json
import sys
import time


def gen(n: int) -> bytes:
    return n.to_bytes(8, "big")


def race(path: str, me: int, rounds: int) -> None:
    """Tries start/put/commit-or-abort of generations ``2n + me`` on manual collection ``m``."""
    from diffstore import Store, StoreConfig
    from diffstore.errors import DiffstoreError

    outcomes: list[list[object]] = []
    with Store.open(path, StoreConfig(background=False)) as store:
        c = store.collection("m")
        print("ready", flush=True)
        sys.stdin.readline()  # both processes start racing when the test says go
        for n in range(1, rounds + 1):
            g = gen(2 * n + me)
            finish = "commit" if n % 3 else "abort"
            step = "start"
            try:
                c.start_generation(g)
                step = "put"
                c.put_many([(b"owner", b"%d" % me), (b"g-%d" % (2 * n + me), b"%d" % me)], generation_id=g)
                step = finish
                if finish == "commit":
                    c.commit_generation(g)
                else:
                    c.abort_generation(g)
                outcomes.append([2 * n + me, finish, None])
            except DiffstoreError as exc:
                outcomes.append([2 * n + me, step, exc.code])
    print(json.dumps(outcomes), flush=True)


def write_auto(path: str, me: int, count: int) -> None:
    """Writes ``count`` keys one put at a time into non-manual ``n``, and seqNos 1..count of producer p."""
    from diffstore import Store, StoreConfig

    admitted = []
    with Store.open(path, StoreConfig(commit_delay_ms=2, gc_interval_ms=20)) as store:
        c = store.collection("n")
        for i in range(count):
            c.put(b"p%d-%05d" % (me, i), b"v")
            result = c.put(b"seq", b"%d" % (i + 1), producer_id="p", seq_no=i + 1)
            if not result.skipped:
                admitted.append(i + 1)
    print(json.dumps(admitted), flush=True)


def commit_once(path: str, generation: int) -> None:
    """Commits generation ``generation`` of manual collection ``m`` (started before) and exits."""
    from diffstore import Store, StoreConfig

    with Store.open(path, StoreConfig(background=False)) as store:
        c = store.collection("m")
        c.start_generation(gen(generation))
        c.put(b"k", b"%d" % generation, generation_id=gen(generation))
        c.commit_generation(gen(generation))
        print(json.dumps(time.time()), flush=True)


def hold_reader(path: str) -> None:
    """Opens a read transaction, says ``ready`` and waits to be killed."""
    import lmdb

    env = lmdb.open(path, max_dbs=16, readonly=False)
    txn = env.begin()
    txn.get(b"x")
    print("ready", flush=True)
    time.sleep(600)


def write_pending(path: str) -> None:
    """Writes into non-manual ``n`` and exits before its automatic commit is due (no background work)."""
    from diffstore import Store, StoreConfig

    with Store.open(path, StoreConfig(background=False, commit_delay_ms=1)) as store:
        store.collection("n").put(b"left", b"behind")
    print(json.dumps("done"), flush=True)


if __name__ == "__main__":
    mode, path, *rest = sys.argv[1:]
    if mode == "race":
        race(path, int(rest[0]), int(rest[1]))
    elif mode == "write_auto":
        write_auto(path, int(rest[0]), int(rest[1]))
    elif mode == "commit_once":
        commit_once(path, int(rest[0]))
    elif mode == "hold_reader":
        hold_reader(path)
    elif mode == "write_pending":
        write_pending(path)
    else:
        raise SystemExit(f"unknown mode {mode}")
