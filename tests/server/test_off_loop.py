"""A request stuck inside the engine does not stall the others.

Engine calls run in worker threads, except the point reads of the fast lane (``get``, the long poll's
current generation), which run on the event loop: the app marks the loop's thread so that its reads never
step aside for a writer (``Store.never_wait_for_writers_here``), and LMDB readers take no lock.
"""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from diffstore.engine.types import StoreConfig

from .conftest import Live, es, live_server


def test_a_blocked_engine_call_does_not_block_the_server(live: Live) -> None:
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    live.ok("POST", "/collections/m/generation/start", {"generationId": es("1")})
    entered, release = threading.Event(), threading.Event()

    def stuck_listener(collection: str, generation_id: bytes) -> None:
        # commit listeners run in the committing thread: here, the worker thread of the HTTP commit
        entered.set()
        release.wait(30)

    unsubscribe = live.store.add_commit_listener(stuck_listener)
    answers: list[httpx.Response] = []
    commit = threading.Thread(
        target=lambda: answers.append(
            httpx.post(
                f"{live.url}/collections/m/generation/commit", json={"generationId": es("1")}, timeout=60
            )
        )
    )
    commit.start()
    try:
        assert entered.wait(30), "the commit never reached the listener"
        # the commit is stuck inside the engine; the event loop (get) and the other workers still serve
        assert live.ok("GET", "/healthz") == {"ok": True}
        assert live.ok("GET", "/collections/m")["generationId"] == {"value": "1"}
        assert live.ok("POST", "/collections/m/get", {"key": es("k")})["item"] is None
        assert commit.is_alive() and not answers
    finally:
        release.set()
        commit.join(30)
        unsubscribe()
    assert answers and answers[0].status_code == 200


def test_reads_on_the_event_loop_never_wait_for_a_writer(tmp_path: Path) -> None:
    # a read that stepped aside for the writer would wait the whole minute (longer than the client waits)
    with live_server(tmp_path / "data", store_config=StoreConfig(read_yield_ms=60_000)) as live:
        live.ok("POST", "/collections/", {"collectionName": "m", "isManual": False})
        writing, release = threading.Event(), threading.Event()

        def writer() -> None:
            with live.store.write():  # a write transaction of another thread, changing pages
                writing.set()
                release.wait(60)

        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        try:
            assert writing.wait(30)
            assert live.ok("POST", "/collections/m/get", {"key": es("k")}, timeout=20)["item"] is None
            answer = live.ok("GET", "/collections/m/generationId/stream", timeout=20)
            assert answer["generationId"]["value"] == "AAAAAAAAAAA="
            assert thread.is_alive(), "the write ended before the reads: they proved nothing"
        finally:
            release.set()
            thread.join(30)
