"""Engine work under read load: putMany and query pages through the HTTP server while 32 clients send
point gets, with the server in one process or several (``diffstore serve --workers N``), and with and
without the engine's writer-first reads (``StoreConfig.read_yield_ms``, see ``diffstore/engine/priority.py``).

    .venv/bin/python benchmarks/mixed_load.py [--records 300000] [--rounds 3] [--settings 1:50,1:0,2:50]

Each setting is ``workers:read_yield_ms`` (default: one process with the default ``read_yield_ms``, one
with 0, which is how the engine behaved before it, and two worker processes). For each, on a fresh server:
putMany of N records in 10k batches alone, then again while 32 keep-alive clients send
point gets as fast as they are answered; the gets' rate alone and during that second putMany; and
reading the first N records whole in query pages of 10k, alone and under the same gets. Printed: each
rate with its ratio to the same server's rate alone (medians of rounds; the settings alternate).

Why: py-lmdb gives up the GIL around every LMDB call (every cursor step, every put), so a thread making
many LMDB calls beside a busy event loop advances by about one call per switch interval. Writer-first
reads fix it for writes; query pages (reads in a worker thread racing reads on the event loop) are not
helped by it, and the figure shows by how much they still suffer.

Beside each figure: the CPU cores the server's processes used. One process holds one GIL: when putMany
alone and gets alone each keep it busy (about one core each), both together can only share it -- the two
ratios then add up to about 1 whatever the scheduling, and only more workers lift that.
More workers help only as far as the machine has idle cores: after each setting's medians a line
prints how many cores the benchmark's processes (clients included) kept busy for each side alone, and
how many the two goals (putMany >= 0.8x, gets >= 0.7x) need at once -- when that exceeds the machine's
cores, no scheduling reaches both.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path

import httpx
import msgpack
import psutil
from _harness import machine
from http_api import ResponseReader, child, http_put_many, new_loop

SERVE = """
import sys
from diffstore.engine.store import Store
from diffstore.engine.types import StoreConfig
from diffstore.server import ServerConfig
from diffstore.server.serving import serve, serve_store
workers, yield_ms = sys.argv[2].split(":")
config = ServerConfig(data_dir=sys.argv[1], port=int(sys.argv[3]), workers=int(workers))
if config.workers > 1:  # each worker opens its store with the default StoreConfig
    serve(config)
else:
    with Store.open(sys.argv[1], StoreConfig(read_yield_ms=float(yield_ms))) as store:
        serve_store(store, config)
"""
GET = (
    b"POST /collections/g/get HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b'Content-Length: 21\r\n\r\n{"key":{"value":"k"}}'
)
CLIENTS = 32
PUT_GOAL, GET_GOAL = 0.8, 0.7  # issue 11: putMany under the gets, and the gets meanwhile, vs alone


def read_load(conn: Connection, port: int) -> None:
    """Child process: CLIENTS closed-loop readers; answers each "mark" on ``conn`` with (answers, time)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        answers = 0

        def answered(client: ResponseReader, answer: bytes) -> None:
            nonlocal answers
            answers += 1
            client.transport.write(GET)

        for _ in range(CLIENTS):
            await loop.create_connection(lambda: ResponseReader(GET, answered), "127.0.0.1", port)
        marks: asyncio.Queue[str] = asyncio.Queue()
        loop.add_reader(conn.fileno(), lambda: marks.put_nowait(conn.recv()))
        conn.send("ready")
        while (await marks.get()) == "mark":
            conn.send((answers, time.perf_counter()))

    loop = new_loop()
    loop.run_until_complete(main())


def mark(conn: Connection) -> tuple[int, float]:
    """The load's answers so far and the time it counted them."""
    conn.send("mark")
    answers, at = conn.recv()
    return answers, at


def query_all(url: str, collection: str) -> float:
    """Records/s of reading ``collection`` whole in query pages of 10k (msgpack)."""
    headers = {"content-type": "application/msgpack", "accept": "application/msgpack"}
    records = 0
    with httpx.Client(base_url=url, timeout=600) as http:
        start = time.perf_counter()
        page = msgpack.unpackb(
            http.post(
                f"/collections/{collection}/query/", content=msgpack.packb({"limit": 10_000}), headers=headers
            )
            .raise_for_status()
            .content
        )
        while True:
            records += len(page["items"])
            if not page.get("cursorId"):
                return records / (time.perf_counter() - start)
            cursor = page["cursorId"]
            page = msgpack.unpackb(
                http.get(f"/collections/{collection}/query/{cursor}", headers=headers)
                .raise_for_status()
                .content
            )


def server_cpu(port: int) -> float:
    """CPU seconds used so far by the processes listening on ``port`` (the server's workers)."""
    total = 0.0
    for pid in {c.pid for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port}:
        if pid is None:
            continue
        with contextlib.suppress(psutil.NoSuchProcess):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


def machine_busy() -> float:
    """CPU seconds used so far by this benchmark's processes: itself (the putMany client), the readers'
    process and the server's processes -- not other jobs sharing the machine."""
    total = 0.0
    me = psutil.Process()
    for process in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = process.cpu_times()
            total += times.user + times.system
    return total


