"""``diffstore serve`` in a real process: token from the environment, graceful SIGTERM, durable data."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import httpx

from diffstore.engine.store import Store
from tests.helpers import close_pipes, free_port, wait_until

# Only the server's sub-commands, so that this test does not depend on the other fronts' CLIs.
DRIVER = (
    "import argparse, sys; from diffstore.server.cli import add_commands; "
    "p = argparse.ArgumentParser(); add_commands(p.add_subparsers()); a = p.parse_args(); sys.exit(a.func(a))"
)


def server_rx_queue(server_port: int, client_port: int) -> int | None:
    """Bytes waiting unread in the server's end of a loopback TCP connection (from /proc/net/tcp)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, queues = fields[1], fields[2], fields[4]
        if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == client_port:
            return int(queues.split(":")[1], 16)
    return None


def wait_healthy(url: str, what: str, deadline_s: float = 30) -> None:
    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/healthz").status_code == 200
        except httpx.TransportError:
            return False

    wait_until(healthy, timeout=deadline_s, what=what)


def test_serve_token_and_graceful_shutdown(tmp_path: Path) -> None:
    port = free_port()
    data = tmp_path / "data"
    env = {**os.environ, "DIFFSTORE_TOKEN": "tok"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            DRIVER,
            "serve",
            "--data",
            str(data),
            "--port",
            str(port),
            "--commit-delay-ms",
            "5",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, "diffstore serve to start")
        assert httpx.get(f"{url}/collections/").status_code == 401
        auth = {"authorization": "Bearer tok"}
        with httpx.Client(base_url=url, headers=auth, timeout=60) as http:
            assert (
                http.post("/collections/", json={"collectionName": "m", "isManual": False}).status_code == 200
            )
            put = http.post(
                "/collections/m/put", json={"item": {"key": {"value": "k"}, "value": {"value": "v"}}}
            )
            assert put.status_code == 200

            def committed() -> bool:
                return http.get("/collections/m").json()["generationId"]["value"] != "AAAAAAAAAAA="

            wait_until(committed, timeout=30, what="the auto commit")
            current = http.get("/collections/m").json()["generationId"]
            encoding = current.get("encoding", "utf8")
            poll = socket.create_connection(("127.0.0.1", port))
            poll.sendall(
                f"GET /collections/m/generationId/stream?generationId={quote(current['value'])}"
                f"&generationIdEncoding={encoding}&timeoutMs=300000 HTTP/1.1\r\nHost: x\r\n"
                "Authorization: Bearer tok\r\n\r\n".encode()
            )
            # on loopback the request is in the server socket's receive queue once sendall returns; once
            # the queue is empty the server has read it, so the long poll is under way when SIGTERM comes
            client_port = poll.getsockname()[1]
            wait_until(
                lambda: server_rx_queue(port, client_port) == 0,
                timeout=10,
                what="the server to read the long poll",
            )
            process.send_signal(signal.SIGTERM)
            answer = b""
            while chunk := poll.recv(65536):
                answer += chunk
            poll.close()
            assert answer.startswith(b"HTTP/1.1 200 "), answer
            assert (
                answer.split(b"\r\n\r\n", 1)[1]
                == json.dumps({"generationId": current}, separators=(",", ":")).encode()
            )
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = process.stdout.read().decode() if process.stdout else ""
    close_pipes(process)
    assert "Shutting down" in output
    with Store.open(data) as store:  # closed cleanly, reopens with the committed record
        record = store.collection("m").get(b"k")
        assert record is not None and record.value == b"v"


def test_serve_no_sync_commits_survive_a_killed_server(tmp_path: Path) -> None:
    port = free_port()
    data = tmp_path / "data"
    process = subprocess.Popen(
        [sys.executable, "-c", DRIVER, "serve", "--data", str(data), "--port", str(port), "--no-sync"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, "diffstore serve --no-sync to start")
        with httpx.Client(base_url=url, timeout=60) as http:
            gen = {"generationId": {"value": "1"}}
            created = http.post("/collections/", json={"collectionName": "m", "isManual": True})
            assert created.status_code == 200
            assert http.post("/collections/m/generation/start", json=gen).status_code == 200
            item = {"key": {"value": "k"}, "value": {"value": "v"}}
            assert http.post("/collections/m/putMany", json={**gen, "items": [item]}).status_code == 200
            assert http.post("/collections/m/generation/commit", json=gen).status_code == 200
        process.send_signal(signal.SIGKILL)  # no flush, no clean close: the OS still holds the pages
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        close_pipes(process)
    with Store.open(data) as store:
        coll = store.collection("m")
        assert coll.generation_id == b"1"
        record = coll.get(b"k")
        assert record is not None and record.value == b"v"
