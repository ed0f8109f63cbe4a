"""Many processes over one store (issue 11): each figure with its ratio to a baseline of the same run.

    .venv/bin/python benchmarks/workers.py [--records 200000] [--rounds 3] [--only diff,wake,fanout]

Figures (every server is ``diffstore serve`` in its own process tree, as users run it):
  diff pages   2 client processes, each reading the diff (beginning -> current) of its half of the key range
               in msgpack pages of 10k, over and over for ``--seconds``; records/s of both together,
               ``--workers 2`` vs ``--workers 1``, rounds interleaved, medians              goal >= 1.6x
               Clients (``--client``): "raw" (default) is one raw keep-alive HTTP/1.1 connection per process
               that receives every byte of every page, walks each page's msgpack in C (the items array
               skipped whole, no object made for an item), counts the items from the array's header and
               follows the page's real cursor; each complete pass must count exactly the records of its
               range (about 0.03 us of Python per record, then the kernel's copy). "lean" is the same with
               ``msgpack.unpackb`` of every page (what a bulk reader that keeps the items pays); "httpx" is
               httpx. With 2 workers the clients' two connections are on different workers (a client
               reconnects until they are: the kernel spreads connections by a hash, which two can share).
               Printed beside: the CPU the clients and the server spent per record, and the most 2 workers
               can give on this machine's CPUs given both: 2 workers and the clients share the CPUs, so the
               ratio is at most 2 s / (s + c) (s: server CPU per record, c: clients' CPU per record)
  wake-up      a commit by another process (an embedded ``Store`` in a child process; its stamp is taken
               when ``commit_generation`` has returned, i.e. the commit is durable) -> each of 10 long polls
               (spread over 2 workers) holding its answer; p50/p99 over every answer of ``--wake-rounds``
               commits; baseline: the same commits made through the HTTP API of a one-process server
               (the committer's stamp is the HTTP answer)                                goal p99 <= 5 ms
  fan-out      1,000 long polls spread over 2 workers, woken by one commit of an embedded store: p99 from
               the durable commit to each client holding its answer; baseline: the bare uvloop fan-out floor
               of benchmarks/http_api.py in interleaved rounds (its commit stamp is taken as it receives
               the commit request)                                                        goal <= 1.1x
               Printed beside: the same floor spread over as many processes as workers (each woken by a
               datagram, as the workers are), and the CPU each server used from the commit until every
               client held its answer (the client process shares the CPUs with them)

On a machine shared with other work the figures move between runs: compare the ratios of one run. On two
CPUs, servers and clients share them (no pinning here: the point of workers is to use every CPU).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import shutil
import socket
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx
import msgpack
import psutil
from _harness import diffstore_serve, machine
from http_api import (
    FANOUT_FLOOR,
    FLOOR_PROTOCOL,
    SERVE_STAMPED,
    child,
    percentile,
    poll_clients,
    raise_fd_limit,
    read_stamp,
    unread_by_server,
)

MSGPACK = {"content-type": "application/msgpack", "accept": "application/msgpack"}
BATCH = 10_000
# The bare fan-out floor of http_api.FANOUT_FLOOR spread over processes as ``serve --workers N`` spreads the
# waiters: N uvloop processes (forked) on one port with SO_REUSEPORT, each answering its own waiters with one
# pre-built response in one loop. The process that receives the commit request stamps it, tells the others
# by a UNIX datagram (as diffstore's wake-up does) and fans out its own; the others fan out theirs when the
# datagram arrives (read by the loop). Arguments: stamps file, processes, port.
FANOUT_FLOOR_PROCESSES = (
    """
import asyncio, os, signal, socket, sys, time, uvloop
stamps, processes, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
EMPTY = b"HTTP/1.1 200 OK\\r\\ncontent-type: application/json\\r\\ncontent-length: 2\\r\\n\\r\\n{}"
BODY = b'{"generationId":{"value":"1"}}'
ANSWER = b"HTTP/1.1 200 OK\\r\\ncontent-type: application/json\\r\\ncontent-length: %d\\r\\n\\r\\n%s" % (
    len(BODY), BODY)
def address(i):
    return b"\\0diffstore-floor-%d-%d" % (port, i)
kids = []
me = 0
for i in range(1, processes):
    pid = os.fork()
    if pid == 0:
        me, kids = i, []
        break
    kids.append(pid)
