"""What HTTPS costs against plain HTTP: a point ``get``, a 1,000-item diff page, and the wake-up of 1,000
long polls, each over keep-alive connections.

    .venv/bin/python benchmarks/tls.py [--rounds 12] [--gets 400] [--pages 60] [--waiters 1000] [--wakes 8]

Two ``diffstore serve --workers 1`` processes over one data directory (a private CA and a server
certificate made with openssl at the start), one plain, one with ``--tls-cert/--tls-key``; clients keep
their connections, so the handshake is paid once, as by any long-lived client.

- ``get`` and diff page: the two servers are asked in turn, request by request (which goes first swaps
  each time), so that both see the same moments of a machine shared with other jobs. Each round gives the
  ratio of its two medians; printed: the p50 over all rounds and the **median of the rounds' ratios**
  (goals: get <= 1.3x, diff page <= 1.2x). A ratio of blocks timed one after the other (a block of plain
  requests, then a block of HTTPS ones) moved 0.82-1.28x between runs: a neighbour's burst fell into one
  block and not the other.
- long-poll fan-out: ``--waiters`` long polls (``generationId/stream``) on one collection, each on its own
  connection of one asyncio client, parked until ``/metrics`` counts them all; then one commit, and each
  waiter's wake-up is timed from just before the commit was sent (the handshakes of new connections
  happen before: every poll is parked first). Printed: the p99 (and p50) of the
  wake-ups, median over ``--wakes`` fan-outs per server, the servers alternating (goal p99 <= 1.2x). The
  waiters run on uvloop, as the server does: with asyncio's loop, whose TLS runs in Python, the one client
  process decrypting 1,000 answers is what an HTTPS fan-out measures (``--client-loop asyncio``).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import free_port, load_average, machine, median, ratio_line, stop, wait_for  # noqa: E402

from diffstore.client import AsyncClient, Client  # noqa: E402
from diffstore.client import _calls as calls  # noqa: E402
from diffstore.errors import StorageError  # noqa: E402
from tests.helpers import make_certificates  # noqa: E402

DIFF_ITEMS = 1_000
SCHEMES = ("http", "https")
WAITERS_DEADLINE_S = 120.0


def start(data: Path, *args: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    command = [sys.executable, "-m", "diffstore.cli", "serve", "--data", str(data), "--port", str(port)]
    process = subprocess.Popen([*command, "--workers", "1", "--log-level", "warning", *args])
    return process, port


def interleaved(actions: dict[str, Callable[[], Any]], n: int, first: int) -> dict[str, list[float]]:
    """Microseconds of ``n`` calls of each action, the actions called in turn (who goes first swaps)."""
    times: dict[str, list[float]] = {name: [] for name in actions}
    names = list(actions)
    for i in range(n):
        order = names if (i + first) % 2 == 0 else names[::-1]
        for name in order:
            started = time.perf_counter()
            actions[name]()
            times[name].append((time.perf_counter() - started) * 1e6)
    return times


class Figure:
    """One measured thing: every sample of each scheme, and each round's ratio of medians."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = {scheme: [] for scheme in SCHEMES}
        self.ratios: list[float] = []

    def add(self, times: dict[str, list[float]]) -> None:
        for scheme in SCHEMES:
            self.samples[scheme] += times[scheme]
        self.ratios.append(median(times["https"]) / median(times["http"]))

    def line(self, name: str, unit: str, goal: str, scale: float = 1.0) -> str:
        ours, base = median(self.samples["https"]) * scale, median(self.samples["http"]) * scale
        low, high = min(self.ratios), max(self.ratios)
        rounds = f"median of {len(self.ratios)} rounds' ratios {median(self.ratios):.2f}"
        return f"{ratio_line(name, ours, base, unit)}; {rounds} ({low:.2f}-{high:.2f}; {goal})"


def waiting(url: str, verify: Any) -> int:
    """How many long polls the server holds now (``diffstore_longpoll_waiters`` in ``/metrics``)."""
    text = httpx.get(f"{url}/metrics", verify=verify, timeout=30).text
    found = re.search(r"^diffstore_longpoll_waiters(?:\{[^}]*\})? ([0-9.e+]+)$", text, re.MULTILINE)
    return int(float(found.group(1))) if found else 0


async def fan_out(url: str, verify: Any, client: AsyncClient, commit: Client, waiters: int) -> list[float]:
    """Seconds from just before one commit to each of ``waiters`` long polls' return."""
    collection = commit.collection("poll")
    current = collection.generation_id
    done: list[float] = []

    async def wait() -> None:
        seen, failures = current, 0
        while seen == current:  # the server may answer an open generation's start: ask again
            try:
                seen = await client.execute(calls.generation_stream("poll", current, 60_000))
            except StorageError:  # a kept connection the server closed meanwhile: as any client, ask again
                failures += 1
                if failures > 3:
                    raise
        done.append(time.perf_counter())

    tasks = [asyncio.create_task(wait()) for _ in range(waiters)]
    deadline = time.monotonic() + WAITERS_DEADLINE_S
    while await asyncio.to_thread(waiting, url, verify) < waiters:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url}: the {waiters} long polls never all reached the server")
        await asyncio.sleep(0.05)
    next_generation = (int.from_bytes(current, "big") + 1).to_bytes(8, "big")
    sent = time.perf_counter()
    await asyncio.to_thread(collection.write_generation, next_generation, [(b"k", next_generation)])
    await asyncio.gather(*tasks)
    return [at - sent for at in done]


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


