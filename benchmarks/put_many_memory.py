"""Memory of large msgpack putMany bodies: the parse alone, and a real server taking several at once.

1. Parse: one body of ``--items`` items decoded as the server does it (``decode_put_many`` + ``parse_items``:
   items become ``(key, value)`` pairs while msgpack decodes them) against the way it did before (a dict per
   item, then copied into pairs) -- tracemalloc's peak of Python objects and the time, in the same run.
2. Server: ``diffstore serve`` in a subprocess takes ``--clients`` such putManys at once (one collection
   each); the figure is the server process's peak RSS (``VmHWM``). With ``--baseline-src DIR`` (the
   ``diffstore`` package of an older revision, e.g. ``git archive REV diffstore | tar -x -C DIR``) the same
   is measured for a server run from that tree, and the ratios printed.

The machine is shared and noisy: times vary by 2x between runs; peak memory is steadier.

    .venv/bin/python benchmarks/put_many_memory.py [--items 1000000] [--clients 3] [--baseline-src DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import httpx
import msgpack
from _harness import diffstore_serve, machine

from diffstore.wire import MSGPACK
from diffstore.wire_items import decode_put_many, parse_items

ROOT = Path(__file__).resolve().parent.parent


def body_of(items: int, tag: int) -> bytes:
    return msgpack.packb(  # type: ignore[no-any-return]
        # 8-byte keys, 6-byte values: 1M items are 29 MB, within putMany's 32 MiB before the key allowance
        {"items": [{"key": b"%c%07d" % (65 + tag, i), "value": b"%06d" % (i % 10**6)} for i in range(items)]},
        use_bin_type=True,
    )


def parse_before(raw: bytes) -> Any:
    """What the server did before: msgpack's dicts, then the pairs copied out of them."""
    obj = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    return [(item["key"], item["value"]) for item in obj["items"]]


def parse_now(raw: bytes) -> Any:
    return parse_items(decode_put_many(raw, MSGPACK)["items"], MSGPACK)


def measure_parse(raw: bytes, rounds: int = 2) -> dict[str, tuple[float, float]]:
    """name -> (peak MiB of Python objects, best seconds) for each way."""
    found: dict[str, tuple[float, float]] = {}
    for name, parse in (("before", parse_before), ("now", parse_now)):
        tracemalloc.start()
        result = parse(raw)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        del result
        best = float("inf")
        for _ in range(rounds):
            started = time.perf_counter()
            result = parse(raw)
            best = min(best, time.perf_counter() - started)
            del result
        found[name] = (peak, best)
    return found


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def measure_server(src: Path, bodies: list[bytes]) -> tuple[float, float, float, list[int]]:
    """A server from ``src``: idle peak RSS MiB, peak RSS MiB after the concurrent putManys, their wall
    time, their statuses."""
    # the server's own CLI only (not the whole ``diffstore`` command), as older revisions' trees have it
    driver = (
        "import argparse, sys; from diffstore.server.cli import add_commands; p = argparse.ArgumentParser();"
        " add_commands(p.add_subparsers()); a = p.parse_args(); sys.exit(a.func(a))"
    )
    env = {**os.environ, "PYTHONPATH": str(src)}
    env.pop("DIFFSTORE_TOKEN", None)
    with (
        tempfile.TemporaryDirectory() as data,
        diffstore_serve(Path(data), cwd=src, env=env, command=[sys.executable, "-c", driver]) as served,
        httpx.Client(base_url=served.url, timeout=600) as http,
    ):
        for i in range(len(bodies)):
            http.post("/collections/", json={"collectionName": f"c{i}", "isManual": False})
        idle = peak_rss_mib(served.pid)
        statuses: list[int] = [0] * len(bodies)

        def send(i: int) -> None:
            with httpx.Client(base_url=served.url, timeout=600) as client:
                response = client.post(
                    f"/collections/c{i}/putMany",
                    content=bodies[i],
                    headers={"content-type": "application/msgpack"},
                )
                statuses[i] = response.status_code

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return idle, peak_rss_mib(served.pid), time.perf_counter() - started, statuses


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--baseline-src", type=Path, help="a checkout of the revision to compare with")
    parser.add_argument("--skip-server", action="store_true")
    args = parser.parse_args()
    print(machine())
    bodies = [body_of(args.items, i) for i in range(args.clients)]
    print(f"{args.items:,} items per body, {len(bodies[0]) / 2**20:.1f} MiB each (msgpack)")
    parsed = measure_parse(bodies[0])
    (peak_before, time_before), (peak_now, time_now) = parsed["before"], parsed["now"]
    print(
        f"parse: peak {peak_now:.0f} MiB of objects (before: {peak_before:.0f} MiB,"
        f" ratio {peak_now / peak_before:.2f}); {time_now:.2f} s (before: {time_before:.2f} s,"
        f" ratio {time_now / time_before:.2f})"
    )
    if args.skip_server:
        return
    idle, peak, took, statuses = measure_server(ROOT, bodies)
    print(
        f"server now: peak RSS {peak:.0f} MiB over {args.clients} concurrent putManys (idle {idle:.0f});"
        f" {took:.1f} s; {statuses}"
    )
    if args.baseline_src is not None:
        base_idle, base_peak, base_took, base_statuses = measure_server(args.baseline_src.resolve(), bodies)
        print(
            f"server baseline ({args.baseline_src}): peak RSS {base_peak:.0f} MiB (idle {base_idle:.0f});"
            f" {base_took:.1f} s; {base_statuses}; ratio now/baseline: memory {peak / base_peak:.2f},"
            f" time {took / base_took:.2f}"
        )


if __name__ == "__main__":
    main()
