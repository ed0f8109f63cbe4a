"""With py-lmdb alone: a write transaction's abort() waits while copyfd() runs in the same process.

A copy into a pipe nobody reads (a backup client that stopped reading) never ends; meanwhile a commit goes
through, but an abort (a write that failed) hangs, holding LMDB's write lock. Prints what each took and exits
1 when the abort hung (py-lmdb 3.0.0 here), 0 when it did not (1.x). See diffstore/engine/copier.py.

    python scripts/copyfd_blocks_abort.py [--plain]    # --plain: copyfd without compact (the same)
"""

import os
import sys
import tempfile
import threading
import time

import lmdb

env = lmdb.open(tempfile.mkdtemp(), map_size=1 << 30)
with env.begin(write=True) as txn:
    for i in range(200_000):
        txn.put(b"%08d" % i, b"x" * 100)
_, stalled = os.pipe()  # nobody reads: the copy stops once the pipe is full
threading.Thread(
    target=env.copyfd, args=(stalled,), kwargs={"compact": "--plain" not in sys.argv}, daemon=True
).start()
time.sleep(0.5)  # the copy is under way (and stalled): there is nothing to wait for but its start
hung = False
for end in ("commit", "abort", "commit"):
    done = threading.Event()

    def write(end: str = end, done: threading.Event = done) -> None:
        txn = env.begin(write=True)
        txn.put(b"k", b"v")
        getattr(txn, end)()
        done.set()

    started = time.monotonic()
    threading.Thread(target=write, daemon=True).start()
    answered = done.wait(3)
    took = f"{time.monotonic() - started:.3f} s" if answered else "still waiting after 3 s"
    print(f"lmdb {lmdb.__version__}: write transaction {end}(): {took}")
    if not answered:
        hung = True
        break  # it holds LMDB's write lock: every later write would wait as well
sys.exit(1 if hung else 0)
