"""The Databus-style consumer with ``workers=N`` vs ``workers=1``, each figure with its ratio in the same run.

    .venv/bin/python benchmarks/consumer_parallel.py [--keys 2000] [--workers 1,4,16] [--callback-ms 1]
        [--rounds 3] [--backend engine|http]

One window of ``--keys`` changed keys (one source) is consumed from the beginning by a fresh consumer (its
own checkpoint collection) whose ``on_data_event`` waits ``--callback-ms`` without holding the GIL -- the
shape of a callback that writes to another service. Figure: data events per second from ``run_pending()``
called to the checkpoint written, median of ``--rounds`` interleaved runs per worker count, and the ratio
to ``workers=1``. The ideal ratio is N (bounded by the serial part: fetching diff pages, the checkpoint);
a CPU-bound callback would gain nothing (one GIL).

On a machine shared with other work the absolute figures move between runs: compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _harness import machine, server_thread

from diffstore.consumer import Consumer, WindowListener
from diffstore.engine.store import Store
from diffstore.engine.types import StoreConfig


class SlowSink(WindowListener):
    """Each data event costs ``delay_s`` of waiting (``time.sleep`` releases the GIL, as socket I/O does)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def on_data_event(self, source: str, key: bytes, old: bytes | None, new: bytes | None) -> None:
        time.sleep(self.delay_s)


@contextmanager
def backend(kind: str, data: Path) -> Iterator[Any]:
    store = Store.open(data, StoreConfig(commit_delay_ms=5))
    if kind == "engine":
        with store:
            yield store
        return
    import uvicorn

    from diffstore.client import Client
    from diffstore.server import ServerConfig, create_app

    def make_server(port: int) -> uvicorn.Server:
        return uvicorn.Server(uvicorn.Config(create_app(store, ServerConfig()), log_level="warning"))

    try:
        with server_thread(make_server) as served, Client(served.url) as client:
            yield client
    finally:
        store.close()


def consume_once(store: Any, workers: int, delay_s: float, run: int) -> float:
    """Seconds to consume the whole source once with a fresh checkpoint."""
    consumer = Consumer(store, ["src"], f"checkpoint-{workers}-{run}", SlowSink(delay_s), workers=workers)
    try:
        started = time.perf_counter()
        assert consumer.run_pending() == 1
        return time.perf_counter() - started
    finally:
        consumer.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--workers", default="1,4,16")
    parser.add_argument("--callback-ms", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", choices=["engine", "http"], default="engine")
    args = parser.parse_args()
    print(machine())
    counts = [int(w) for w in args.workers.split(",")]
    if 1 not in counts:
        counts.insert(0, 1)
    with tempfile.TemporaryDirectory() as tmp, backend(args.backend, Path(tmp) / "data") as store:
        source = store.create_collection("src", manual=True, initial_generation_id=bytes(8))
        gen = (1).to_bytes(8, "big")
        source.start_generation(gen)
        source.put_many([(b"key%06d" % i, b"value") for i in range(args.keys)], generation_id=gen)
        source.commit_generation(gen)
        times: dict[int, list[float]] = {w: [] for w in counts}
        for run in range(args.rounds):
            for workers in counts:  # interleaved: the machine's load moves under every count alike
                times[workers].append(consume_once(store, workers, args.callback_ms / 1000, run))
    base = args.keys / statistics.median(times[1])
    print(
        f"consumer, {args.keys} data events of {args.callback_ms} ms each ({args.backend}), "
        f"median of {args.rounds} interleaved rounds (noisy shared machine: compare ratios):"
    )
    for workers in counts:
        rate = args.keys / statistics.median(times[workers])
        print(f"  workers={workers:<3} {rate:9.0f} events/s   {rate / base:5.2f}x workers=1")


if __name__ == "__main__":
    main()
