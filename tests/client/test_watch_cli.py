"""``diffstore watch`` as a real subprocess against a real server: JSON lines, then a clean Ctrl-C."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
from typing import IO, Any

from diffstore.client import Client
from tests.helpers import close_pipes

from .conftest import DEADLINE_S, LiveServer


def read_lines(stream: IO[str], lines: queue.Queue[Any]) -> None:
    for line in stream:
        lines.put(json.loads(line))
    lines.put(None)


def test_watch_prints_generations_and_diffs(server: LiveServer) -> None:
    with Client(server.url) as client:
        collection = client.create_collection("W")
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "diffstore.cli",
                "watch",
                "W",
                "--url",
                server.url,
                "--diff",
                "--since",
                "",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        lines: queue.Queue[Any] = queue.Queue()
        assert process.stdout is not None
        threading.Thread(target=read_lines, args=(process.stdout, lines), daemon=True).start()
        try:
            collection.start_generation(b"1")
            collection.put_many([(b"k", b"v"), (b"\x00bin", b"\xff")], generation_id=b"1")
            collection.commit_generation(b"1")
            assert lines.get(timeout=DEADLINE_S) == {
                "event": "generation",
                "collection": "W",
                "fromGenerationId": {"value": ""},
                "generationId": {"value": "1"},
            }
            binary_item = lines.get(timeout=DEADLINE_S)
            assert binary_item["key"] == {"value": "AGJpbg==", "encoding": "base64"}
            assert binary_item["fromValue"] is None and binary_item["toValue"]["encoding"] == "base64"
            assert lines.get(timeout=DEADLINE_S)["key"] == {"value": "k"}
            collection.start_generation(b"2")
            collection.put(b"k", None, generation_id=b"2")
            collection.commit_generation(b"2")
            assert lines.get(timeout=DEADLINE_S)["generationId"] == {"value": "2"}
            item = lines.get(timeout=DEADLINE_S)
            assert (item["key"], item["fromValue"], item["toValue"]) == ({"value": "k"}, {"value": "v"}, None)
            process.send_signal(signal.SIGINT)
            assert process.wait(timeout=DEADLINE_S) == 0
            assert lines.get(timeout=DEADLINE_S) is None
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            close_pipes(process)
