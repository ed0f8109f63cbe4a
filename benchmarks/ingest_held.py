"""What a record held above the ingestion frontier costs (issue 25, the takeover backlog).

    .venv/bin/python benchmarks/ingest_held.py [--records 20000] [--batch 25]

After a takeover against a server that resends only at the ack deadline, a new owner holds every record of a
shard above its stored position until it is known to follow it (diffstore.streams.ingest_window): tens of
thousands of records when the stream kept flowing through the pause, the lease ttl and the recovery hold.
This script offers ``--records`` records of one shard in batches of ``--batch``, all above a gap (held), to a
:class:`WindowAccumulator` waiting for its mark, and, as the baseline in the same run, the same records to
one whose shard is in order (each goes straight into the window). It prints the cost per record of each and
their ratio. (Until the held records were kept in a heap, each arrival sorted all of them: 10,000 held
records took 17 s at load 10, against 0.7 s with the heap.)
"""

from __future__ import annotations

import argparse
import time

from _harness import machine, ratio_line

from diffstore.streams.ingest_window import WindowAccumulator
from diffstore.streams.records import RecordFlag, RecordId, RecordPosition, StreamRecord


def batches(records: int, size: int) -> list[list[StreamRecord]]:
    out = []
    for n, first in enumerate(range(0, records, size)):
        batch_id = 3 + 2 * n  # above a gap: batch 2 is missing
        count = min(size, records - first)
        out.append([StreamRecord(RecordId(1, batch_id, i), "k", RecordFlag.RAW, b"v") for i in range(count)])
    return out


def offer_all(accumulator: WindowAccumulator, delivered: list[list[StreamRecord]]) -> float:
    started = time.perf_counter()
    for records in delivered:
        accumulator.offer(records, 0.0, 0)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=25)
    args = parser.parse_args()
    print(machine())
    delivered = batches(args.records, args.batch)
    # held: the shard waits for its mark (a recovery hold of 4 s after its first delivery)
    held = WindowAccumulator(args.records + 1, 60_000, {1: RecordPosition(1, 0)}, resend_s=4.0)
    held_s = offer_all(held, delivered)
    assert held.held == args.records and held.window_count == 0
    # baseline: the shard is in order (its mark, read at once, was empty), records go to the window
    in_order = WindowAccumulator(args.records + 1, 60_000, {1: RecordPosition(1, 0)})
    in_order.offer(delivered[0], 0.0, 0)
    in_order.set_mark(1, RecordPosition(0, 0), 0.0)
    in_order_s = offer_all(in_order, delivered[1:]) * len(delivered) / max(1, len(delivered) - 1)
    assert in_order.held == 0 and in_order.window_count == args.records
    print(f"{args.records:,} records in batches of {args.batch}")
    print(ratio_line("held, per record", held_s / args.records * 1e6, in_order_s / args.records * 1e6, "us"))


if __name__ == "__main__":
    main()
