"""The writer of the crash test: commits generations of a manual collection in a loop until killed.

Usage: python crash_writer.py STORE_DIR [nosync] [one-call]

Generation n (id: n as 8 bytes big-endian) has content derived from n only (``generation_items``),
written in two put_many calls, then committed together with the readers ``progress`` := n (an
``hstream://`` target, so GC ignores it) and ``trail`` := n - TRAIL (targets the collection itself, so
background GC runs behind it while the writer writes and gets killed). After each commit it
prints ``committed n``. On start it resumes: an open (uncommitted) generation left by a crash is aborted.
With ``one-call``, odd generations are written by one ``write_generation`` (one transaction) instead.
"""

from __future__ import annotations

import sys

ITEMS = 120
TRAIL = 3
LONG = b"L" * 250


def gen_id(n: int) -> bytes:
    return n.to_bytes(8, "big")


def generation_items(n: int) -> tuple[list[tuple[bytes, bytes | None]], list[tuple[bytes, bytes | None]]]:
    """The two put_many batches of generation n."""
    first = [(b"k%04d" % ((n * 37 + i) % 500), b"%d:%d" % (n, i)) for i in range(ITEMS // 2)]
    second = [(b"k%04d" % ((n * 37 + i) % 500), b"%d:%d" % (n, i)) for i in range(ITEMS // 2, ITEMS)]
    second.append((b"k%04d" % ((n * 11) % 500), None))  # a tombstone (last item wins if also written)
    second.append((LONG + b"%d" % (n % 7), b"%d" % n))
    second.append((b"gen", b"%d" % n))
    return first, second


def apply(state: dict[bytes, bytes], items: list[tuple[bytes, bytes | None]]) -> None:
    for key, value in items:
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value


def expected_states(upto: int) -> list[dict[bytes, bytes]]:
    """The visible content after each generation 0..upto."""
    states: list[dict[bytes, bytes]] = [{}]
    for n in range(1, upto + 1):
        state = dict(states[-1])
        first, second = generation_items(n)
        apply(state, first + second)
        states.append(state)
    return states


def main(path: str, sync: bool, one_call: bool = False) -> None:
    from diffstore import Store, StoreConfig
    from diffstore.errors import CollectionExists

    store = Store.open(path, config=StoreConfig(gc_interval_ms=5, gc_batch=16, sync=sync))
    try:
        coll = store.create_collection("c", manual=True, initial_generation_id=gen_id(0))
        coll.create_reader("progress", collection="hstream://crash", generation_id=gen_id(0))
        coll.create_reader("trail", generation_id=gen_id(0))
    except CollectionExists:
        coll = store.collection("c")
    if coll.next_generation_id is not None:
        coll.abort_generation(coll.next_generation_id)
    n = int.from_bytes(coll.generation_id, "big")
    print(f"ready {n}", flush=True)
    while True:
        n += 1
        g = gen_id(n)
        first, second = generation_items(n)
        updates = [("progress", g), ("trail", gen_id(max(0, n - TRAIL)))]
        if one_call and n % 2:
            coll.write_generation(g, first + second, updates)
        else:
            coll.start_generation(g)
            coll.put_many(first, generation_id=g)
            coll.put_many(second, generation_id=g)
            coll.commit_generation(g, update_readers=updates)
        print(f"committed {n}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sync="nosync" not in sys.argv[2:], one_call="one-call" in sys.argv[2:])
