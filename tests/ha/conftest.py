"""A real etcd on loopback (started here), and fail-over members as real ``diffstore serve`` processes.

etcd comes from Debian's ``etcd-server`` (``make test`` installs it, see ``scripts/install_etcd.sh``) or
``DIFFSTORE_ETCD``. Without it these tests fail, loudly: they never skip.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.faults import TcpProxy
from tests.helpers import close_pipes, free_port, wait_until
from tests.replica.conftest import Server

STARTUP_S = 60.0
TTL_S = 4
WAIT_S = 90.0


class EtcdServer:
    """One etcd member on loopback over its own data directory."""

    def __init__(self, directory: Path) -> None:
        binary = (
            os.environ.get("DIFFSTORE_ETCD") or shutil.which("etcd") or shutil.which("etcd", path="/usr/bin")
        )
        if binary is None:
            pytest.fail(
                "no etcd binary: install Debian's etcd-server (make test does, as root), or DIFFSTORE_ETCD=",
                pytrace=False,
            )
        client, peer = free_port(), free_port()
        self.url = f"http://127.0.0.1:{client}"
        self.log = directory / "etcd.log"
        command = [
            binary,
            "--name", "default",
            "--data-dir", str(directory / "etcd"),
            "--listen-client-urls", self.url,
            "--advertise-client-urls", self.url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"default=http://127.0.0.1:{peer}",
        ]  # fmt: skip
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        wait_until(self.healthy, STARTUP_S, what="etcd to answer")

    def healthy(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(
                f"etcd exited with {self.process.returncode}: {self.log.read_text()[-2000:]}"
            )
        try:
            answer = httpx.post(f"{self.url}/v3/kv/range", json={"key": "eA=="}, timeout=5)
        except httpx.TransportError:
            return False
        return answer.status_code == 200

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        close_pipes(self.process)


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path)
    try:
        yield server
    finally:
        server.stop()


class Member(Server):
    """A fail-over member: ``diffstore serve --ha-*``, reaching etcd through its own proxy (a fault can cut
    this member alone off etcd)."""

    def __init__(self, data: Path, etcd: EtcdServer, cluster: str, name: str, ttl_s: int) -> None:
        self.proxy = TcpProxy(etcd.url.removeprefix("http://")).start()
        self.name = name
        ha = ["--ha-etcd", f"http://{self.proxy.address}", "--ha-cluster", cluster, "--ha-member", name]
        super().__init__(data, *ha, "--ha-ttl-s", str(ttl_s))

    def ha(self, timeout_s: float = 2.0) -> dict[str, Any] | None:
        """``GET /ha``, or None when the member does not answer."""
        try:
            answer = httpx.get(f"{self.url}/ha", timeout=timeout_s)
        except httpx.HTTPError:
            return None
        found: dict[str, Any] = answer.json()
        return found

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                os.kill(self.process.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.stop()
        self.proxy.close()


@pytest.fixture
def members(tmp_path: Path, etcd: EtcdServer) -> Iterator[list[Member]]:
    """Three members of one cluster (not started yet), with a lease of :data:`TTL_S`."""
    found = [Member(tmp_path / name, etcd, "c1", name, TTL_S) for name in ("m1", "m2", "m3")]
    try:
        yield found
    finally:
        for member in found:
            member.close()


def leader_of(members: list[Member]) -> Member | None:
    """The one member whose ``/ha`` says it leads, when every answering member agrees on it."""
    answers = [(member, member.ha()) for member in members]
    leaders = [member for member, ha in answers if ha is not None and ha["role"] == "leader"]
    if len(leaders) != 1:
        return None
    url = leaders[0].url
    if any(ha is not None and ha["role"] == "replica" and ha["leader"]["url"] != url for _, ha in answers):
        return None
    return leaders[0]


def wait_leader(members: list[Member], other_than: Member | None = None) -> Member:
    def found() -> Member | None:
        leader = leader_of([m for m in members if m is not other_than])
        return leader if leader is not None and leader is not other_than else None

    return wait_until(found, WAIT_S, 0.1, "a leader every answering member agrees on")


def wait_follows(member: Member, leader: Member) -> None:
    def follows() -> bool:
        ha = member.ha()
        return ha is not None and ha["role"] == "replica" and ha["leader"]["url"] == leader.url

    wait_until(follows, WAIT_S, 0.1, f"{member.name} to follow {leader.name}")