async def long_polls(
    urls: dict[str, str], verifies: dict[str, Any], commits: dict[str, Client], waiters: int, wakes: int
) -> tuple[Figure, Figure]:
    limits = httpx.Limits(max_connections=waiters + 10, max_keepalive_connections=waiters + 10)
    clients = {}
    for scheme in SCHEMES:
        http = httpx.AsyncClient(verify=verifies[scheme], limits=limits, timeout=90)
        clients[scheme] = AsyncClient(urls[scheme], http=http)
    p99, p50 = Figure(), Figure()
    for wake in range(wakes):
        order = SCHEMES if wake % 2 == 0 else SCHEMES[::-1]
        latencies = {}
        for scheme in order:
            latencies[scheme] = await fan_out(
                urls[scheme], verifies[scheme], clients[scheme], commits[scheme], waiters
            )
        p99.add({s: [percentile(v, 99) * 1e3] for s, v in latencies.items()})
        p50.add({s: [percentile(v, 50) * 1e3] for s, v in latencies.items()})
    for client in clients.values():
        await client.close()
    return p99, p50


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=12, help="rounds of gets and pages")
    parser.add_argument("--gets", type=int, default=400, help="point gets per round and server")
    parser.add_argument("--pages", type=int, default=60, help="diff pages per round and server")
    parser.add_argument("--waiters", type=int, default=1_000, help="long polls of one fan-out")
    parser.add_argument("--wakes", type=int, default=8, help="fan-outs per server")
    parser.add_argument(
        "--client-loop",
        choices=("asyncio", "uvloop"),
        default="uvloop",
        help="the waiters' event loop (default uvloop, as the server's; asyncio's TLS runs in Python and the"
        " one client process's own cost then dominates the HTTPS wake-ups: 1.70x against 1.03x)",
    )
    args = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        certs = make_certificates(root / "certs")
        data = root / "data"
        plain, plain_port = start(data)
        secure, secure_port = start(
            data, "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)
        )
        urls = {"http": f"http://127.0.0.1:{plain_port}", "https": f"https://127.0.0.1:{secure_port}"}
        verifies: dict[str, Any] = {"http": True, "https": ssl.create_default_context(cafile=str(certs.ca))}
        try:
            clients = {
                "http": Client(urls["http"], timeout_s=90),
                "https": Client(urls["https"], ca_file=str(certs.ca), timeout_s=90),
            }
            wait_for(clients["http"].healthz, "the plain server", process=plain)
            wait_for(clients["https"].healthz, "the TLS server", process=secure)
            collection = clients["http"].create_collection("c")
            collection.write_generation(b"g1", [(b"key-%06d" % i, b"v" * 100) for i in range(DIFF_ITEMS)])
            clients["http"].create_collection("poll").write_generation((1).to_bytes(8, "big"), [(b"k", b"v")])
            handles = {scheme: client.collection("c") for scheme, client in clients.items()}
            for handle in handles.values():  # warm: connections open, pages cached alike
                assert len(handle.diff_page(b"", b"g1", limit=DIFF_ITEMS).items) == DIFF_ITEMS
            gets, pages = Figure(), Figure()
            for round_ in range(args.rounds):
                gets.add(
                    interleaved(
                        {s: (lambda h=h: h.get(b"key-000500")) for s, h in handles.items()}, args.gets, round_
                    )
                )
                pages.add(
                    interleaved(
                        {
                            s: (lambda h=h: h.diff_page(b"", b"g1", limit=DIFF_ITEMS))
                            for s, h in handles.items()
                        },
                        args.pages,
                        round_,
                    )
                )
            if args.client_loop == "uvloop":  # as the server's: TLS in compiled code, not asyncio's Python
                import uvloop

                asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
            p99, p50 = asyncio.run(long_polls(urls, verifies, clients, args.waiters, args.wakes))
            print(
                f"baseline: the same requests over plain http, same run; load average after: {load_average()}"
            )
            print(gets.line("point get p50", "us", "goal <= 1.3"))
            print(pages.line(f"diff page of {DIFF_ITEMS:,} p50", "ms", "goal <= 1.2", 1e-3))
            print(p99.line(f"{args.waiters:,} long polls: p99", "ms", "goal <= 1.2"))
            print(p50.line(f"{args.waiters:,} long polls: p50", "ms", "no goal"))
            for client in clients.values():
                client.close()
        finally:
            stop(plain)
            stop(secure)


if __name__ == "__main__":
    main()
