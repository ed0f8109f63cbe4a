"""``diffstore serve --map-size``: a write past the map is a 507 ``storageFull`` that changes nothing, and the
server keeps answering reads and smaller writes (a real server process over a real 1 MiB map).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx

from tests.helpers import close_pipes, free_port

from .conftest import es, unes
from .test_cli import DRIVER, wait_healthy


def test_a_write_past_the_map_is_507_and_changes_nothing(tmp_path: Path) -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", DRIVER, "serve", "--data", str(tmp_path / "data"), "--port", str(port)]
        + ["--map-size", "1MiB"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, "diffstore serve to start")
        with httpx.Client(base_url=url, timeout=60) as http:
            created = http.post("/collections/", json={"collectionName": "c", "isManual": True})
            assert created.status_code == 200
            assert http.post("/collections/c/generation/start", json={"generationId": es("g1")}).is_success
            small = [{"key": es(b"k%03d" % i), "value": es("v")} for i in range(50)]
            body = {"items": small, "generationId": es("g1")}
            assert http.post("/collections/c/putMany", json=body).status_code == 200
            assert http.post("/collections/c/generation/commit", json={"generationId": es("g1")}).is_success
            assert http.post("/collections/c/generation/start", json={"generationId": es("g2")}).is_success

            def snapshot() -> list[tuple[bytes | None, bytes | None]]:
                answer = http.post("/collections/c/query/", json={"generationId": es("g2"), "limit": 10000})
                assert answer.status_code == 200
                return [(unes(i["key"]), unes(i["value"])) for i in answer.json()["items"]]

            before = snapshot()
            big = [{"key": es(b"big%04d" % i), "value": es("x" * 2000)} for i in range(1000)]
            refused = http.post("/collections/c/putMany", json={"items": big, "generationId": es("g2")})
            assert refused.status_code == 507, refused.text
            assert refused.json()["error"] == "storageFull"
            assert "map is full" in refused.json()["reason"]
            assert snapshot() == before
            one = {"item": {"key": es("small"), "value": es("s")}, "generationId": es("g2")}
            assert http.post("/collections/c/put", json=one).status_code == 200
            assert http.post("/collections/c/generation/commit", json={"generationId": es("g2")}).is_success
            got = http.post("/collections/c/get", json={"key": es("small")}).json()
            assert unes(got["item"]["value"]) == b"s"
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        close_pipes(process)


def test_a_bad_map_size_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, "serve", "--data", str(tmp_path), "--map-size", "lots"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "not a size" in done.stderr
    assert not (tmp_path / "data.mdb").exists()
