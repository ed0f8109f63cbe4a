"""Three real members elect one leader through a real etcd; the others follow it and refuse writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from diffstore.client import Client
from tests.ha.conftest import Member, leader_of
from tests.helpers import wait_until


def test_three_members_elect_one_leader_the_others_follow_and_refuse_writes(members: list[Member]) -> None:
    for member in members:
        member.start()
    leader = wait_until(lambda: leader_of(members), 60, 0.1, "one leader that every member knows")
    with Client(leader.url, timeout_s=30) as client:
        c = client.create_collection("c")
        c.write_generation(b"0001", [(b"k", b"v1")])
    replicas = [member for member in members if member is not leader]
    for replica in replicas:
        ha = replica.ha()
        assert ha is not None
        assert ha["cluster"] == "c1" and ha["member"] == replica.name and ha["role"] == "replica"
        assert ha["leader"] == {"member": leader.name, "url": leader.url}
        assert ha["term"] == leader.ha()["term"] >= 1  # type: ignore[index]

        def copied(replica: Member = replica) -> bool:
            with Client(replica.url, timeout_s=30) as client:
                try:
                    return client.collection("c").generation_id == b"0001"
                except Exception:  # noqa: BLE001 -- not copied yet
                    return False

        wait_until(copied, 60, 0.1, f"{replica.name} to copy the leader's generation")
        # a write to a replica: 409 readOnlyReplica naming the leader, and nothing changes
        answer = httpx.post(
            f"{replica.url}/collections/c/generation/start", json={"generationId": "0002"}, timeout=30
        )
        assert answer.status_code == 409
        assert answer.json()["error"] == "readOnlyReplica"
        assert answer.json()["leader"] == leader.url
        with Client(replica.url, timeout_s=30) as client:
            assert client.collection("c").generation_state() == (b"0001", None)
            digest = client.collection("c").digest(b"0001")
        with Client(leader.url, timeout_s=30) as client:
            assert client.collection("c").digest(b"0001") == digest
    metrics = httpx.get(f"{leader.url}/metrics", timeout=30).text
    assert 'diffstore_ha_role{role="leader"} 1.0' in metrics
    assert "diffstore_ha_term " in metrics
    overview = httpx.get(f"{leader.url}/overview", timeout=30).json()  # the console's overview line
    assert overview["ha"]["role"] == "leader" and overview["ha"]["member"] == leader.name

    # diffstore ha status: every member's row; exit 0 with one leader and every member answering
    urls = ",".join(member.url for member in members)
    shown = subprocess.run(
        [sys.executable, "-m", "diffstore.cli", "ha", "status", "--url", urls, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    rows = json.loads(shown.stdout)
    assert [row["member"] for row in rows] == ["m1", "m2", "m3"]
    assert sorted(row["role"] for row in rows) == ["leader", "replica", "replica"]
    leader.kill9()
    text = subprocess.run(
        [sys.executable, "-m", "diffstore.cli", "ha", "status", "--url", urls],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert text.returncode == 1
    assert f"{leader.url}  unreachable" in text.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ha-etcd", "http://127.0.0.1:2379"], "--ha-etcd, --ha-cluster and --ha-member go together"),
        (["--ha-etcd", "127.0.0.1:2379", "--ha-cluster", "c", "--ha-member", "m"], "--ha-etcd: expected"),
        (["--ha-etcd", "http://e:1", "--ha-cluster", "c/1", "--ha-member", "m"], "--ha-cluster: expected"),
        (["--ha-etcd", "http://e:1", "--ha-cluster", "c", "--ha-member", "m", "--ha-ttl-s", "1"], "2..3600"),
        (
            ["--ha-etcd", "http://e:1", "--ha-cluster", "c", "--ha-member", "m", "--port", "0"],
            "--ha-advertise",
        ),
        (
            [
                "--ha-etcd",
                "http://e:1",
                "--ha-cluster",
                "c",
                "--ha-member",
                "m",
                "--replica-of",
                "http://p:1",
            ],
            "--replica-of does not go with --ha-etcd",
        ),
        (["--ha-advertise", "http://a:1"], "--ha-advertise goes with"),
    ],
)
def test_wrong_fail_over_options_fail_in_one_line_and_create_nothing(
    tmp_path: Path, args: list[str], message: str
) -> None:
    data = tmp_path / "data"
    done = subprocess.run(
        [sys.executable, "-m", "diffstore.cli", "serve", "--data", str(data), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not data.exists()
