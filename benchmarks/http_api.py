"""HTTP benchmarks (issue 3): each figure is printed with its ratio to a baseline measured in the same run.

(Not named ``http.py``: run as a script, that would shadow the standard library's ``http`` package.)

    .venv/bin/python benchmarks/http_api.py [--records 1000000] [--waiters 1000] [--only longpoll,get]

Figures:
  putMany      N records (16-byte keys, 100-byte values) in 10k batches through HTTP, msgpack and JSON
               (client encoding included, 2 requests in flight), vs the engine's in-process put_many,
               medians of interleaved rounds, every measurement on an empty store of its own
               goal >= 0.6 (msgpack) / >= 0.4 (JSON)
  long poll    1,000 waiting connections (one bare epoll client process by default): time from the commit
               being durable (stamped inside the server by a commit listener, CLOCK_MONOTONIC) to each
               client holding its whole answer, p50 and p99, median of rounds; the same from the moment the
               commit request was sent (fsync included) is printed too, and when the server had written
               every answer; the baseline, in interleaved rounds with the same clients, is the floor of a
               Python fan-out on this machine: a bare uvloop server writing one pre-built response to each
               waiting socket, with the time it spent inside those send calls    goal p99 <= 10 ms
  point get    32 concurrent keep-alive clients, requests/s vs a bare FastAPI route returning a constant,
               both as a ``def`` route (FastAPI runs it in its threadpool; the issue's baseline) and as an
               ``async def`` one; every server in its own process, rounds interleaved, medians   goal >= 0.5

The servers run in child processes (the clients must not share their interpreter); the load generators are
raw asyncio protocols on uvloop with prepared requests, so the figures measure the servers, not an HTTP
client.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import os
import resource
import select
import shutil
import socket
import statistics
import tempfile
import time
from collections import deque
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

import httpx
import msgpack
import orjson
from _harness import machine
from _harness import python_server as child

from diffstore import Store, StoreConfig

T = TypeVar("T")
BATCH = 10_000
IN_FLIGHT = 2
SERVE = (
    "import sys; from diffstore.server import ServerConfig; from diffstore.server.serving import serve; "
    "serve(ServerConfig(data_dir=sys.argv[1], port=int(sys.argv[2])))"
)
# ``serve`` plus a commit listener, registered before the server's own, that stamps each durable commit
SERVE_STAMPED = """
import os, sys, time
from diffstore.engine.store import Store
from diffstore.engine.types import StoreConfig
from diffstore.server import ServerConfig
from diffstore.server.serving import serve_store
config = ServerConfig(data_dir=sys.argv[1], port=int(sys.argv[3]))
out = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
def stamp(name, generation_id):
    os.write(out, b"%s %d\\n" % (name.encode(), time.perf_counter_ns()))
# the moment a fan-out pass has written every answer: the end of the pass (the parked connections'
# bookkeeping comes after, see diffstore.server.longpoll)
from diffstore.server import longpoll
wake = longpoll.CommitHub._wake
def wake_stamped(hub, collection, generation_id, finish_now=False):
    wake(hub, collection, generation_id, finish_now)
    os.write(out, b"%s:written %d\\n" % (collection.encode(), time.perf_counter_ns()))
longpoll.CommitHub._wake = wake_stamped
with Store.open(config.data_dir, StoreConfig(commit_delay_ms=config.commit_delay_ms)) as store:
    store.add_commit_listener(stamp)
    serve_store(store, config)
