"""A member served by several worker processes: the member runs in the supervisor, and every worker obeys
its decisions, because they are in the store (``engine/ha_state.py``), not in one process's memory."""

from __future__ import annotations

from pathlib import Path

import httpx

from diffstore.client import Client
from tests.ha.conftest import TTL_S, WAIT_S, EtcdServer, Member
from tests.helpers import wait_until


def role(member: Member) -> str | None:
    ha = member.ha()
    return None if ha is None else ha["role"]


def test_every_worker_refuses_writes_once_the_member_is_cut_off_etcd(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    member = Member(tmp_path / "m1", etcd, "solo", "m1", TTL_S)
    member.args = (*member.args, "--workers", "2")  # the last --workers wins
    try:
        member.start()
        wait_until(lambda: role(member) == "leader", WAIT_S, 0.1, "the only member to lead")
        with Client(member.url, timeout_s=30) as client:
            c = client.create_collection("c")
            c.write_generation(b"0001", [(b"k", b"v")])
        term = member.ha()["term"]  # type: ignore[index]
        member.proxy.cut()
        wait_until(lambda: role(member) == "fenced", WAIT_S, 0.1, "the member to step back")
        for _ in range(8):  # fresh connections: the kernel spreads them over both workers
            with httpx.Client(timeout=30) as http:
                refused = http.post(
                    f"{member.url}/collections/c/generation/start", json={"generationId": "0002"}
                )
            assert refused.status_code == 409 and refused.json()["error"] == "readOnlyReplica"
        with Client(member.url, timeout_s=30) as client:
            assert client.collection("c").generation_state() == (b"0001", None)
        member.proxy.accept()
        wait_until(lambda: role(member) == "leader", WAIT_S, 0.1, "the member to lead again")
        assert member.ha()["term"] >= term  # type: ignore[index]
        with Client(member.url, timeout_s=30) as client:
            client.collection("c").write_generation(b"0002", [(b"k", b"w")])
    finally:
        member.close()
