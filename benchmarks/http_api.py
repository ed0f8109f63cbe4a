"""HTTP benchmarks (issue 3): each figure is printed with its ratio to a baseline measured in the same run.

(Not named ``http.py``: run as a script, that would shadow the standard library's ``http`` package.)

    .venv/bin/python benchmarks/http_api.py [--records 1000000] [--waiters 1000] [--seconds 5]

Figures:
  putMany      N records (16-byte keys, 100-byte values) in 10k batches through HTTP, msgpack and JSON
               (client encoding included, 2 requests in flight), vs the engine's in-process put_many
               goal >= 0.6 (msgpack) / >= 0.4 (JSON)
  long poll    1,000 waiting connections: time from sending a commit to each answer, p50 and p99
               goal p99 <= 10 ms
  point get    32 concurrent keep-alive clients, requests/s vs a bare FastAPI route returning a constant
               (both servers in their own process, same client)                                goal >= 0.5

The servers run in child processes (the client must not share their interpreter); the load generators are
raw asyncio connections with prepared requests, so the figures measure the servers, not an HTTP client.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import msgpack
import orjson

from diffstore import Store, StoreConfig

BATCH = 10_000
IN_FLIGHT = 2
SERVE = (
    "import sys; from diffstore.server import ServerConfig; from diffstore.server.serving import serve; "
    "serve(ServerConfig(data_dir=sys.argv[1], port=int(sys.argv[2])))"
)
BARE = (
    "import sys, uvicorn; from fastapi import FastAPI, Response; app = FastAPI(); "
    "app.add_api_route('/const', lambda: Response(b'{\"ok\":true}', media_type='application/json'), "
    "methods=['POST']); uvicorn.run(app, port=int(sys.argv[1]), log_level='warning', access_log=False)"
)


def key(i: int) -> bytes:
    return b"key-%012d" % i


def value(i: int) -> bytes:
    return (b"%08d:" % i).ljust(100, b"v")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def child(code: str, *args: str) -> Iterator[str]:
    """Runs a server in a child process; yields its base URL once /healthz (or the port) answers."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-c", code, *args, str(port)])
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError("server did not start") from None
            time.sleep(0.05)
    try:
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def engine_put_many(root: Path, n: int) -> float:
    with Store.open(root / "engine", StoreConfig()) as store:
        c = store.create_collection("bench", manual=True)
        c.start_generation(b"1")
        start = time.perf_counter()
        for lo in range(0, n, BATCH):
            c.put_many([(key(i), value(i)) for i in range(lo, min(n, lo + BATCH))], generation_id=b"1")
        elapsed = time.perf_counter() - start
        c.commit_generation(b"1")
    return n / elapsed


def encode_batch(lo: int, n: int, fmt: str) -> tuple[bytes, dict[str, str]]:
    keys = range(lo, min(n, lo + BATCH))
    if fmt == "msgpack":
        body = msgpack.packb(
            {"generationId": b"1", "items": [{"key": key(i), "value": value(i)} for i in keys]}
        )
        return body, {"content-type": "application/msgpack", "accept": "application/msgpack"}
    items = [{"key": {"value": key(i).decode()}, "value": {"value": value(i).decode()}} for i in keys]
    return orjson.dumps({"generationId": {"value": "1"}, "items": items}), {
        "content-type": "application/json"
    }


def http_put_many(url: str, n: int, fmt: str) -> float:
    name = f"bench-{fmt}"
    generation = {"generationId": {"value": "1"}}
    with httpx.Client(base_url=url, timeout=120) as http:
        http.post("/collections/", json={"collectionName": name, "isManual": True}).raise_for_status()
        http.post(f"/collections/{name}/generation/start", json=generation).raise_for_status()
        start = time.perf_counter()
        # two requests in flight: the client encodes the next batch while the server stores this one
        with ThreadPoolExecutor(max_workers=IN_FLIGHT) as pool:
            pending: deque[Future[httpx.Response]] = deque()
            for lo in range(0, n, BATCH):
                body, headers = encode_batch(lo, n, fmt)
                if len(pending) == IN_FLIGHT:
                    pending.popleft().result().raise_for_status()
                pending.append(
                    pool.submit(http.post, f"/collections/{name}/putMany", content=body, headers=headers)
                )
            for future in pending:
                future.result().raise_for_status()
        elapsed = time.perf_counter() - start
        http.post(f"/collections/{name}/generation/commit", json=generation).raise_for_status()
    return n / elapsed


def unread_by_server(port: int) -> int:
    """Bytes received but not yet read by the server listening on ``port`` (from /proc/net/tcp)."""
    total = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port:
            total += int(fields[4].split(":")[1], 16)
    return total


