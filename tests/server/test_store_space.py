"""The store's file size and free pages in ``/metrics`` and ``/overview``: free pages appear when data is
deleted and purged, and ``compact`` gives them back (a real server, real deletes, a real compaction)."""

from __future__ import annotations

from pathlib import Path

from diffstore.engine import compact
from diffstore.engine.types import StoreConfig
from tests.helpers import wait_until

from .conftest import Live, es, live_server
from .test_metrics import scrape, value

FILE, FREE, PAGE = "diffstore_store_file_bytes", "diffstore_store_free_pages", "diffstore_store_page_bytes"


def fill(live: Live, name: str) -> None:
    live.ok("POST", "/collections/", {"collectionName": name, "isManual": True})
    live.ok("POST", f"/collections/{name}/generation/start", {"generationId": es("1")})
    for batch in range(4):
        items = [{"key": es(f"k{batch}-{i:05d}"), "value": es("v" * 400)} for i in range(2000)]
        live.ok("POST", f"/collections/{name}/putMany", {"generationId": es("1"), "items": items})
    live.ok("POST", f"/collections/{name}/generation/commit", {"generationId": es("1")})


def test_free_pages_show_after_a_delete_and_go_after_a_compaction(tmp_path: Path) -> None:
    data = tmp_path / "data"
    config = StoreConfig(commit_delay_ms=20, gc_interval_ms=20)
    with live_server(data, store_config=config) as live:
        fill(live, "big")
        fill(live, "small")
        before = scrape(live)
        assert value(before, FILE) > 3_000_000 and value(before, PAGE) == 4096
        live.ok("DELETE", "/collections/big")
        # the purge runs in the background, in steps: its freed pages show as it goes
        wait_until(
            lambda: value(scrape(live), FREE) * 4096 > 3_000_000,
            timeout=60.0,
            what="the purged pages to show",
        )
        overview = live.ok("GET", "/overview")
        assert overview["storeFreePages"] * overview["storePageBytes"] > 3_000_000
        assert overview["storeFileBytes"] == value(scrape(live), FILE)
        full_size = overview["storeFileBytes"]
    result = compact.compact(data)
    # the deleted collection was as big as the one kept: compaction gives back about half the file
    assert result.before_bytes == full_size and result.after_bytes < full_size * 0.6
    with live_server(data, store_config=config) as live:
        after = scrape(live)
        assert value(after, FILE) == result.after_bytes
        assert value(after, FREE) * 4096 < 0.1 * result.after_bytes
        assert live.ok("POST", "/collections/small/get", {"key": es("k0-00000")})["item"] is not None
