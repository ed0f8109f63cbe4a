"""A writer process for the backup, check and compaction tests: ``python backup_writer.py DIR NAME``.

It commits generations 1, 2, 3... of the manual collection NAME (creating it), each with 20 keys and, in
the same commit, its reader ``pos`` (target ``hstream://NAME``, never a collection, so no GC) moved to the
generation: in any consistent state the reader equals the collection's generation. Most of the time a
generation is open with records in it (uncommitted work a backup leaves out); it also writes into the
automatic collection ``auto-NAME``. It prints ``ready``, then after each commit one line with the
committed generation (acknowledged: the test may rely on it), until its stdin closes.
"""

from __future__ import annotations

import sys
import threading


def gen(n: int) -> bytes:
    return n.to_bytes(8, "big")


def main(path: str, name: str) -> None:
    from diffstore import ReaderUpdate, Store, StoreConfig

    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    with Store.open(path, StoreConfig(commit_delay_ms=5)) as store:
        c = store.create_collection(name, manual=True)
        c.create_reader("pos", f"hstream://{name}", None)
        auto = store.create_collection(f"auto-{name}", manual=False)
        print("ready", flush=True)
        n = 0
        while not stop.is_set():
            n += 1
            g = gen(n)
            c.start_generation(g)
            c.put_many(
                [(b"k%03d" % ((n * 7 + i) % 300), b"%d-%d" % (n, i)) for i in range(20)], generation_id=g
            )
            c.put(b"last", g, generation_id=g)
            c.commit_generation(g, update_readers=[ReaderUpdate("pos", g)])
            print(n, flush=True)
            auto.put(b"a%d" % (n % 50), b"%d" % n)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
