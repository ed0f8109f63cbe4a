"""A request stuck inside the engine does not stall the others.

Engine calls run in worker threads, except the point reads of the fast lane (``get``, the long poll's
current generation), which run on the event loop: the app marks the loop's thread so that its reads never
block on a writer (``Store.never_wait_for_writers_here``), and LMDB readers take no lock. A ``get`` that
arrives while a writer thread of the process changes pages is parked (``FastLane.step_aside``, at most
``read_yield_ms``) while the loop serves the rest.
"""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from diffstore.engine.types import StoreConfig
from tests.helpers import wait_until

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


def test_the_event_loop_never_blocks_on_a_writer_and_a_get_steps_aside_until_it_is_done(
    tmp_path: Path,
) -> None:
    # read_yield_ms is a minute: a get answered before the writer is done was not kept waiting by the bound
    with live_server(tmp_path / "data", store_config=StoreConfig(read_yield_ms=60_000)) as live:
        live.ok("POST", "/collections/", {"collectionName": "m", "isManual": False})
        writing, release = threading.Event(), threading.Event()

        def writer() -> None:
            with live.store.write():  # a write transaction of another thread, changing pages
                writing.set()
                release.wait(60)

        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        gets: list[dict[str, object]] = []
        get = threading.Thread(
            target=lambda: gets.append(live.ok("POST", "/collections/m/get", {"key": es("k")}, timeout=60))
        )
        try:
            assert writing.wait(30)
            get.start()
            # the loop serves everything else meanwhile, the long poll's read on the loop included
            assert live.ok("GET", "/healthz", timeout=20) == {"ok": True}
            answer = live.ok("GET", "/collections/m/generationId/stream", timeout=20)
            assert answer["generationId"]["value"] == "AAAAAAAAAAA="
            wait_until(lambda: live.store.reads_stepped_aside == 1, what="the get stepped aside")
            assert get.is_alive() and gets == [] and thread.is_alive()
        finally:
            release.set()
            thread.join(30)
        get.join(30)
        assert len(gets) == 1 and gets[0]["item"] is None


def test_a_parked_get_waits_at_most_read_yield_ms(tmp_path: Path) -> None:
    with live_server(tmp_path / "data", store_config=StoreConfig(read_yield_ms=1)) as live:
        live.ok("POST", "/collections/", {"collectionName": "m", "isManual": False})
        writing, release = threading.Event(), threading.Event()

        def writer() -> None:
            with live.store.write():
                writing.set()
                release.wait(60)

        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        try:
            assert writing.wait(30)
            # the writer holds on until released: only the bound can let the get through
            assert live.ok("POST", "/collections/m/get", {"key": es("k")}, timeout=20)["item"] is None
            assert thread.is_alive()
        finally:
            release.set()
            thread.join(30)