"""
# The floors' HTTP side: parses requests, parks each long poll's transport in ``waiting`` by collection,
# hands a commit to the script's own ``committed(collection)`` (stamp, fan out) and answers the rest ``{}``.
FLOOR_PROTOCOL = """
class Floor(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buffer = transport, b""
    def data_received(self, data):
        self.buffer += data
        while b"\\r\\n\\r\\n" in self.buffer:
            head, _, rest = self.buffer.partition(b"\\r\\n\\r\\n")
            length = 0
            for line in head.split(b"\\r\\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(rest) < length:
                return
            self.buffer = rest[length:]
            path = head.split(b" ")[1].decode()
            collection = path.split("/")[2] if path.startswith("/collections/") else ""
            if "/generationId/stream" in path:
                waiting.setdefault(collection, []).append(self.transport)
            else:
                if path.endswith("/generation/commit"):
                    committed(collection)
                self.transport.write(EMPTY)
"""
# The floor of a long-poll fan-out in Python on this machine: uvloop, no HTTP framework, one pre-built
# response written to each waiting socket in one loop. It answers the calls the long-poll round makes
# (create, start, describe: ``{}``) and stamps each commit the way SERVE_STAMPED does, before the fan-out.
FANOUT_FLOOR = (
    """
import asyncio, os, sys, time, uvloop
out = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
waiting = {}
EMPTY = b"HTTP/1.1 200 OK\\r\\ncontent-type: application/json\\r\\ncontent-length: 2\\r\\n\\r\\n{}"
BODY = b'{"generationId":{"value":"1"}}'
ANSWER = b"HTTP/1.1 200 OK\\r\\ncontent-type: application/json\\r\\ncontent-length: %d\\r\\n\\r\\n%s" % (
    len(BODY), BODY)
def committed(collection):
    os.write(out, b"%s %d\\n" % (collection.encode(), time.perf_counter_ns()))
    in_sends = 0
    for transport in waiting.pop(collection, []):
        before = time.perf_counter_ns()
        transport.write(ANSWER)
        in_sends += time.perf_counter_ns() - before
    written = time.perf_counter_ns()
    os.write(out, b"%s:written %d\\n%s:sends %d\\n" % (
        collection.encode(), written, collection.encode(), in_sends))
"""
    + FLOOR_PROTOCOL
    + """async def main():
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Floor, "127.0.0.1", int(sys.argv[2]), backlog=4096)
    await server.serve_forever()
uvloop.run(main())
"""
)
BARE = """
import sys, uvicorn
from fastapi import FastAPI, Response
app = FastAPI()
{kind} const():
    return Response(b'{{"ok":true}}', media_type="application/json")
app.add_api_route("/const", const, methods=["POST"])
uvicorn.run(app, port=int(sys.argv[1]), log_level="warning", access_log=False)
"""
BARE_SYNC = BARE.format(kind="def")  # FastAPI runs a ``def`` route in its threadpool
BARE_ASYNC = BARE.format(kind="async def")  # ... and an ``async def`` one on the event loop


def key(i: int) -> bytes:
    return b"key-%012d" % i


def value(i: int) -> bytes:
    return (b"%08d:" % i).ljust(100, b"v")


def engine_put_many(root: Path, n: int, round_: int = 0) -> float:
    with Store.open(root / f"engine{round_}", StoreConfig()) as store:
        c = store.create_collection("bench", manual=True)
        c.start_generation(b"1")
        start = time.perf_counter()
        for lo in range(0, n, BATCH):
            c.put_many([(key(i), value(i)) for i in range(lo, min(n, lo + BATCH))], generation_id=b"1")
        elapsed = time.perf_counter() - start
        c.commit_generation(b"1")
    shutil.rmtree(root / f"engine{round_}")
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


def http_put_many(url: str, n: int, fmt: str, round_: int = 0) -> float:
    name = f"bench-{fmt}-{round_}"
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


def new_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (it is with uvicorn[standard]): the load generators must stay cheap."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()  # type: ignore[no-any-return]


def run(coro: Coroutine[Any, Any, T]) -> T:
    loop = new_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


class ResponseReader(asyncio.Protocol):
    """The client end of one keep-alive connection: parses Content-Length responses, no HTTP library.

    ``on_response(self, body)`` runs as soon as a response is complete (its last byte has arrived).
    """

    def __init__(self, first: bytes, on_response: Callable[[ResponseReader, bytes], None]) -> None:
        self.first = first
        self.on_response = on_response
        self.transport: Any = None  # uvloop's transports are not asyncio.Transport subclasses
        self.buffer = bytearray()
        self.body_at = -1
        self.length = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.transport.write(self.first)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            if self.body_at < 0:
                end = self.buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(self.buffer[:end]).lower()
                at = head.index(b"content-length:") + len(b"content-length:")
                self.length = int(head[at : head.index(b"\r\n", at) if b"\r\n" in head[at:] else None])
                self.body_at = end + 4
            stop = self.body_at + self.length
            if len(self.buffer) < stop:
                return
            body = bytes(self.buffer[self.body_at : stop])
            del self.buffer[:stop]
            self.body_at = -1
            self.on_response(self, body)


def raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else needed, hard))


def poll_clients(conn: Connection, port: int, count: int, request: bytes, cpus: set[int] | None) -> None:
    """One client process: ``count`` long-polls; reports "sent", then every (arrival time, body).

    A bare epoll loop, no event loop and no HTTP library: on this two-core machine the clients share the
    CPU with the server they measure, so each answer should cost them as little as it can (about a third
    of what uvloop protocols cost here).
    """
    raise_fd_limit(count + 100)
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    sockets = {}
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(request)
        sock.setblocking(False)
        sockets[sock.fileno()] = sock
    ready = select.epoll(count)
    for fd in sockets:
        ready.register(fd, select.EPOLLIN)
    conn.send("sent")
    partial: dict[int, bytes] = {}
    arrived: list[tuple[float, bytes]] = []
    read, clock = os.read, time.perf_counter
    deadline = time.monotonic() + 180
    while len(arrived) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count - len(arrived)} long polls were not answered")
        for fd, _ in ready.poll(1.0, count):
            data = partial.pop(fd, b"") + read(fd, 65536)
            if not data:
                raise ConnectionError("the server closed a waiting connection")
            end = data.find(b"\r\n\r\n")
            if end >= 0:
                head = data[:end].lower()
                at = head.index(b"content-length:") + len(b"content-length:")
                stop = head.find(b"\r\n", at)
                length = int(head[at : None if stop < 0 else stop])
                if len(data) >= end + 4 + length:
                    arrived.append((clock(), data[end + 4 : end + 4 + length]))  # whole: stamped first
                    ready.unregister(fd)
                    continue
            partial[fd] = data
    ready.close()
    for sock in sockets.values():
        sock.close()
    conn.send(arrived)
    conn.close()


def read_stamp(stamps: Path, name: str) -> float:
    """The server-side time (perf_counter, CLOCK_MONOTONIC) stamped under ``name``, NaN if none was.

    ``collection``: its commit was durable; ``collection:written``: the fan-out had written every answer;
    ``collection:sends`` (the floor only) the time its fan-out spent inside the send calls.
    """
    for line in reversed(stamps.read_text().splitlines()):
        stamped, ns = line.rsplit(" ", 1)
        if stamped == name:
            return int(ns) / 1e9
    return math.nan


def long_poll_round(
    url: str, stamps: Path, collection: str, waiters: int, processes: int, cpus: set[int] | None = None
) -> dict[str, float]:
    """``waiters`` long-polls spread over ``processes`` client processes, woken by one commit.

    Latencies run from the moment the commit is durable (stamped by a commit listener inside the server,
    before the server's own long-poll listener runs) to the moment each client has its whole response;
    ``*_from_request`` runs from the moment the commit request was sent instead (fsync included).
    """
    port = int(url.rsplit(":", 1)[1])
    generation = {"generationId": {"value": "1"}}
    with httpx.Client(base_url=url) as http:
        http.post("/collections/", json={"collectionName": collection, "isManual": True}).raise_for_status()
        http.post(f"/collections/{collection}/generation/start", json=generation).raise_for_status()
        path = b"/collections/%s/generationId/stream?generationId=&timeoutMs=120000" % collection.encode()
        request = b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path
        context = multiprocessing.get_context("spawn")
        pipes, children = [], []
        for i in range(processes):
            count = waiters // processes + (1 if i < waiters % processes else 0)
            ours, theirs = context.Pipe()
            process = context.Process(target=poll_clients, args=(theirs, port, count, request, cpus))
            process.start()
            pipes.append(ours)
            children.append(process)
        for pipe in pipes:
            assert pipe.recv() == "sent"
        # every request is read once the server's ends of the connections hold no unread bytes; a round
        # trip through the same event loop then lets the handlers register their waiters
        while unread_by_server(port) > 0:
            time.sleep(0.01)
        http.get(f"/collections/{collection}").raise_for_status()
        sent = time.perf_counter()
        http.post(f"/collections/{collection}/generation/commit", json=generation).raise_for_status()
        returned = time.perf_counter()
        arrived = [answer for pipe in pipes for answer in pipe.recv()]
        for process in children:
            process.join()
    durable = read_stamp(stamps, collection)
    assert not math.isnan(durable), f"no commit stamp for {collection}"
    assert len(arrived) == waiters
    assert {body for _, body in arrived} == {b'{"generationId":{"value":"1"}}'}, "a waiter missed the commit"
    assert min(t for t, _ in arrived) > durable, "a waiter was answered before the commit"
    latencies = sorted((t - durable) * 1000 for t, _ in arrived)
    from_request = sorted((t - sent) * 1000 for t, _ in arrived)
    return {
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "max": latencies[-1],
        "p50_from_request": percentile(from_request, 50),
        "p99_from_request": percentile(from_request, 99),
        "written": (read_stamp(stamps, f"{collection}:written") - durable) * 1000,
        "sends": read_stamp(stamps, f"{collection}:sends") * 1000,
        "fsync": (durable - sent) * 1000,
        "commit": (returned - sent) * 1000,
    }


def percentile(ordered: list[float], p: float) -> float:
    """The nearest-rank percentile of an ascending list."""
    return ordered[max(0, math.ceil(len(ordered) * p / 100) - 1)]


async def hammer(url: str, path: str, body: bytes, clients: int, seconds: float) -> float:
    """Requests/s of ``clients`` keep-alive connections, each sending its next request on an answer."""
    port = int(url.rsplit(":", 1)[1])
    request = (
        b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (path.encode(), len(body), body)
    )
    loop = asyncio.get_running_loop()
    done = 0
    stop = False

    def answered(client: ResponseReader, answer: bytes) -> None:
        nonlocal done
        done += 1
        if not stop:
            client.transport.write(request)

    connections = [
        await loop.create_connection(lambda: ResponseReader(request, answered), "127.0.0.1", port)
        for _ in range(clients)
    ]
    await asyncio.sleep(min(0.5, seconds / 4))  # warm-up, not counted
    done, start = 0, time.perf_counter()
    await asyncio.sleep(seconds)
    rate = done / (time.perf_counter() - start)
    stop = True
    for transport, _ in connections:
        transport.close()
    return rate


def point_get(urls: dict[str, str], clients: int, seconds: float, rounds: int) -> dict[str, list[float]]:
    """Requests/s per round for each server; rounds interleave the servers, in a rotating order."""
    paths = {"ours": ("/collections/g/get", b'{"key":{"value":"k"}}')}
    rates: dict[str, list[float]] = {name: [] for name in urls}
    names = list(urls)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            path, body = paths.get(name, ("/const", b"{}"))
            rates[name].append(run(hammer(urls[name], path, body, clients, seconds)))
    return rates


def report_long_poll(polls: dict[str, list[dict[str, float]]], waiters: int, processes: int) -> None:
    for r, (poll, floor) in enumerate(zip(polls["ours"], polls["floor"], strict=True)):
        print(
            f"long poll round {r}: commit durable -> answer"
            f" p50 {poll['p50']:.1f} ms, p99 {poll['p99']:.1f} ms, max {poll['max']:.1f} ms"
            f", all written after {poll['written']:.1f} ms"
            f" (floor: p50 {floor['p50']:.1f} ms, p99 {floor['p99']:.1f} ms, all written after"
            f" {floor['written']:.1f} ms, {floor['sends']:.1f} ms of it inside the send calls);"
            f" from the commit request sent: p50 {poll['p50_from_request']:.1f} ms,"
            f" p99 {poll['p99_from_request']:.1f} ms"
            f" (request -> durable {poll['fsync']:.1f} ms, commit call {poll['commit']:.1f} ms)"
        )
    p50, p99 = (statistics.median(poll[q] for poll in polls["ours"]) for q in ("p50", "p99"))
    floor50, floor99, sends = (
        statistics.median(poll[q] for poll in polls["floor"]) for q in ("p50", "p99", "sends")
    )
    print(
        f"long poll, {waiters} waiters in {processes} client processes,"
        f" median of {len(polls['ours'])} rounds: commit durable -> full answer"
        f" p50 {p50:.1f} ms, p99 {p99:.1f} ms (goal p99 <= 10 ms);"
        f" floor (raw uvloop fan-out of one pre-built response) p50 {floor50:.1f} ms, p99 {floor99:.1f} ms,"
        f" its send calls alone {sends:.1f} ms;"
        f" p99 ratio to the floor {p99 / floor99:.2f}"
    )


def report_point_get(rates: dict[str, list[float]], rounds: int) -> None:
    ours = rates["ours"]
    medians: dict[str, float] = {}
    for name in ("bare def", "bare async def"):
        ratios = [o / b for o, b in zip(ours, rates[name], strict=True)]
        medians[name] = statistics.median(ratios)
        per_round = ", ".join(
            f"{o:,.0f}/{b:,.0f}={q:.2f}" for o, b, q in zip(ours, rates[name], ratios, strict=True)
        )
        print(f"point get vs FastAPI {name} constant, per round: {per_round}")
    print(
        f"point get, 32 clients, median of {rounds} interleaved rounds: {statistics.median(ours):,.0f} req/s;"
        f" bare FastAPI constant: def {statistics.median(rates['bare def']):,.0f} req/s,"
        f" ratio {medians['bare def']:.2f} (goal >= 0.5);"
        f" async def {statistics.median(rates['bare async def']):,.0f} req/s,"
        f" ratio {medians['bare async def']:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--waiters", type=int, default=1_000)
    parser.add_argument("--poll-processes", type=int, default=1, help="client processes of the long poll")
    parser.add_argument("--poll-rounds", type=int, default=3)
    parser.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="let the long poll's servers and clients share every CPU (default: servers on the first CPU,"
        " clients on the others)",
    )
    parser.add_argument("--seconds", type=float, default=2.0, help="length of one point-get round")
    parser.add_argument("--get-rounds", type=int, default=5)
    parser.add_argument(
        "--only", default="putmany,longpoll,get", help="comma-separated subset of putmany,longpoll,get"
    )
    parser.add_argument("--putmany-rounds", type=int, default=5, help="interleaved putMany rounds (median)")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    args = parser.parse_args()
    only = set(args.only.split(","))
    root = Path(args.dir or tempfile.mkdtemp(prefix="diffstore-http-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    print(machine())
    print(f"records={args.records} waiters={args.waiters} scratch={root}")
    try:
        if "putmany" in only:
            # interleaved rounds, medians: the engine's own rate drifts with the machine's load
            # every measurement starts on an empty store of its own, as the engine's does: a store that
            # already holds earlier rounds' millions of records is slower to grow
            rates: dict[str, list[float]] = {"engine": [], "msgpack": [], "json": []}
            for round_ in range(args.putmany_rounds):
                rates["engine"].append(engine_put_many(root, args.records, round_))
                for fmt in ("msgpack", "json"):
                    data = root / f"server-{fmt}-{round_}"
                    with child(SERVE, str(data)) as url:
                        rates[fmt].append(http_put_many(url, args.records, fmt, round_))
                    shutil.rmtree(data)
                print(
                    f"putMany round {round_}: engine {rates['engine'][-1]:,.0f}, msgpack"
                    f" {rates['msgpack'][-1]:,.0f}, JSON {rates['json'][-1]:,.0f} records/s"
                )
            engine, packed, json_rate = (statistics.median(rates[k]) for k in ("engine", "msgpack", "json"))
            print(f"engine put_many      {engine:>12,.0f} records/s (median of {args.putmany_rounds} rounds)")
            print(
                f"HTTP putMany msgpack {packed:>12,.0f} records/s   ratio {packed / engine:.2f} (goal >= 0.6)"
            )
            print(
                f"HTTP putMany JSON    {json_rate:>12,.0f} records/s   ratio {json_rate / engine:.2f}"
                " (goal >= 0.4)"
            )
        if "longpoll" in only:
            raise_fd_limit(args.waiters + 200)
            cpus = sorted(os.sched_getaffinity(0))
            # the servers on one CPU, the load generator on the others: it does not steal the server's
            server_cpus: set[int] | None = None
            client_cpus: set[int] | None = None
            if args.pin and len(cpus) > 1:
                server_cpus, client_cpus = {cpus[0]}, set(cpus[1:])
            with (
                child(
                    SERVE_STAMPED, str(root / "poll-server"), str(root / "stamps"), cpus=server_cpus
                ) as url,
                child(FANOUT_FLOOR, str(root / "floor-stamps"), cpus=server_cpus) as floor_url,
            ):
                servers = {"ours": (url, root / "stamps"), "floor": (floor_url, root / "floor-stamps")}
                polls: dict[str, list[dict[str, float]]] = {"ours": [], "floor": []}
                for r in range(args.poll_rounds):
                    for name in ("ours", "floor") if r % 2 == 0 else ("floor", "ours"):
                        where, stamps = servers[name]
                        polls[name].append(
                            long_poll_round(
                                where, stamps, f"poll{r}", args.waiters, args.poll_processes, client_cpus
                            )
                        )
            report_long_poll(polls, args.waiters, args.poll_processes)
        if "get" in only:
            with (
                child(SERVE, str(root / "get-server")) as url,
                child(BARE_SYNC) as bare_sync,
                child(BARE_ASYNC) as bare_async,
            ):
                with httpx.Client(base_url=url) as http:
                    generation = {"generationId": {"value": "1"}}
                    http.post("/collections/", json={"collectionName": "g", "isManual": True})
                    http.post("/collections/g/generation/start", json=generation)
                    item = {"key": {"value": "k"}, "value": {"value": "v"}}
                    http.post("/collections/g/put", json={**generation, "item": item}).raise_for_status()
                    http.post("/collections/g/generation/commit", json=generation).raise_for_status()
                urls = {"ours": url, "bare def": bare_sync, "bare async def": bare_async}
                rates = point_get(urls, 32, args.seconds, args.get_rounds)
            report_point_get(rates, args.get_rounds)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
