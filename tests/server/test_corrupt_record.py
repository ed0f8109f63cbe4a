"""A record whose checksum fails, read over HTTP: 500 ``corruptRecord`` naming the key, never the value,
on every read route (the fast lane's point get included); counted in ``/metrics``; nothing else changes."""

from __future__ import annotations

from pathlib import Path

from diffstore.engine import layout
from diffstore.engine.tables import load_meta

from .conftest import Live, es, live_server
from .test_metrics import scrape, value

SECRET = "the-secret-value"


def damage(live: Live, key: bytes, seq: int) -> bytes:
    """Flips one bit of the stored value of ``key``'s version ``seq`` in collection m (as a disk would);
    returns the row as it was."""
    store = live.store
    with store.env.begin(write=True) as txn:
        record_key = layout.record_key(
            load_meta(txn, store.tables, "m").records_prefix, layout.key_form(key), seq
        )
        raw = bytes(txn.get(record_key, db=store.tables.records))
        changed = bytearray(raw)
        changed[-1] ^= 0x04
        txn.put(record_key, bytes(changed), db=store.tables.records)
    return raw


def test_each_read_route_answers_corrupt_record_and_metrics_count_them(tmp_path: Path) -> None:
    with live_server(tmp_path / "data") as live:
        live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
        for n in ("1", "2"):
            live.ok("POST", "/collections/m/generation/start", {"generationId": es(n)})
            items = [{"key": es(k), "value": es(f"{SECRET}-{n}-{k}")} for k in ("a", "b", "c")]
            live.ok("POST", "/collections/m/putMany", {"generationId": es(n), "items": items})
            live.ok("POST", "/collections/m/generation/commit", {"generationId": es(n)})
        before = live.ok("POST", "/collections/m/query/", {})
        assert value(scrape(live), "diffstore_corrupt_records_total") == 0
        damage(live, b"b", 2)
        answers = [
            live.fail("POST", "/collections/m/get", {"key": es("b")}, status=500, code="corruptRecord"),
            live.fail(
                "POST", "/collections/m/getMany", {"keys": [es("b")]}, status=500, code="corruptRecord"
            ),
            live.fail("POST", "/collections/m/query/", {}, status=500, code="corruptRecord"),
            live.fail(
                "POST",
                "/collections/m/diff/",
                {"fromGenerationId": es("1")},
                status=500,
                code="corruptRecord",
            ),
        ]
        for answer in answers:
            assert "key b " in answer["reason"] and "generation #2" in answer["reason"], answer
            assert SECRET not in str(answer), answer
        assert value(scrape(live), "diffstore_corrupt_records_total") == len(answers)
        # the other keys read as before; the damaged key's older version keeps its own checksum
        assert live.ok("POST", "/collections/m/get", {"key": es("a")})["item"]["value"] == es(f"{SECRET}-2-a")
        old = live.ok("POST", "/collections/m/get", {"key": es("b"), "generationId": es("1")})
        assert old["item"]["value"] == es(f"{SECRET}-1-b")
        # nothing was changed by the failed reads: the collection's state is what it was
        collection = live.ok("GET", "/collections/m")
        assert collection["generationId"] == es("2")
        assert before["items"][0]["value"] == es(f"{SECRET}-2-a")
