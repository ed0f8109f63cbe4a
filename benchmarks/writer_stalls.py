"""A writer's latency beside a stalled backup and beside a large revert, each against the same writer alone,
measured in the same run (issue 54, items 2 and 5).

One server (uvicorn in a thread of this process, over a store in a temporary directory). The writer is an
HTTP client that writes without pause: puts into an automatic collection and, every ``--fail-every``-th
request, a commit of a generation that is not open (409 ``generationMismatch``: a write transaction that
is aborted). Its latencies (p50, p99, max) are taken:

1. alone (the baseline);
2. while ``GET /backup`` streams to a client that stopped reading after the answer's head (the stall
   timeout off): the copy made by a process of its own (this version);
3. the same with the copy made in the server's process, as before this version (``env.copyfd`` in a
   thread): the first failing write waits for the copy, holding LMDB's write lock, and every write after it
   waits too; a request that takes longer than ``--timeout-s`` counts as that long;
Then the store file's growth beside a writer that writes and frees 10 MB over and over (item 3): alone,
beside a stalled backup that the stall timeout ends after 1 s, and beside one never ended (its copy's
read transaction keeps every page freed meanwhile from being reused). Then the writer's latency (puts
only, into another collection):

4. while a manual collection's revert of ``--revert-keys`` keys runs (``POST /revert``, in batches);
5. the same revert in one write transaction (as before this version: ``Collection.revert`` with one batch);
   ``--other-batches`` tries other batch sizes.

Run: ``python benchmarks/writer_stalls.py`` (about a minute). Figures on a loaded machine are indicative:
the script prints the load average with them.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
from _harness import load_average, machine, ratio_line, server_thread

from diffstore import Store, StoreConfig
from diffstore.engine import backup
from diffstore.server import ServerConfig, create_app
from diffstore.server.serving import GracefulServer

Latencies = list[float]


def writer(
    url: str, seconds: float, fail_every: int, timeout_s: float, until: threading.Event | None
) -> Latencies:
    """Writes for ``seconds`` (or until ``until`` is set); the latency of every request."""
    took: Latencies = []
    n = 0
    with httpx.Client(base_url=url, timeout=timeout_s) as http:
        ends = time.monotonic() + seconds
        while time.monotonic() < ends and not (until is not None and until.is_set()):
            n += 1
            started = time.perf_counter()
            try:
                if fail_every and n % fail_every == 0:
                    answer = http.post(
                        "/collections/m/generation/commit", json={"generationId": {"value": "no"}}
                    )
                    assert answer.status_code == 409, answer.text
                else:
                    body = {"item": {"key": {"value": f"k{n % 1000}"}, "value": {"value": "v"}}}
                    answer = http.post("/collections/w/put", json=body)
                    assert answer.status_code == 200, answer.text
            except httpx.TimeoutException:
                pass  # counted as the timeout
            took.append(min(time.perf_counter() - started, timeout_s))
    return took


def p(values: Latencies, q: float) -> float:
    return (
        statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]
    )


def report(name: str, values: Latencies, base: Latencies) -> None:
    print(
        f"{name}: {len(values)} writes, p50 {p(values, 50) * 1e3:.2f} ms, p99 {p(values, 99) * 1e3:.2f} ms,"
        f" max {max(values) * 1e3:.1f} ms"
    )
    print("  " + ratio_line("p99", p(values, 99) * 1e3, p(base, 99) * 1e3, "ms"))


@contextmanager
def stalled_backup(url: str) -> Iterator[None]:
    """A ``GET /backup`` whose client reads the answer's head and then stops reading."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    try:
        sock.sendall(b"GET /backup HTTP/1.1\r\nHost: bench\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 200"), head
        yield
    finally:
        sock.close()


def copy_in_process(store: Any, fd: int, stop: threading.Event | None = None) -> None:
    """``backup.stream_to`` as it was: LMDB's copy in the server's process."""
    try:
        store.env.copyfd(fd, compact=True)
    finally:
        os.close(fd)


def during(job: Callable[[], Any], url: str, args: argparse.Namespace, fail_every: int) -> Latencies:
    """The writer's latencies while ``job`` runs in a thread (from its start to its end)."""
    done = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            job()
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    took = writer(url, 600.0, fail_every, args.timeout_s, done)
    thread.join()
    if errors:
        raise errors[0]
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each backup phase (default 4)")
    parser.add_argument(
        "--fail-every", type=int, default=5, help="every Nth write fails with 409 (default 5)"
    )
    parser.add_argument("--timeout-s", type=float, default=5.0, help="a request's timeout (default 5)")
    parser.add_argument("--backup-mb", type=int, default=40, help="size of the store backed up (default 40)")
    parser.add_argument(
        "--revert-keys", type=int, default=120_000, help="keys the revert writes (default 120k)"
    )
    parser.add_argument(
        "--other-batches",
        type=lambda text: [int(x) for x in text.split(",") if x],
        default=[],
        help="batch sizes to try besides the default (comma-separated, e.g. 1000,20000)",
    )
    args = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory(prefix="writer-stalls-") as tmp:
        store = Store.open(Path(tmp) / "s", StoreConfig(commit_delay_ms=50))
        config = ServerConfig(backup_stall_timeout_s=0)  # the stall lasts as long as the phase
        app = create_app(store, config)
        args.app = app
        try:
            with server_thread(
                lambda port: GracefulServer(app, config, port=port, log_level="error")
            ) as served:
                run(store, served.url, args)
        finally:
            store.close()
    print(f"load average after: {load_average()}")
    return 0


