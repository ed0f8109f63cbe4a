"""``POST /collections/{c}/revert`` of a manual collection is written in batches (issue 54 item 5): over a
real server, another collection's writes are answered while a large revert is half done, and the revert's
answer is whole."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from tests.helpers import wait_until
from tests.server.conftest import live_server

KEYS = 60_000  # 30 batches
DEADLINE_S = 120.0


def test_writes_of_another_collection_are_answered_between_two_batches_of_a_revert(tmp_path: Path) -> None:
    with live_server(tmp_path / "s") as live:
        a = live.store.create_collection("A", manual=True)
        for gen, value in ((b"1", b"old"), (b"2", b"new")):
            a.start_generation(gen)
            a.put_many([(b"k%06d" % i, value) for i in range(KEYS)], generation_id=gen)
            a.commit_generation(gen)
        a.start_generation(b"3")
        live.ok("POST", "/collections/", {"collectionName": "B", "isManual": False})
        answers: list[httpx.Response] = []

        def revert() -> None:
            with httpx.Client(base_url=live.url, timeout=DEADLINE_S) as http:
                body = {"toGenerationId": {"value": "1"}, "generationId": {"value": "3"}}
                answers.append(http.post("/collections/A/revert", json=body))

        def value_at_open(key: bytes) -> str:
            body = {"key": {"value": key.decode()}, "generationId": {"value": "3"}}
            return str(live.ok("POST", "/collections/A/get", body)["item"]["value"]["value"])

        first, last = b"k%06d" % 0, b"k%06d" % (KEYS - 1)
        thread = threading.Thread(target=revert, daemon=True)
        thread.start()
        between = 0  # B's writes answered while A's revert had begun and not ended
        n = 0
        while thread.is_alive():
            n += 1
            live.ok(
                "POST", "/collections/B/put", {"item": {"key": {"value": f"w{n}"}, "value": {"value": "x"}}}
            )
            if value_at_open(first) == "old" and value_at_open(last) == "new":
                between += 1
        thread.join(DEADLINE_S)
        assert answers and answers[0].status_code == 200, answers
        assert answers[0].json() == {"generationId": {"value": "3"}, "changedKeys": KEYS}
        assert between, f"none of B's {n} writes was answered between two batches of the revert"
        assert value_at_open(last) == "old"
        live.ok("POST", "/collections/A/generation/commit", {"generationId": {"value": "3"}})
        wait_until(
            lambda: live.store.collection("B").generation_id != b"\0" * 8, DEADLINE_S, what="B's commit"
        )
        assert {r.value for r in live.store.collection("A").query()} == {b"old"}