@contextlib.contextmanager
def cores(port: int, into: dict[str, float], key: str) -> Iterator[None]:
    """Puts in ``into[key]`` the CPU cores the server used while the block ran, and in
    ``into[key + " machine"]`` the cores the benchmark's processes (clients too) used meanwhile."""
    cpu, busy, start = server_cpu(port), machine_busy(), time.perf_counter()
    yield
    elapsed = time.perf_counter() - start
    into[key] = (server_cpu(port) - cpu) / elapsed
    into[key + " machine"] = (machine_busy() - busy) / elapsed


def one_round(root: Path, setting: str, records: int, round_: int) -> dict[str, float]:
    data = root / f"server-{setting.replace(':', '-')}-{round_}"
    result: dict[str, float] = {}
    with child(SERVE, str(data), setting) as url:
        port = int(url.rsplit(":", 1)[1])
        with httpx.Client(base_url=url) as http:
            http.post("/collections/", json={"collectionName": "g", "isManual": False}).raise_for_status()
            item = {"key": {"value": "k"}, "value": {"value": "v"}}
            http.post("/collections/g/put", json={"item": item}).raise_for_status()
        with cores(port, result, "cores put alone"):
            result["put alone"] = http_put_many(url, records, "msgpack", 0)
        result["query alone"] = query_all(url, "bench-msgpack-0")
        parent, child_end = multiprocessing.Pipe()
        load = multiprocessing.Process(target=read_load, args=(child_end, int(url.rsplit(":", 1)[1])))
        load.start()
        try:
            assert parent.recv() == "ready"
            first, start = mark(parent)
            with cores(port, result, "cores get alone"):
                time.sleep(2.0)  # the length of the measurement, not a wait for a condition
            last, end = mark(parent)
            result["get alone"] = (last - first) / (end - start)
            first, start = mark(parent)
            with cores(port, result, "cores put under reads"):
                result["put under reads"] = http_put_many(url, records, "msgpack", 1)
            last, end = mark(parent)
            result["get during put"] = (last - first) / (end - start)
            result["query under reads"] = query_all(url, "bench-msgpack-0")
        finally:
            parent.send("stop")
            load.join(10)
    shutil.rmtree(data)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settings", default="1:50,1:0,2:50", help="workers:read_yield_ms, comma-separated")
    args = parser.parse_args()
    print(machine())
    root = Path(tempfile.mkdtemp(prefix="diffstore-mixed-bench-"))
    settings = tuple(args.settings.split(","))
    results: dict[str, list[dict[str, float]]] = {s: [] for s in settings}
    try:
        for r in range(args.rounds):
            for setting in settings if r % 2 == 0 else settings[::-1]:
                got = one_round(root, setting, args.records, r)
                results[setting].append(got)
                print(
                    f"round {r}, workers:yield_ms={setting}: putMany alone {got['put alone']:,.0f} rec/s,"
                    f" under reads {got['put under reads']:,.0f}; gets alone {got['get alone']:,.0f}/s,"
                    f" during the putMany {got['get during put']:,.0f}/s; query pages alone"
                    f" {got['query alone']:,.0f} rec/s, under reads {got['query under reads']:,.0f}; server"
                    f" CPU cores: putMany alone {got['cores put alone']:.2f}, gets alone"
                    f" {got['cores get alone']:.2f}, both {got['cores put under reads']:.2f};"
                    f" load average {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for setting in settings:
        med = {k: statistics.median(r[k] for r in results[setting]) for k in results[setting][0]}
        print(
            f"workers:yield_ms={setting} (median of {args.rounds}): putMany under {CLIENTS} reading clients"
            f" {med['put under reads']:,.0f} rec/s, ratio {med['put under reads'] / med['put alone']:.2f} to"
            f" alone ({med['put alone']:,.0f}); gets during it {med['get during put']:,.0f}/s, ratio"
            f" {med['get during put'] / med['get alone']:.2f} to alone ({med['get alone']:,.0f}); query pages"
            f" under the reads {med['query under reads']:,.0f} rec/s, ratio"
            f" {med['query under reads'] / med['query alone']:.2f} to alone ({med['query alone']:,.0f});"
            f" server CPU cores: putMany alone {med['cores put alone']:.2f}, gets alone"
            f" {med['cores get alone']:.2f}, both together {med['cores put under reads']:.2f}"
        )
        # Why the goals can be out of reach on a small machine: each side alone keeps some cores busy
        # (clients included); both at their goal rates need that much at once, at best.
        put_busy, get_busy = med["cores put alone machine"], med["cores get alone machine"]
        needed, available = PUT_GOAL * put_busy + GET_GOAL * get_busy, psutil.cpu_count()
        print(
            f"  machine bound: putMany alone kept {put_busy:.2f} cores busy, gets alone {get_busy:.2f};"
            f" {PUT_GOAL}x and {GET_GOAL}x of them at once need {needed:.2f} of this machine's"
            f" {available} cores ({'within reach' if needed <= available else 'out of reach here'})"
        )


if __name__ == "__main__":
    main()