def churn(store: Store, seconds: float) -> tuple[int, int]:
    """A writer that frees what it wrote, over and over (a generation of 10 MB written, then aborted):
    (cycles, bytes the store file grew by). Without a reader pinning them the freed pages are reused."""
    c = store.collection("churn")
    before = (store.path / "data.mdb").stat().st_size
    cycles = 0
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        cycles += 1
        gen = b"%08d" % cycles
        c.start_generation(gen)
        c.put_many([(b"c%04d" % i, b"x" * 100_000) for i in range(100)], generation_id=gen)
        c.abort_generation(gen)
    return cycles, (store.path / "data.mdb").stat().st_size - before


def growth(store: Store, url: str, args: argparse.Namespace) -> None:
    """The store file's growth beside the churning writer: alone, beside a stalled backup that the stall
    timeout ends, beside one it does not (item 3)."""
    store.create_collection("churn", manual=True)
    app_state = args.app.state
    mb = 1 << 20

    def line(name: str, cycles: int, grew: int) -> None:
        print(
            f"store file growth {name}: {grew / mb:,.0f} MB over {cycles} cycles of 10 MB written and freed"
        )

    line("alone (baseline)", *churn(store, args.seconds))
    config = app_state.config
    app_state.config = replace(config, backup_stall_timeout_s=1.0)
    try:
        with stalled_backup(url):
            ended = churn(store, args.seconds)
    finally:
        app_state.config = config
    line("beside a stalled backup ended after 1 s (--backup-stall-timeout-s 1)", *ended)
    with stalled_backup(url):
        pinned = churn(store, args.seconds)
    line("beside a stalled backup never ended (--backup-stall-timeout-s 0)", *pinned)
    per_ended, per_pinned = ended[1] / ended[0] / mb, pinned[1] / pinned[0] / mb
    print(
        "  " + ratio_line("growth per cycle", per_ended, per_pinned, "MB", "ended after 1 s vs never ended")
    )


def run(store: Store, url: str, args: argparse.Namespace) -> None:
    with httpx.Client(base_url=url, timeout=60) as http:
        http.post("/collections/", json={"collectionName": "m", "isManual": True}).raise_for_status()
        http.post("/collections/", json={"collectionName": "w", "isManual": False}).raise_for_status()
    big = store.create_collection("big", manual=True)
    big.start_generation(b"1")
    big.put_many([(b"b%08d" % i, os.urandom(1000)) for i in range(args.backup_mb * 1000)], generation_id=b"1")
    big.commit_generation(b"1")

    base = writer(url, args.seconds, args.fail_every, args.timeout_s, None)
    report("alone (baseline)", base, base)
    with stalled_backup(url):
        took = writer(url, args.seconds, args.fail_every, args.timeout_s, None)
    report("beside a stalled backup, copy in its own process", took, base)
    original = backup.stream_to
    backup.stream_to = copy_in_process  # type: ignore[assignment]
    try:
        with stalled_backup(url):
            took = writer(url, args.seconds, args.fail_every, args.timeout_s, None)
    finally:
        backup.stream_to = original
    report(
        f"beside a stalled backup, copy in the server's process (a write >= {args.timeout_s:g} s)", took, base
    )
    time.sleep(1.0)  # the stalled copy's client is gone: its abort went through, the store is quiet again

    growth(store, url, args)

    r = store.create_collection("r", manual=True)
    for gen, value in ((b"1", b"old"), (b"2", b"new")):
        r.start_generation(gen)
        for start in range(0, args.revert_keys, 20_000):
            keys = range(start, min(args.revert_keys, start + 20_000))
            r.put_many([(b"r%08d" % i, value * 20) for i in keys], generation_id=gen)
        r.commit_generation(gen)
    base = writer(url, args.seconds, 0, args.timeout_s, None)
    report("puts alone (baseline)", base, base)
    r.start_generation(b"3")

    def revert_over_http() -> None:
        with httpx.Client(base_url=url, timeout=600) as http:
            body = {"toGenerationId": {"value": "1"}, "generationId": {"value": "3"}}
            answer = http.post("/collections/r/revert", json=body)
            assert answer.status_code == 200 and answer.json()["changedKeys"] == args.revert_keys, answer.text

    started = time.perf_counter()
    took = during(revert_over_http, url, args, 0)
    print(f"revert of {args.revert_keys:,} keys in batches: {time.perf_counter() - started:.2f} s")
    report("beside a revert in batches", took, base)
    for batch in (*args.other_batches, 10**9):
        r.abort_generation(b"3")
        r.start_generation(b"3")
        started = time.perf_counter()
        took = during(lambda batch=batch: r.revert(b"1", generation_id=b"3", batch_keys=batch), url, args, 0)
        how = "in one transaction" if batch == 10**9 else f"in batches of {batch:,} (engine call)"
        print(f"revert of {args.revert_keys:,} keys {how}: {time.perf_counter() - started:.2f} s")
        report(f"beside a revert {how}", took, base)


if __name__ == "__main__":
    sys.exit(main())