if kids:
    def stop(signum, frame):
        for kid in kids:
            os.kill(kid, signal.SIGTERM)
        os._exit(0)
    signal.signal(signal.SIGTERM, stop)
out = os.open(stamps, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
waiting = {}
notices = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
notices.bind(address(me))
notices.setblocking(False)
def fan_out(collection):
    for transport in waiting.pop(collection, []):
        transport.write(ANSWER)
def on_notice():
    while True:
        try:
            fan_out(notices.recv(4096).decode())
        except BlockingIOError:
            return
def committed(collection):
    os.write(out, b"%s %d\\n" % (collection.encode(), time.perf_counter_ns()))
    for i in range(processes):
        if i != me:
            notices.sendto(collection.encode(), address(i))
    fan_out(collection)
"""
    + FLOOR_PROTOCOL
    + """async def main():
    loop = asyncio.get_running_loop()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(4096)
    loop.add_reader(notices.fileno(), on_notice)
    server = await loop.create_server(Floor, sock=listener)
    await server.serve_forever()
uvloop.run(main())
"""
)


@contextmanager
def serve(data: Path, workers: int) -> Iterator[str]:
    """``diffstore serve --workers N``; yields its URL once every worker answers."""
    with serve_process(data, workers) as (url, _):
        yield url


@contextmanager
def serve_process(data: Path, workers: int) -> Iterator[tuple[str, int]]:
    """:func:`serve`, yielding the server's pid too (ready once every worker's long-poll hub listens)."""

    def hubs_listen(url: str) -> bool:
        return len(list((data / "wake").iterdir())) >= workers

    with diffstore_serve(
        data, "--workers", str(workers), "--commit-delay-ms", "5", ready=hubs_listen
    ) as served:
        yield served.url, served.pid


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) used so far by process ``pid`` and its live descendants: to the
    nanosecond on Linux (each thread's ``schedstat``), else in clock ticks."""
    root = psutil.Process(pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += _schedstat_seconds(proc.pid)
        except OSError:
            try:
                times = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
    return total


def _schedstat_seconds(pid: int) -> float:
    """The time every thread of ``pid`` has run on a CPU (Linux; OSError elsewhere or once it is gone)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
    return total / 1e9


def load(url: str, records: int) -> None:
    """Collection ``d``: ``records`` keys committed in generation 1 (msgpack putMany of 10k)."""
    with httpx.Client(base_url=url, timeout=600) as http:
        gen = {"generationId": b"1"}
        http.post("/collections/", json={"collectionName": "d", "isManual": True}).raise_for_status()
        http.post("/collections/d/generation/start", json={"generationId": {"value": "1"}}).raise_for_status()
        for lo in range(0, records, BATCH):
            items = [
                {"key": b"key-%012d" % i, "value": (b"%08d:" % i).ljust(100, b"v")}
                for i in range(lo, min(records, lo + BATCH))
            ]
            body = msgpack.packb({**gen, "items": items})
            http.post("/collections/d/putMany", content=body, headers=MSGPACK).raise_for_status()
        http.post(
            "/collections/d/generation/commit", json={"generationId": {"value": "1"}}
        ).raise_for_status()


def read_diff(
    conn: Connection, url: str, lo: bytes, hi: bytes, expected: int, seconds: float, client: str
) -> None:
    """Child process: reads the diff of [lo, hi) page by page, again and again; sends
    (records/s, CPU seconds it used, wall seconds). Each complete pass must count ``expected`` records.

    ``client``: "raw" is one raw keep-alive HTTP/1.1 connection receiving every byte of each answer and
    walking its msgpack in C without making the items into objects (a client that costs next to
    nothing: what the server can do); "lean" the same connection with ``msgpack.unpackb`` of each answer
    (what a bulk reader that keeps the items needs, and no more); "httpx" is httpx, as a first-time user
    writes it. Its connection is open when it says "ready"; told "again", it opens a new one.
    """
    records = 0
    get_page, close = _connect(url, client)
    conn.send("ready")
    while conn.recv() == "again":
        close()
        get_page, close = _connect(url, client)
        conn.send("ready")
    start, cpu = time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        body = msgpack.packb({"fromGenerationId": b"", "fromKey": lo, "toKey": hi, "limit": BATCH})
        page = get_page("POST", "/collections/d/diff/", body)
        passed = 0
        while True:
            passed += len(page["items"])
            cursor = page.get("cursorId")
            if not cursor:
                break
            page = get_page("GET", f"/collections/d/diff/{cursor}", b"")
        if passed != expected:
            raise RuntimeError(f"a pass over [{lo!r}, {hi!r}) read {passed} records, not {expected}")
        records += passed
    wall = time.perf_counter() - start
    conn.send((records / wall, time.process_time() - cpu, wall))


Pages = Callable[[str, str, bytes], Any]


def _connect(url: str, client: str) -> tuple[Pages, Callable[[], None]]:
    """A page getter over one open connection, and its close."""
    if client == "httpx":
        http = httpx.Client(base_url=url, timeout=600)
        http.get("/healthz").raise_for_status()  # opens the connection the pages will use

        def httpx_page(method: str, path: str, body: bytes) -> Any:
            answer = http.request(method, path, content=body or None, headers=MSGPACK)
            return msgpack.unpackb(answer.raise_for_status().content)

        return httpx_page, http.close
    host, port = url.rsplit("/", 1)[1].split(":")
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = sock.makefile("rb", buffering=1 << 20)

    def lean_page(method: str, path: str, body: bytes) -> Any:
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/msgpack\r\n"
            f"Accept: application/msgpack\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        sock.sendall(head.encode() + body)
        status = reader.readline()
        length = -1
        while (line := reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if not status.startswith(b"HTTP/1.1 200") or length < 0:
            raise RuntimeError(f"unexpected answer {status!r}")
        body = reader.read(length)
        if client == "lean":
            return msgpack.unpackb(body)
        # "raw": the items array is walked whole by one skip() in C (every item parsed, no object made)
        # and counted from its header; the other fields (the cursor) are decoded
        unpacker = msgpack.Unpacker(max_buffer_size=max(len(body), 1 << 20))
        unpacker.feed(body)
        page: dict[str, Any] = {}
        for _ in range(unpacker.read_map_header()):
            field = unpacker.unpack()
            if field == "items":
                at = unpacker.tell()
                unpacker.skip()
                page["items"] = range(array_length(body, at))
            else:
                page[field] = unpacker.unpack()
        return page

    def close() -> None:
        reader.close()
        sock.close()

    return lean_page, close


def array_length(data: bytes, at: int) -> int:
    """The length of the msgpack array whose header starts at ``data[at]``."""
    head = data[at]
    if head & 0xF0 == 0x90:  # fixarray
        return head & 0x0F
    if head == 0xDC:  # array 16
        return int.from_bytes(data[at + 1 : at + 3], "big")
    if head == 0xDD:  # array 32
        return int.from_bytes(data[at + 1 : at + 5], "big")
    raise ValueError(f"not a msgpack array header: {head:#x}")


def diff_rate(
    url: str, pid: int, records: int, seconds: float, client: str
) -> tuple[float, float, float, list[int]]:
    """Records/s of two client processes reading a diff each over half of the keys, the CPU cores the
    clients and the server (all its processes) used meanwhile, and the client connections per server
    process (each client's connection on a process of its own, when the server has several)."""
    middle = b"key-%012d" % (records // 2)
    ranges = [(b"key-", middle, records // 2), (middle, b"key-\xff", records - records // 2)]
    context = multiprocessing.get_context("spawn")
    pipes, procs = [], []
    for lo, hi, expected in ranges:
        ours, theirs = context.Pipe()
        proc = context.Process(target=read_diff, args=(theirs, url, lo, hi, expected, seconds, client))
        proc.start()
        pipes.append(ours)
        procs.append(proc)
    for pipe in pipes:
        assert pipe.recv() == "ready"
    spread = balance(pid, pipes)
    server_cpu, start = tree_cpu_seconds(pid), time.perf_counter()
    for pipe in pipes:
        pipe.send("go")
    answers = [pipe.recv() for pipe in pipes]
    server_cpu, wall = tree_cpu_seconds(pid) - server_cpu, time.perf_counter() - start
    for proc in procs:
        proc.join()
    total = sum(rate for rate, _, _ in answers)
    client_cores = sum(cpu / own_wall for _, cpu, own_wall in answers)
    return float(total), client_cores, server_cpu / wall, spread


def balance(pid: int, pipes: list[Connection]) -> list[int]:
    """Reconnects the last client until no server process holds two client connections (when it has
    processes enough; at most 50 tries); the connections per process, as they are then.

    The kernel hands each connection to one worker by a hash of its addresses: two connections share
    a worker half of the time, which would measure the luck of the hash, not the workers.
    """
    workers = max(1, len(psutil.Process(pid).children()))
    for _ in range(50):
        deadline = time.monotonic() + 10
        while sum(spread := clients_per_process(pid)) < len(pipes) and time.monotonic() < deadline:
            time.sleep(0.01)  # the server accepts the new connection
        if workers < len(pipes) or max(spread) <= 1:
            return spread
        pipes[-1].send("again")
        assert pipes[-1].recv() == "ready"
    return spread


def clients_per_process(pid: int) -> list[int]:
    """How many client connections each process of the server holds (most first)."""
    root = psutil.Process(pid)
    counts = []
    for proc in [root, *root.children(recursive=True)]:
        try:
            established = [c for c in proc.net_connections("tcp") if c.status == psutil.CONN_ESTABLISHED]
        except psutil.NoSuchProcess:
            continue
        counts.append(len(established))
    return sorted((c for c in counts if c), reverse=True)


def committer(conn: Connection, data: str) -> None:
    """Child process: an embedded store; commits generation ``n`` of collection ``c`` on each request."""
    from diffstore import Store, StoreConfig

    with Store.open(data, StoreConfig(background=False)) as store:
        conn.send("ready")
        while (request := conn.recv()) is not None:
            name, n = request
            coll = store.collection(name)
            coll.start_generation(b"%06d" % n)
            coll.commit_generation(b"%06d" % n)
            conn.send(time.perf_counter())  # durable: commit_generation has returned


@contextmanager
def committing(data: Path) -> Iterator[Connection]:
    """A :func:`committer` process over ``data``: send ``(collection, n)``, receive the durable time."""
    context = multiprocessing.get_context("spawn")
    pipe, theirs = context.Pipe()
    proc = context.Process(target=committer, args=(theirs, str(data)))
    proc.start()
    assert pipe.recv() == "ready"
    try:
        yield pipe
    finally:
        pipe.send(None)
        proc.join()


def wait_rounds(
    url: str, commit_pipe: Connection | None, stamps: Path | None, rounds: int, waiters: int
) -> list[float]:
    """Latencies (ms) from each commit to each of ``waiters`` long polls holding its answer.

    With ``commit_pipe`` the commits come from an embedded store in another process; otherwise through
    HTTP, to a server that stamps each durable commit in ``stamps`` (http_api.SERVE_STAMPED).
    """
    port = int(url.rsplit(":", 1)[1])
    context = multiprocessing.get_context("spawn")
    latencies: list[float] = []
    with httpx.Client(base_url=url, timeout=60) as http:
        http.post("/collections/", json={"collectionName": "w", "isManual": True}).raise_for_status()
        for n in range(1, rounds + 1):
            given = "" if n == 1 else f"{n - 1:06d}"
            path = f"/collections/w/generationId/stream?generationId={given}&timeoutMs=60000"
            request = f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
            ours, theirs = context.Pipe()
            clients = context.Process(target=poll_clients, args=(theirs, port, waiters, request, None))
            clients.start()
            assert ours.recv() == "sent"
            while unread_by_server(port) > 0:
                time.sleep(0.005)
            time.sleep(0.05)  # lets the handlers register (they answer at once if they are late: no harm)
            if commit_pipe is not None:
                commit_pipe.send(("w", n))
                durable = commit_pipe.recv()
            else:
                http.post("/collections/w/generation/start", json={"generationId": {"value": f"{n:06d}"}})
                http.post(
                    "/collections/w/generation/commit", json={"generationId": {"value": f"{n:06d}"}}
                ).raise_for_status()
                assert stamps is not None
                durable = read_stamp(stamps, "w")
            arrived = ours.recv()
            clients.join()
            assert {body for _, body in arrived} == {b'{"generationId":{"value":"%06d"}}' % n}
            latencies += [(t - durable) * 1000 for t, _ in arrived]
    return sorted(latencies)


def fanout_round(
    url: str, pid: int, commit_pipe: Connection | None, stamps: Path | None, name: str, waiters: int
) -> tuple[float, float, float]:
    """p50, p99 (ms) of long polls from the durable commit (ours: ``commit_pipe``; else the floor), and
    the CPU (ms) server ``pid`` (with its children) used from just before the commit until every client
    held its answer: on 2 CPUs shared with the client process, what the fan-out takes from it."""
    port = int(url.rsplit(":", 1)[1])
    context = multiprocessing.get_context("spawn")
    with httpx.Client(base_url=url, timeout=60) as http:
        http.post("/collections/", json={"collectionName": name, "isManual": True}).raise_for_status()
        path = b"/collections/%s/generationId/stream?generationId=&timeoutMs=120000" % name.encode()
        request = b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path
        ours, theirs = context.Pipe()
        clients = context.Process(target=poll_clients, args=(theirs, port, waiters, request, None))
        clients.start()
        assert ours.recv() == "sent"
        while unread_by_server(port) > 0:
            time.sleep(0.01)
        time.sleep(0.2)
        cpu = tree_cpu_seconds(pid)
        if commit_pipe is not None:
            commit_pipe.send((name, 1))
            durable = commit_pipe.recv()
        else:
            assert stamps is not None
            http.post(f"/collections/{name}/generation/start", json={"generationId": {"value": "000001"}})
            http.post(f"/collections/{name}/generation/commit", json={"generationId": {"value": "000001"}})
            durable = read_stamp(stamps, name)
        arrived = ours.recv()
        cpu = tree_cpu_seconds(pid) - cpu
        clients.join()
    latencies = sorted((t - durable) * 1000 for t, _ in arrived)
    return percentile(latencies, 50), percentile(latencies, 99), cpu * 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of one diff-reading round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--wake-rounds", type=int, default=40)
    parser.add_argument("--waiters", type=int, default=1_000)
    parser.add_argument("--only", default="diff,wake,fanout")
    parser.add_argument("--fanout-workers", type=int, default=2)
    parser.add_argument(
        "--client",
        choices=("lean", "raw", "httpx"),
        default="raw",
        help="diff readers: one keep-alive connection receiving every byte and counting each page's items"
        " in C (raw), the same decoding every page with msgpack.unpackb (lean), or httpx",
    )
    args = parser.parse_args()
    only = set(args.only.split(","))
    root = Path(tempfile.mkdtemp(prefix="diffstore-workers-bench-"))
    print(machine())
    print(f"records={args.records} scratch={root} (shared, noisy machine)")
    try:
        if "diff" in only:
            rates: dict[int, list[float]] = {1: [], 2: []}
            cores: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
            for r in range(args.rounds):
                for workers in (1, 2) if r % 2 == 0 else (2, 1):
                    data = root / f"diff-{workers}-{r}"
                    with serve_process(data, workers) as (url, pid):
                        load(url, args.records)
                        measured = diff_rate(url, pid, args.records, args.seconds, args.client)
                    rate, client_cores, server_cores, spread = measured
                    rates[workers].append(rate)
                    cores[workers].append((client_cores, server_cores))
                    shutil.rmtree(data)
                    print(
                        f"diff round {r}, --workers {workers}: {rate:,.0f} records/s; CPU cores used: clients"
                        f" {client_cores:.2f}, server {server_cores:.2f} (per record: clients"
                        f" {client_cores / rate * 1e6:.2f} us, server {server_cores / rate * 1e6:.2f} us);"
                        f" connections per server process {spread}; load average {os.getloadavg()[0]:.1f}",
                        flush=True,
                    )
            one, two = statistics.median(rates[1]), statistics.median(rates[2])
            # CPU per record, from the one-worker rounds (cores / rate, the rate alike): one worker is one
            # GIL, at most about one core, so its rate is at most 1 / server; 2 workers and the clients on
            # 2 CPUs make at most 2 / (server + client): the ratio is at most 2 server / (server + client)
            client_one = statistics.median(c for c, _ in cores[1])
            server_one = statistics.median(s for _, s in cores[1])
            bound = 2 * server_one / (server_one + client_one) if server_one + client_one else float("nan")
            per_c, per_s = client_one / one * 1e6, server_one / one * 1e6
            busy_two = statistics.median(c + s for c, s in cores[2])
            print(
                f"diff pages, 2 {args.client} client processes over 2 key ranges: --workers 2 {two:,.0f}"
                f" records/s, --workers 1 {one:,.0f}; ratio {two / one:.2f} (goal >= 1.6)."
                f" CPU per record with one worker: server s = {per_s:.2f} us ({server_one:.2f} cores),"
                f" clients c = {per_c:.2f} us ({client_one:.2f} cores), c/s = {client_one / server_one:.2f};"
                f" on {len(os.sched_getaffinity(0))} CPUs shared by both, 2 workers can reach at most"
                f" 2s/(s+c) = {bound:.2f}x one worker (one worker: about one core, its GIL), less whatever"
                f" else runs; with 2 workers clients and server kept {busy_two:.2f} cores busy"
            )
        if "wake" in only:
            with serve(root / "wake-2", 2) as url, committing(root / "wake-2") as pipe:
                cross = wait_rounds(url, pipe, None, args.wake_rounds, 10)
            with child(SERVE_STAMPED, str(root / "wake-1"), str(root / "wake-stamps")) as url:
                local = wait_rounds(url, None, root / "wake-stamps", args.wake_rounds, 10)
            c50, c99, l50, l99 = (percentile(x, p) for x in (cross, local) for p in (50, 99))
            print(
                f"wake-up: commit by another process -> long poll answered ({len(cross)} answers, 2 workers):"
                f" p50 {c50:.2f} ms, p99 {c99:.2f} ms (goal <= 5 ms); baseline, commits through HTTP of a"
                f" one-process server: p50 {l50:.2f} ms, p99 {l99:.2f} ms; p99 ratio {c99 / l99:.2f}"
            )
        if "fanout" in only:
            raise_fd_limit(args.waiters + 200)
            n = args.fanout_workers
            results: dict[str, list[tuple[float, float, float]]] = {"ours": [], "floor": [], "floor-n": []}
            stamps = {"floor": root / "floor-stamps", "floor-n": root / "floor-n-stamps"}
            with (
                serve_process(root / "fanout", n) as (url, pid),
                committing(root / "fanout") as pipe,
                child(FANOUT_FLOOR, str(stamps["floor"])) as floor_url,
                child(FANOUT_FLOOR_PROCESSES, str(stamps["floor-n"]), str(n)) as floor_n_url,
            ):
                pids = {"ours": pid}
                for proc in psutil.Process().children():  # each floor's process, by its stamps argument
                    for name, path in stamps.items():
                        if str(path) in proc.cmdline():
                            pids[name] = proc.pid
                urls = {"ours": url, "floor": floor_url, "floor-n": floor_n_url}
                order = ["ours", "floor", "floor-n"]
                for r in range(args.rounds):
                    for which in order[r % 3 :] + order[: r % 3]:
                        results[which].append(
                            fanout_round(
                                urls[which],
                                pids[which],
                                pipe if which == "ours" else None,
                                stamps.get(which),
                                f"f{r}",
                                args.waiters,
                            )
                        )
                    print(
                        f"fan-out round {r}:"
                        + ",".join(
                            f" {which} p50 {results[which][-1][0]:.1f} ms p99 {results[which][-1][1]:.1f} ms"
                            f" (server CPU {results[which][-1][2]:.1f} ms)"
                            for which in order
                        )
                        + f"; load average {os.getloadavg()[0]:.1f}",
                        flush=True,
                    )
            (p50, p99, cpu), (floor50, floor99, floor_cpu), (n50, n99, n_cpu) = (
                tuple(statistics.median(x[i] for x in results[which]) for i in (0, 1, 2)) for which in order
            )
            print(
                f"long poll, {args.waiters} waiters over {n} workers, woken by another process's commit:"
                f" p50 {p50:.1f} ms, p99 {p99:.1f} ms; bare fan-out floor (one process) p50 {floor50:.1f} ms,"
                f" p99 {floor99:.1f} ms; p99 ratio {p99 / floor99:.2f} (goal <= 1.1). The same floor spread"
                f" over {n} processes woken by a datagram: p50 {n50:.1f} ms, p99 {n99:.1f} ms (ours / it:"
                f" {p99 / n99:.2f}). Server CPU from the commit until every client held its answer: ours"
                f" {cpu:.1f} ms, floor {floor_cpu:.1f} ms, floor over {n} processes {n_cpu:.1f} ms; on"
                f" {len(os.sched_getaffinity(0))} CPUs the client process reading the answers shares them"
                " with the servers"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
