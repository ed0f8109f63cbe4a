"""A request stuck inside the engine does not stall the others.

Engine calls run in worker threads, except the point reads of the fast lane (``get``, the long poll's
current generation), which run on the event loop: LMDB readers never wait for a writer or a lock.
"""

from __future__ import annotations

import threading

import httpx

from .conftest import Live, es


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
