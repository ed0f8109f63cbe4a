"""What parked ``/overview/changes`` long polls (open console tabs) cost a server that has nothing to do.

    .venv/bin/python benchmarks/overview_changes.py [--waiters 1000] [--window 3]

Serves a fresh store with 20 collections (uvicorn in a thread of this process, as ``diffstore serve``
runs it), then measures this process's CPU time (user + system) over an idle window twice: with no long
poll open (the baseline) and once N ``/overview/changes`` polls have all been registered. Printed: CPU
seconds per second of both, the ratio, and the checks of the overview's version in the window (the old route
recomputed a digest of every collection and reader per waiter every 200 ms: 50 waiters used 1.2 cores).
The machine is shared with other jobs: figures move between runs (the load average is printed too).
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _harness import machine, server_thread, wait_for  # noqa: E402

from diffstore.engine.store import Store  # noqa: E402
from diffstore.server import ServerConfig, create_app  # noqa: E402
from diffstore.server.serving import GracefulServer  # noqa: E402


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def idle_cpu(window: float) -> float:
    before = cpu_seconds()
    time.sleep(window)
    return (cpu_seconds() - before) / window


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--waiters", type=int, default=1000)
    parser.add_argument("--window", type=float, default=3.0)
    args = parser.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory() as data, Store.open(data) as store:
        config = ServerConfig()
        app = create_app(store, config)
        polls: list[socket.socket] = []
        watch = app.state.overview_watch

        def make_server(port: int) -> GracefulServer:
            return GracefulServer(app, config, log_level="warning", log_config=None)

        with server_thread(make_server) as served:
            url, port = served.url, served.port
            try:
                for n in range(20):
                    httpx.post(f"{url}/collections/", json={"collectionName": f"c{n}", "isManual": True})
                since = httpx.get(f"{url}/overview/changes").json()["version"]
                time.sleep(1.0)  # the requests above are done
                baseline = idle_cpu(args.window)
                line = f"GET /overview/changes?since={since}&timeoutMs=60000 HTTP/1.1\r\n"
                for _ in range(args.waiters):
                    poll = socket.create_connection(("127.0.0.1", port))
                    poll.sendall(line.encode() + b"Host: x\r\n\r\n")
                    polls.append(poll)
                wait_for(lambda: watch.waiting() == args.waiters, "every poll registered", 300.0)
                time.sleep(0.5)  # the check the last registration started
                checks = watch.checks
                parked = idle_cpu(args.window)
                checks = watch.checks - checks
            finally:
                for poll in polls:
                    poll.close()
    print(f"load average {os.getloadavg()[0]:.1f}")
    print(f"no poll open:           {baseline:.4f} CPU s/s")
    ratio = parked / max(baseline, 1e-6)
    print(f"{args.waiters} polls registered: {parked:.4f} CPU s/s   {ratio:.2f}x the baseline", end="")
    print(f"; {checks} checks of the version in the window")


if __name__ == "__main__":
    main()
