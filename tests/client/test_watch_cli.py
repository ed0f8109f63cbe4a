"""``diffstore watch`` as a real subprocess against a real server: the one text form, JSON lines, Ctrl-C."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

from diffstore import shell
from diffstore.client import Client
from tests.helpers import LiveServer, close_pipes

from .conftest import DEADLINE_S


def read_lines(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


@contextmanager
def watching(server: LiveServer, *args: str) -> Iterator[queue.Queue[str | None]]:
    """Runs ``diffstore watch ARGS`` until the block ends, then stops it with Ctrl-C (exit 0)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "diffstore.cli", "watch", *args, "--url", server.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    assert process.stdout is not None
    threading.Thread(target=read_lines, args=(process.stdout, lines), daemon=True).start()
    try:
        yield lines
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=DEADLINE_S) == 0
        assert lines.get(timeout=DEADLINE_S) is None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        close_pipes(process)


def test_watch_prints_the_text_form_that_since_and_get_accept_back(server: LiveServer) -> None:
    first, second = b"\x00\x00\x00\x01", b"\x00\x00\x00\x02"
    with Client(server.url) as client:
        collection = client.create_collection("W", manual=True)
        with watching(server, "W", "--diff", "--since", "") as lines:
            collection.start_generation(first)
            collection.put_many([(b"k", b"v"), (b"\x00bin", b"\xff")], generation_id=first)
            collection.commit_generation(first)
            assert lines.get(timeout=DEADLINE_S) == 'generation base64:AAAAAQ== (from "")'
            assert lines.get(timeout=DEADLINE_S) == "+ base64:AGJpbg==\tbase64:/w=="
            assert lines.get(timeout=DEADLINE_S) == "+ k\tv"
        printed = "base64:AAAAAQ=="
        # the id as printed is accepted back by --since, and by get --generation
        with watching(server, "W", "--diff", "--since", printed) as lines:
            collection.start_generation(second)
            collection.put(b"k", None, generation_id=second)
            collection.commit_generation(second)
            assert lines.get(timeout=DEADLINE_S) == f"generation base64:AAAAAg== (from {printed})"
            assert lines.get(timeout=DEADLINE_S) == "- k\tv"
        got = subprocess.run(
            [sys.executable, "-m", "diffstore.cli", "get", "W", "k", "--generation", printed]
            + ["--url", server.url],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S * 3,
        )
        assert (got.returncode, got.stdout) == (0, "v\n"), got.stderr
        assert shell.parse(printed) == first


def test_watch_json_lines_carry_the_same_text_forms(server: LiveServer) -> None:
    with Client(server.url) as client:
        collection = client.create_collection("W")
        with watching(server, "W", "--diff", "--since", "", "--format", "json") as lines:
            collection.start_generation(b"1")
            collection.put_many([(b"k", b"v"), (b"\x00bin", b"\xff")], generation_id=b"1")
            collection.commit_generation(b"1")
            assert json.loads(lines.get(timeout=DEADLINE_S) or "") == {
                "event": "generation",
                "collection": "W",
                "fromGenerationId": "",
                "generationId": "1",
            }
            assert json.loads(lines.get(timeout=DEADLINE_S) or "") == {
                "event": "item",
                "collection": "W",
                "generationId": "1",
                "key": "base64:AGJpbg==",
                "fromValue": None,
                "toValue": "base64:/w==",
            }
            assert json.loads(lines.get(timeout=DEADLINE_S) or "")["key"] == "k"
            collection.start_generation(b"2")
            collection.put(b"k", None, generation_id=b"2")
            collection.commit_generation(b"2")
            assert json.loads(lines.get(timeout=DEADLINE_S) or "")["generationId"] == "2"
            item = json.loads(lines.get(timeout=DEADLINE_S) or "")
            assert (item["key"], item["fromValue"], item["toValue"]) == ("k", "v", None)
