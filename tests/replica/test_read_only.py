"""A replica refuses every write (409 readOnlyReplica, nothing changed) until it is promoted; promotion
on a primary is 409 notReplica; ``serve --replica-of`` refuses, in one line, what cannot be followed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from diffstore.errors import Fenced, NotReplica
from tests.helpers import wait_until

from .compare import caught_up, every_read, generations, state
from .conftest import Server

ES = {"value": "k"}
WRITES: list[tuple[str, str, Any]] = [
    ("POST", "/collections/", {"collectionName": "new", "isManual": True}),
    ("DELETE", "/collections/A", None),
    ("POST", "/collections/A/put", {"item": {"key": ES, "value": ES}, "generationId": {"value": "9"}}),
    ("POST", "/collections/A/putMany", {"items": [{"key": ES, "value": ES}], "generationId": {"value": "9"}}),
    ("POST", "/collections/B/put", {"item": {"key": ES, "value": ES}}),
    ("POST", "/collections/A/generation/start", {"generationId": {"value": "9"}}),
    ("POST", "/collections/A/generation/commit", {"generationId": {"value": "1"}}),
    ("POST", "/collections/A/generation/abort", {"generationId": {"value": "1"}}),
    ("POST", "/collections/A/readers/", {"readerName": "r2", "generationId": None}),
    ("PUT", "/collections/A/readers/r", {"generationId": {"value": "1"}}),
    ("DELETE", "/collections/A/readers/r", None),
    ("POST", "/collections/A/phantom/start", {}),
    ("POST", "/collections/A/leases/l/acquire", {"owner": "me", "ttlMs": 10_000}),
    ("POST", "/collections/A/leases/l/renew", {"owner": "me", "version": 1}),
    ("POST", "/collections/A/leases/l/release", {"owner": "me", "version": 1}),
    ("POST", "/collections/A/revert", {"toGenerationId": {"value": ""}}),
    ("PUT", "/collections/A/retention", {"keepGenerations": 5}),
    ("PATCH", "/collections/A", {}),
]


def _fill(primary: Server) -> None:
    with primary.client() as p:
        a = p.create_collection("A", manual=True)
        a.start_generation(b"1")
        a.put(b"k", b"v", generation_id=b"1")
        a.create_reader("r", generation_id=None)
        a.commit_generation(b"1")
        p.create_collection("B", manual=False).put(b"b", b"1")


def test_every_write_is_refused_until_promotion(primary: Server, replica: Server) -> None:
    _fill(primary)
    with primary.client() as p, replica.client() as r:
        wait_until(lambda: caught_up(p, r) and "B" in state(r) and state(r)["B"][1][0] != b"\0" * 8, 60)
        held = generations(r)
        before = every_read(r, held), state(r)
        with httpx.Client(base_url=replica.url, timeout=30) as http:
            for method, path, body in WRITES:
                answer = http.request(method, path, json=body)
                assert answer.status_code == 409, (method, path, answer.text)
                assert answer.json()["error"] == "readOnlyReplica", (method, path)
            # the console and the metrics say it is a replica, and how far behind
            overview = http.get("/overview").json()["replica"]
            assert overview["primary"] == primary.url
            assert {c["collectionName"]: c["lagGenerations"] for c in overview["collections"]} == {
                "A": 0,
                "B": 0,
            }
            metrics = http.get("/metrics").text
            assert 'diffstore_replica_lag_generations{collection="A"} 0.0' in metrics
            applied = [
                line
                for line in metrics.splitlines()
                if line.startswith("diffstore_replica_applied_generations_total")
            ]
            assert float(applied[0].split()[-1]) >= 3  # A: "" and 1, B: 0 and at least one more
            # reads that are POSTs still answer
            assert http.post("/collections/A/get", json={"key": ES}).json()["item"]["value"] == {"value": "v"}
            assert http.post("/collections/A/diff/", json={"fromGenerationId": None}).status_code == 200
        assert (every_read(r, held), state(r)) == before
        assert r.replica_status()["primary"] == primary.url
        with pytest.raises(NotReplica):
            p.promote()
        assert r.promote() is True
        with pytest.raises(NotReplica):
            r.promote()
        with pytest.raises(NotReplica):
            r.replica_status()
        # what it had applied stays; it accepts writes; it follows no more
        assert (every_read(r, held), state(r)) == before
        a = r.collection("A")
        a.start_generation(b"2")
        a.put(b"k", b"w", generation_id=b"2")
        a.commit_generation(b"2", [("r", b"1")])
        b = r.collection("B")
        b.put(b"b", b"2")
        wait_until(lambda: b.get(b"b") is not None and b.get(b"b").value == b"2", 30)  # type: ignore[union-attr]
        assert b.generation_id == (int.from_bytes(held["B"][-1], "big") + 1).to_bytes(8, "big")
        # the old primary stepped down (it refuses writes: fenced, naming the new primary); the holds went
        pa = p.collection("A")
        with pytest.raises(Fenced) as fenced:
            pa.start_generation(b"3")
        assert fenced.value.primary == replica.url and fenced.value.term == 1
        assert not any(x.name.startswith("diffstore-replica:") for x in pa.readers())
        assert r.collection("A").generation_id == b"2"
        with httpx.Client(base_url=replica.url, timeout=30) as http:
            assert http.get("/overview").json()["replica"] is None
            assert "diffstore_replica_lag_generations{" not in http.get("/metrics").text


def _serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "diffstore.cli", "serve", "--data", str(tmp_path / "bad"), *args]
    command += ["--log-level", "warning"]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_what_cannot_be_followed_is_refused_in_one_line(
    tmp_path: Path, primary: Server, replica: Server, servers: list[Server]
) -> None:
    with httpx.Client(timeout=10) as http:
        assert http.get(f"{replica.url}/replica").status_code == 200
    of_replica = _serve(tmp_path, "--port", "0", "--replica-of", replica.url)
    assert of_replica.returncode == 2
    assert of_replica.stderr.strip() == (
        f"diffstore serve: error: {replica.url} is itself a replica (of {primary.url}):"
        " point --replica-of at the primary"
    )
    secured = Server(tmp_path / "secured", token="s3cret")
    servers.append(secured.start())
    (tmp_path / "wrong-token").write_text("nope\n")
    wrong = _serve(
        tmp_path,
        "--port",
        "0",
        "--replica-of",
        secured.url,
        "--replica-token-file",
        str(tmp_path / "wrong-token"),
    )
    assert wrong.returncode == 2 and len(wrong.stderr.strip().splitlines()) == 1
    assert "refused the token" in wrong.stderr and "--replica-token-file" in wrong.stderr
    not_diffstore = _serve(tmp_path, "--port", "0", "--replica-of", f"{primary.url}/healthz/x")
    assert not_diffstore.returncode == 2 and len(not_diffstore.stderr.strip().splitlines()) == 1
    assert "is not a diffstore server" in not_diffstore.stderr
    assert not (tmp_path / "bad").exists() or not any((tmp_path / "bad").iterdir())
    # a store that holds collections of its own cannot become a replica
    other = Server(tmp_path / "other")
    servers.append(other.start())
    with other.client() as client:
        client.create_collection("mine")
    other.stop()
    own = _serve(
        tmp_path, "--port", "0", "--workers", "1", "--replica-of", primary.url, "--data", str(other.data)
    )
    assert own.returncode == 1 and len(own.stderr.strip().splitlines()) == 1, own.stderr
    assert "holds collections of its own" in own.stderr
