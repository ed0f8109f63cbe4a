"""SPEC §9 Integrity over HTTP: ``GET /collections/{c}/digest`` and ``/digests``, the clients' calls, and
``diffstore check --url REPLICA --against PRIMARY`` between two real servers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from diffstore import Store, StoreConfig
from diffstore.client import Client
from diffstore.engine.types import ReplicaGeneration
from tests.engine.util import raw_state

from .conftest import Live, es, live_server, unes

DEADLINE_S = 120.0


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "diffstore", *argv],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        env=os.environ,
    )


def _write(live: Live, name: str, generation: str, items: dict[str, str | None]) -> None:
    live.ok("POST", f"/collections/{name}/generation/start", {"generationId": es(generation)})
    body = [{"key": es(k), "value": None if v is None else es(v)} for k, v in items.items()]
    live.ok("POST", f"/collections/{name}/putMany", {"items": body, "generationId": es(generation)})
    live.ok("POST", f"/collections/{name}/generation/commit", {"generationId": es(generation)})


def test_the_digest_of_each_generation_and_its_errors(live: Live) -> None:
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    _write(live, "m", "g1", {"a": "1", "b": "2"})
    _write(live, "m", "g2", {"a": None, "c": "3"})
    engine = live.store.collection("m")
    current = live.ok("GET", "/collections/m/digest")
    assert unes(current["generationId"]) == b"g2" and current["records"] == 2
    assert current["digest"] == engine.digest(b"g2").hex and len(current["digest"]) == 32
    g1 = live.ok(
        "GET", "/collections/m/digest", params={"generationId": "ZzE=", "generationIdEncoding": "base64"}
    )
    assert unes(g1["generationId"]) == b"g1" and g1["records"] == 2 and g1["digest"] != current["digest"]
    initial = live.ok("GET", "/collections/m/digest/", params={"generationId": ""})
    assert initial == {"generationId": es(""), "records": 0, "digest": "0" * 32}
    page = live.ok("GET", "/collections/m/digests", params={"limit": 2})
    assert [unes(i["generationId"]) for i in page["items"]] == [b"g2", b"g1"] and page["items"][0] == current
    rest = live.ok("GET", "/collections/m/digests", params={"before": unes(page["nextBefore"]).decode()})
    assert rest == {"items": [initial]}
    with Client(live.url) as client:
        assert client.collection("m").digest(b"g1") == engine.digest(b"g1")
        assert client.collection("m").digests(limit=5) == engine.digests(limit=5)
    before = raw_state(live.store)
    live.fail(
        "GET", "/collections/m/digest", params={"generationId": "g3"}, status=400, code="invalidRequest"
    )
    live.fail("GET", "/collections/nope/digest", status=404, code="noSuchCollection")
    live.fail(
        "GET",
        "/collections/m/digest",
        params={"generationId": "!", "generationIdEncoding": "base64"},
        status=400,
        code="invalidEncoding",
    )
    live.fail("GET", "/collections/m/digests", params={"limit": 0}, status=400, code="invalidRequest")
    assert raw_state(live.store) == before


def _replica_of(path: Path, source: Store, wrong_at: bytes | None) -> None:
    """A store that copied ``source``'s collection ``m`` generation by generation through the engine's
    replication API (as a follower does), with one record's value changed at ``wrong_at``; promoted, so that
    a plain server serves it."""
    with Store.open(path, StoreConfig(background=False)) as replica:
        replica.become_replica("http://primary", "r1")
        m = source.collection("m")
        gens = sorted(m.generations()[0])
        replica.apply_replica_generation(ReplicaGeneration("m", True, None, gens[0], []))
        for previous, generation in zip(gens, gens[1:], strict=False):
            records = m.generation_records(generation, limit=10_000).records
            if generation == wrong_at:
                records = [(k, b"wrong" if v is not None else v) for k, v in records]
            replica.apply_replica_generation(ReplicaGeneration("m", True, previous, generation, records))
        replica.promote_replica()


def test_check_against_names_the_oldest_generation_that_differs(tmp_path: Path) -> None:
    with live_server(tmp_path / "primary") as primary:
        primary.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
        for n in range(1, 6):
            _write(primary, "m", f"g{n}", {f"k{n}": str(n), "same": str(n), f"k{n - 1}": None})
        _replica_of(tmp_path / "equal", primary.store, None)
        _replica_of(tmp_path / "differs", primary.store, b"g3")
        with live_server(tmp_path / "equal") as equal:
            done = cli("check", "--url", equal.url, "--against", primary.url)
            assert done.returncode == 0, done.stdout + done.stderr
            assert "m: equal (6 generations compared, 0 unknown" in done.stdout
        with live_server(tmp_path / "differs") as differs:
            done = cli("check", "--url", differs.url, "--against", primary.url)
            assert done.returncode == 1, done.stdout + done.stderr
            assert "m: DIFFERS first at generation g3: replica 2 records" in done.stdout
            assert "differs from" in done.stdout


def test_check_against_needs_both_servers(tmp_path: Path) -> None:
    done = cli("check", "--url", "http://127.0.0.1:9")
    assert done.returncode != 0 and "--against" in done.stderr and "Traceback" not in done.stderr
