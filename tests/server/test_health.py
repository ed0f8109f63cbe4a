"""``/healthz`` says why the store is degraded: automatic commits keep failing (retried, never dropped)."""

from __future__ import annotations

from pathlib import Path

import pytest

from diffstore.engine import writes
from diffstore.engine.types import StoreConfig
from diffstore.errors import StorageError
from tests.helpers import wait_until

from .conftest import es, live_server
from .test_metrics import scrape, value


def test_failing_automatic_commits_make_healthz_degraded_until_they_succeed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = [True]
    commit_automatic = writes.commit_automatic

    def flaky(txn, tables, meta, now_ms=None):  # type: ignore[no-untyped-def]
        if failing[0]:
            raise StorageError("MDB_MAP_FULL: Environment mapsize limit reached")
        return commit_automatic(txn, tables, meta, now_ms)

    monkeypatch.setattr(writes, "commit_automatic", flaky)
    with live_server(
        tmp_path / "data", store_config=StoreConfig(commit_delay_ms=1, gc_interval_ms=20)
    ) as live:
        live.ok("POST", "/collections/", {"collectionName": "n", "isManual": False})
        live.ok("POST", "/collections/n/put", {"item": {"key": es("k"), "value": es("v")}})

        def degraded() -> bool:
            return bool(live.ok("GET", "/healthz").get("degraded"))

        wait_until(degraded, timeout=30, what="healthz to say degraded")
        health = live.ok("GET", "/healthz")
        assert health["ok"] is True and "MDB_MAP_FULL" in health["reason"] and "'n'" in health["reason"]
        assert live.ok("GET", "/collections/n")["generationId"] == {
            "value": "AAAAAAAAAAA=",
            "encoding": "base64",
        }
        samples = scrape(live)
        assert value(samples, "diffstore_auto_commit_failing_attempts", collection="n") >= 1
        assert value(samples, "diffstore_auto_commit_failures_total") >= 1
        failing[0] = False  # the disk has room again: the retry commits the acknowledged write
        wait_until(lambda: live.ok("GET", "/healthz") == {"ok": True}, timeout=30, what="healthz to recover")
        samples = scrape(live)
        assert ("diffstore_auto_commit_failing_attempts", frozenset({("collection", "n")})) not in samples
        assert value(samples, "diffstore_auto_commit_failures_total") >= 1
        answer = live.ok("POST", "/collections/n/get", {"key": es("k")})
        assert answer["item"]["value"] == {"value": "v"}
