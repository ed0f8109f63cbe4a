"""What the HTTP metrics cost each request: the metrics middleware around a minimal ASGI app, in-process.

    .venv/bin/python benchmarks/metrics_overhead.py [--requests 200000] [--rounds 5]

Each round calls a minimal ASGI app (it answers a 200 with a 2-byte body) N times with the scope of a point
read (``POST /collections/c/get``, a fast-lane route), once bare (the baseline) and once inside
:class:`diffstore.server.metrics.HttpMetrics` (route template, counter and histogram); printed: microseconds
per request of both, the difference (what the metrics add to every request) and the ratio, medians of
rounds. For scale: a point get over HTTP costs this server ~100 us of CPU (benchmarks/http_api.py --only get,
~10,000 req/s on one core). The machine is shared with other jobs: figures move between runs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _harness import machine  # noqa: E402

from diffstore.engine.store import Store  # noqa: E402
from diffstore.server.metrics import HttpMetrics, ServerMetrics  # noqa: E402
from diffstore.server.routes import FAST_LANE  # noqa: E402

SCOPE = {"type": "http", "path": "/collections/c/get", "method": "POST", "headers": []}


async def answer(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


async def receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b""}


async def send(message: Any) -> None:
    return None


async def per_request_us(app: Any, n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        await app(dict(SCOPE), receive, send)
    return (time.perf_counter() - started) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory() as directory, Store.open(directory) as store:
        from diffstore.server.longpoll import CommitHub

        metrics = ServerMetrics(store, CommitHub())
        wrapped = HttpMetrics(answer, metrics, [], frozenset(FAST_LANE))
        bare_rounds, wrapped_rounds = [], []
        for _ in range(args.rounds):
            bare_rounds.append(asyncio.run(per_request_us(answer, args.requests)))
            wrapped_rounds.append(asyncio.run(per_request_us(wrapped, args.requests)))
        bare, with_metrics = statistics.median(bare_rounds), statistics.median(wrapped_rounds)
        print(f"bare ASGI app: {bare:.2f} us/request (baseline)")
        print(
            f"with HttpMetrics: {with_metrics:.2f} us/request = {with_metrics / bare:.2f}x baseline;"
            f" the metrics add {with_metrics - bare:.2f} us to every request (median of {args.rounds} rounds)"
        )


if __name__ == "__main__":
    main()