async def read_response(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return await reader.readexactly(length)


async def long_poll(url: str, waiters: int) -> dict[str, float]:
    port = int(url.rsplit(":", 1)[1])
    with httpx.Client(base_url=url) as http:
        http.post("/collections/", json={"collectionName": "poll", "isManual": True}).raise_for_status()
        http.post(
            "/collections/poll/generation/start", json={"generationId": {"value": "1"}}
        ).raise_for_status()
    path = b"/collections/poll/generationId/stream?generationId=&timeoutMs=120000"
    request = b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path
    connections = [await asyncio.open_connection("127.0.0.1", port) for _ in range(waiters)]
    for _, writer in connections:
        writer.write(request)
    await asyncio.gather(*(writer.drain() for _, writer in connections))
    # the server has read every request once its ends of the connections hold no unread bytes; a probe
    # round trip through the same event loop then lets the handlers register their waiters
    while unread_by_server(port) > 0:
        await asyncio.sleep(0.01)
    probe = httpx.AsyncClient(base_url=url)
    await probe.get("/collections/poll/generationId/stream", params={"generationId": "", "timeoutMs": 100})
    arrived: list[float] = []

    async def wait(reader: asyncio.StreamReader) -> None:
        body = await read_response(reader)
        arrived.append(time.perf_counter())
        assert body == b'{"generationId":{"value":"1"}}', body

    tasks = [asyncio.create_task(wait(reader)) for reader, _ in connections]
    start = time.perf_counter()
    await probe.post("/collections/poll/generation/commit", json={"generationId": {"value": "1"}})
    committed = (time.perf_counter() - start) * 1000
    await asyncio.gather(*tasks)
    await probe.aclose()
    for _, writer in connections:
        writer.close()
    latencies = sorted((t - start) * 1000 for t in arrived)
    return {
        "first": latencies[0],
        "p50": latencies[len(latencies) // 2],
        "p99": latencies[int(len(latencies) * 0.99) - 1],
        "max": latencies[-1],
        "commit": committed,
    }


async def hammer(url: str, path: str, body: bytes, clients: int, seconds: float) -> float:
    port = int(url.rsplit(":", 1)[1])
    request = (
        b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (path.encode(), len(body), body)
    )
    done = 0
    stop = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while time.perf_counter() < stop:
            writer.write(request)
            await read_response(reader)
            done += 1
        writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return done / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--waiters", type=int, default=1_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    args = parser.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="diffstore-http-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"cpus={os.cpu_count()} records={args.records} waiters={args.waiters} scratch={root}")
    try:
        engine = engine_put_many(root, args.records)
        with child(SERVE, str(root / "server")) as url:
            packed = http_put_many(url, args.records, "msgpack")
            json_rate = http_put_many(url, args.records, "json")
            poll = asyncio.run(long_poll(url, args.waiters))
            with httpx.Client(base_url=url) as http:
                http.post("/collections/", json={"collectionName": "g", "isManual": True})
                http.post("/collections/g/generation/start", json={"generationId": {"value": "1"}})
                http.post(
                    "/collections/g/put",
                    json={
                        "generationId": {"value": "1"},
                        "item": {"key": {"value": "k"}, "value": {"value": "v"}},
                    },
                )
                http.post("/collections/g/generation/commit", json={"generationId": {"value": "1"}})
            get_rate = asyncio.run(
                hammer(url, "/collections/g/get", b'{"key":{"value":"k"}}', 32, args.seconds)
            )
        with child(BARE) as bare_url:
            bare_rate = asyncio.run(hammer(bare_url, "/const", b"{}", 32, args.seconds))
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print(f"engine put_many      {engine:>12,.0f} records/s")
    print(f"HTTP putMany msgpack {packed:>12,.0f} records/s   ratio {packed / engine:.2f} (goal >= 0.6)")
    print(
        f"HTTP putMany JSON    {json_rate:>12,.0f} records/s   ratio {json_rate / engine:.2f} (goal >= 0.4)"
    )
    print(
        f"long poll, {args.waiters} waiters: commit->answer p50 {poll['p50']:.1f} ms,"
        f" p99 {poll['p99']:.1f} ms"
        f" (goal p99 <= 10 ms); first {poll['first']:.1f} ms, max {poll['max']:.1f} ms,"
        f" the commit call itself {poll['commit']:.1f} ms"
    )
    print(
        f"point get, 32 clients {get_rate:>10,.0f} req/s; bare FastAPI constant {bare_rate:,.0f} req/s;"
        f" ratio {get_rate / bare_rate:.2f} (goal >= 0.5)"
    )


if __name__ == "__main__":
    main()
