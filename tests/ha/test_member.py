"""Three real members elect one leader through a real etcd; the others follow it and refuse writes."""

from __future__ import annotations

import httpx

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
