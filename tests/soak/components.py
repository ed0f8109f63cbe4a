"""The soak's processes, started as an operator starts them, and the faults thrown at them.

A :class:`Component` is one long-running command (``diffstore serve``, ``streams serve``, ``ingest``,
``transform --watch``, a consumer, a replica) with its log file; ``kill9`` and ``start`` again is what an
operator's supervisor does after a crash (same port, same data directory). A :class:`Link` is a TCP proxy
between a client component and the server it talks to, so that the link can be stalled or cut.
:class:`Faults` picks a random fault every so often and remembers when each one started and ended: the
figures between faults are read from those windows.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.faults import TcpProxy, kill9, wait_stopped
from tests.helpers import close_pipes, free_port, wait_until

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
START_S = 120.0


def python_path() -> str:
    """The subprocesses import the soak's mapper, job and consumer (this directory) and the repository."""
    paths = [str(HERE), str(REPO), os.environ.get("PYTHONPATH", "")]
    return os.pathsep.join(paths)


class Component:
    """One command in a process of its own; ``ready`` says when it serves (None: as soon as it runs)."""

    def __init__(
        self,
        name: str,
        command: list[str],
        log: Path,
        ready: Callable[[], bool] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.command = command
        self.log = log
        self.ready = ready
        self.env = {**os.environ, "PYTHONPATH": python_path(), **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> Component:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.command, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        if self.ready is not None:
            wait_until(self._ready, START_S, interval=0.05, what=f"{self.name} to be ready")
        return self

    def _ready(self) -> bool:
        assert self.running(), f"{self.name} exited with {self.exit_code()}: {self.tail()}"
        assert self.ready is not None
        return self.ready()

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def kill9(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                kill9(self.process, group=True)
            close_pipes(self.process)
            self.process = None

    def restart(self) -> None:
        self.kill9()
        self.restarts += 1
        self.start()

    def pause(self, seconds: float) -> None:
        """SIGSTOP for ``seconds`` (the fault's length), then SIGCONT; a process that died meanwhile is
        left to the liveness check."""
        if not self.running():
            return
        assert self.process is not None
        group = os.getpgid(self.process.pid)
        os.killpg(group, signal.SIGSTOP)
        try:
            wait_stopped(self.process)
            time.sleep(seconds)
        finally:
            os.killpg(group, signal.SIGCONT)

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                kill9(self.process, group=True)
        close_pipes(self.process)
        self.process = None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


def http_ready(url: str) -> Callable[[], bool]:
    def ready() -> bool:
        try:
            return httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    return ready


def diffstore(*args: str) -> list[str]:
    return [sys.executable, "-m", "diffstore.cli", *args]


def serve(name: str, data: Path, logs: Path, *extra: str) -> tuple[Component, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = diffstore("serve", "--data", str(data), "--port", str(port), "--workers", "1", *extra)
    return Component(name, command, logs / f"{name}.log", http_ready(url)), url


class Link:
    """A proxy in front of ``upstream`` (an ``http://host:port``); its clients are given :attr:`url`."""

    def __init__(self, name: str, upstream: str) -> None:
        self.name = name
        self.proxy = TcpProxy(upstream.removeprefix("http://")).start()
        self.url = f"http://{self.proxy.address}"

    def stall(self, seconds: float) -> None:
        self.proxy.stall()
        try:
            time.sleep(seconds)
        finally:
            self.proxy.passing()

    def cut(self, seconds: float) -> None:
        self.proxy.cut(refuse=True)
        try:
            time.sleep(seconds)
        finally:
            self.proxy.accept()

    def close(self) -> None:
        self.proxy.close()


@dataclass
class Fault:
    kind: str
    target: str
    started: float
    ended: float | None = None


@dataclass
class Faults:
    """Throws a random fault at a random component or link every ``every_s`` (± half) until stopped."""

    components: dict[str, Component]
    links: dict[str, Link]
    every_s: float
    seed: int
    restart_after_s: tuple[float, float] = (0.5, 3.0)
    pause_s: tuple[float, float] = (1.0, 6.0)
    link_s: tuple[float, float] = (2.0, 8.0)
    thrown: list[Fault] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    deck: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.done = threading.Event()
        self.lock = threading.Lock()  # held while a fault is being thrown: checks read a stable state
        self.thread = threading.Thread(target=self._run, name="soak-faults", daemon=True)

    def start(self) -> Faults:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.done.set()
        self.thread.join(120)

    def in_fault(self, at: float, grace_s: float = 0.0) -> bool:
        """Whether ``at`` (a monotonic time) falls in a fault or ``grace_s`` after one."""
        for fault in self.thrown:
            end = fault.ended if fault.ended is not None else float("inf")
            if fault.started <= at <= end + grace_s:
                return True
        return False

    def _run(self) -> None:
        while not self.done.wait(self.every_s * self.rng.uniform(0.5, 1.5)):
            try:
                self.throw_one()
            except Exception as exc:  # noqa: BLE001 -- reported by the soak as a harness error
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def throw_one(self) -> None:
        """The next fault of a shuffled deck holding one per component and link (a random kind each), so
        that a short run still hits every part once."""
        if not self.deck:
            self.deck = [(self.rng.choice(["kill9", "pause"]), name) for name in self.components]
            self.deck += [(self.rng.choice(["stall", "cut"]), name) for name in self.links]
            self.rng.shuffle(self.deck)
        kind, name = self.deck.pop()
        fault = Fault(kind, name, time.monotonic())
        self.thrown.append(fault)
        if kind in ("stall", "cut"):
            link = self.links[name]
            (link.stall if kind == "stall" else link.cut)(self.rng.uniform(*self.link_s))
        else:
            component = self.components[name]
            with self.lock:
                if kind == "pause":
                    component.pause(self.rng.uniform(*self.pause_s))
                else:
                    component.kill9()
                    time.sleep(self.rng.uniform(*self.restart_after_s))  # the supervisor's restart delay
                    component.restarts += 1
                    component.start()
        fault.ended = time.monotonic()
