"""The store side of the full-disk test, run in a subprocess so that a SIGBUS cannot kill pytest.

Usage: python full_disk_worker.py DIR SYNC   (DIR on a small file system of its own; SYNC is 1 or 0)

Writes a committed generation, fills the file system with a filler file, checks that writes are refused
with ``storageFull`` while reads still see exactly the committed data (also after reopening the store on
the full disk), then removes the filler and checks that the refused write now succeeds. Prints one JSON
object with what it saw; exits 0 unless something unexpected was raised.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from diffstore import Store, StoreConfig
from diffstore.errors import DiffstoreError

BIG = [(b"big%04d" % i, b"x" * 1000) for i in range(2000)]


def fill(path: Path) -> int:
    """Writes ``path`` until the file system is full; returns the bytes written."""
    written = 0
    chunk = b"\0" * 65536
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                written += os.write(fd, chunk if written % 65536 == 0 else chunk[: 65536 - written % 65536])
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                try:  # the last few bytes of a nearly full file system
                    written += os.write(fd, b"\0" * 512)
                except OSError:
                    return written
    finally:
        os.close(fd)


def attempt(action: Callable[[], object]) -> str:
    """``ok`` or the error code of a ``DiffstoreError`` (anything else propagates)."""
    try:
        action()
    except DiffstoreError as exc:
        return exc.code
    return "ok"


def main(root: Path, sync: bool) -> dict[str, object]:
    seen: dict[str, object] = {}
    # unsynced, the background worker flushes every 5 ms while the disk is full
    config = StoreConfig(sync=sync, sync_interval_ms=5)
    store = Store.open(root / "store", config)
    coll = store.create_collection("c", manual=True)
    coll.start_generation(b"g1")
    coll.put_many([(b"k%03d" % i, b"v%03d" % i) for i in range(50)], generation_id=b"g1")
    coll.commit_generation(b"g1")
    committed = [(r.key, r.value) for r in coll.query()]
    coll.start_generation(b"g2")
    filler = root / "filler"
    seen["filled"] = fill(filler)
    # a tiny write may still fit in pages LMDB freed earlier; it must succeed or be refused, nothing else
    seen["tiny"] = attempt(lambda: store.create_collection("tiny"))
    seen["big"] = attempt(lambda: coll.put_many(BIG, generation_id=b"g2"))
    seen["reads_unchanged"] = [(r.key, r.value) for r in coll.query()] == committed
    seen["more"] = sorted({attempt(lambda: coll.put_many(BIG[:200], generation_id=b"g2")) for _ in range(5)})
    store.close()
    store = Store.open(root / "store", config)  # opening an existing store on the full disk
    coll = store.collection("c")
    reread = [(r.key, r.value) for r in coll.query(generation_id=b"g1")]
    seen["reopened_reads_unchanged"] = reread == committed
    filler.unlink()

    def write_again() -> None:
        coll.put_many(BIG, generation_id=b"g2")
        coll.commit_generation(b"g2")

    seen["after_space_returns"] = attempt(write_again)
    seen["count_after"] = sum(1 for _ in coll.query())
    store.close()
    return seen


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), sys.argv[2] == "1")), flush=True)
