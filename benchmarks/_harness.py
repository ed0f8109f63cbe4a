"""What every benchmark shares: servers in child processes (or a thread), waits with a deadline, medians
and ratios, and the facts of the machine a figure comes from.

A figure means little without the machine it was measured on (CPUs, load, Python, whether the engine's
accelerator ran) and a baseline measured in the same run: :func:`machine` is printed first by every
benchmark and :func:`ratio_line` prints a figure beside its baseline. Every wait here has a deadline and
fails naming what never happened, also when the process it waits for has died.

    from _harness import diffstore_serve, machine, ratio_line   # scripts run as benchmarks/NAME.py
"""

from __future__ import annotations

import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
START_DEADLINE_S = 60.0
STOP_DEADLINE_S = 60.0


def machine() -> str:
    """One line: CPUs (and those this process may use), load average, Python, platform, accelerator."""
    try:
        from diffstore.engine import layout

        accel = "compiled accelerator" if layout.ACCEL is not None else "pure Python"
    except ImportError:
        accel = "engine not importable"
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"machine: {os.cpu_count()} CPUs ({usable} usable), load average {load}, "
        f"Python {platform.python_version()}, {platform.system()} {platform.machine()}, engine: {accel}"
    )


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def ratio_line(name: str, ours: float, baseline: float, unit: str, goal: str = "") -> str:
    """``name  ours unit  baseline unit  ratio r (goal)``: a figure beside its baseline of the same run."""
    text = f"{name:<24} {ours:>14,.2f} {unit}   baseline {baseline:>14,.2f} {unit}"
    text += f"   ratio {ours / baseline:.2f}"
    return f"{text} ({goal})" if goal else text


def round_phases(phases: list[tuple[str, float]], started: float, read: str, job: str) -> dict[str, float]:
    """Where a transform round's seconds went, from its ``on_event`` times (event, perf_counter) since
    ``started``: planning and starting it, reading its diffs (``read`` names that phase), the job (``job``),
    the commit and the check that finds the target caught up."""
    at = dict(phases)
    return {
        "plan+start": at["started"] - started,
        read: at["read"] - at["started"],
        job: at["written"] - at["read"],
        "commit": at["committed"] - at["written"],
        "caught-up check": at["caught_up"] - at["committed"],
    }


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(
    condition: Callable[[], Any],
    what: str,
    deadline_s: float = START_DEADLINE_S,
    interval_s: float = 0.05,
    process: subprocess.Popen[Any] | None = None,
) -> Any:
    """Polls ``condition`` until it returns something truthy (returned); raises RuntimeError naming ``what``
    at the deadline, or at once when ``process`` (what is being waited for) has exited. An exception from
    ``condition`` counts as "not yet" (a server not listening yet refuses the connection)."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            result = condition()
        except Exception:  # noqa: BLE001 - not ready yet
            result = None
        if result:
            return result
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what}: the process exited with {process.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {deadline_s:.0f} s")
        time.sleep(interval_s)


def healthy(url: str) -> bool:
    """Whether the diffstore server at ``url`` answers ``/healthz`` with 200."""
    import httpx

    return httpx.get(f"{url}/healthz", timeout=5.0).status_code == 200


def listening(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""
    socket.create_connection(("127.0.0.1", port), timeout=1).close()
    return True


def stop(process: subprocess.Popen[Any], deadline_s: float = STOP_DEADLINE_S) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``deadline_s``."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=deadline_s)


@dataclass(frozen=True)
class Served:
    url: str
    port: int
    pid: int


def diffstore_command() -> list[str]:
    """The ``diffstore`` command of this interpreter's environment."""
    return [sys.executable, "-m", "diffstore"]


@contextmanager
def diffstore_serve(
    data: Path,
    *extra: str,
    ready: Callable[[str], Any] | None = None,
    quiet: bool = True,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    command: Sequence[str] | None = None,
) -> Iterator[Served]:
    """``diffstore serve --data DATA --port P EXTRA...`` in a child process, as users run it; yields once
    ``/healthz`` answers (and ``ready(url)``, when given, holds), and stops it after. ``command`` replaces
    ``diffstore`` (e.g. a ``python -c`` driver for the server of another revision's tree)."""
    port = free_port()
    out = subprocess.DEVNULL if quiet else None
    process = subprocess.Popen(
        [*(command or diffstore_command()), "serve", "--data", str(data), "--port", str(port), *extra],
        stdout=out,
        stderr=out,
        cwd=cwd or ROOT,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        started = "diffstore serve to start"
        wait_for(lambda: healthy(url) and (ready is None or ready(url)), started, process=process)
        yield Served(url, port, process.pid)
    finally:
        stop(process)


@contextmanager
def streams_serve(data: Path, quiet: bool = False) -> Iterator[str]:
    """``diffstore streams serve`` (the embedded HStream server) in a child process, its log dropped if
    ``quiet``; yields its ``hstream://`` URL once it answers DescribeCluster, and stops it after."""
    from diffstore.streams.client import StreamClient

    port = free_port()
    command = [
        *diffstore_command(), "streams", "serve", "--data", str(data),
        "--port", str(port), "--resend-tick", "0.05", "--assignment-interval", "0.05",
    ]  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.DEVNULL if quiet else None)
    url = f"hstream://127.0.0.1:{port}"

    def answers() -> bool:
        with StreamClient(url) as client:
            client.describe_cluster()
        return True

    try:
        wait_for(answers, "diffstore streams serve to start", process=process)
        yield url
    finally:
        stop(process)


@contextmanager
def python_server(code: str, *args: str, cpus: set[int] | None = None) -> Iterator[str]:
    """``python -c CODE ARGS... PORT`` (a server that listens on 127.0.0.1:PORT), on ``cpus`` when given;
    yields its URL once it accepts connections, and stops it after."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", code, *args, str(port)],
        preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus),
    )
    try:
        wait_for(lambda: listening(port), "the server to listen", process=process)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(process)


@contextmanager
def server_thread(
    make_server: Callable[[int], Any], deadline_s: float = START_DEADLINE_S
) -> Iterator[Served]:
    """A uvicorn server in a thread of this process (for benchmarks that read the app's state or the
    process's own CPU time), on a socket bound here: ``make_server(port)`` builds it (``uvicorn.Server``,
    or ``diffstore serve``'s ``GracefulServer``); yields once it has started, and stops it after."""
    import threading

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP) as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
        server = make_server(port)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        try:
            wait_for(lambda: server.started or not thread.is_alive(), "the server to start", deadline_s)
            if not server.started:
                raise RuntimeError("the server's thread ended before it started")
            yield Served(f"http://127.0.0.1:{port}", port, os.getpid())
        finally:
            server.should_exit = True
            thread.join(STOP_DEADLINE_S)
