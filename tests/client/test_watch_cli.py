"""``diffstore watch`` as a real subprocess against a real server: the one text form, JSON lines, Ctrl-C."""

from __future__ import annotations

import io
import json
import logging
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import pytest

from diffstore import shell
from diffstore.backoff import RetryPolicy
from diffstore.client import Client
from diffstore.client.backend import RemoteBackend
from diffstore.client.cli import watch
from diffstore.outage import OutageWatch
from tests.faults import TcpProxy
from tests.helpers import LiveServer, close_pipes, wait_until
from tests.replica.conftest import Server

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


# --- riding out an outage (issue 54, item 1) ------------------------------------------------------------

OUTAGE_DEADLINE_S = 60.0  # generous: the machine is loaded, and a restart of serve takes seconds


def test_watch_rides_out_a_restart_of_its_server(tmp_path: Path) -> None:
    """Before the fix the first refused call ended ``diffstore watch`` with exit 1."""
    server = Server(tmp_path / "db").start()
    process: subprocess.Popen[str] | None = None
    try:
        with server.client() as client:
            client.create_collection("W", manual=True).write_generation(b"1", [(b"a", b"1")])
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "diffstore.cli",
                "watch",
                "W",
                "--diff",
                "--since",
                "",
                "--url",
                server.url,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        lines: queue.Queue[str | None] = queue.Queue()
        errors: queue.Queue[str | None] = queue.Queue()
        assert process.stdout is not None and process.stderr is not None
        threading.Thread(target=read_lines, args=(process.stdout, lines), daemon=True).start()
        threading.Thread(target=read_lines, args=(process.stderr, errors), daemon=True).start()
        assert lines.get(timeout=OUTAGE_DEADLINE_S) == 'generation 1 (from "")'
        assert lines.get(timeout=OUTAGE_DEADLINE_S) == "+ a\t1"
        server.kill9()
        assert "does not answer" in str(errors.get(timeout=OUTAGE_DEADLINE_S))
        server.start()
        assert "is back after" in str(errors.get(timeout=OUTAGE_DEADLINE_S))
        with server.client() as again:
            again.collection("W").write_generation(b"2", [(b"a", b"2"), (b"b", b"2")])
        assert lines.get(timeout=OUTAGE_DEADLINE_S) == "generation 2 (from 1)"
        assert lines.get(timeout=OUTAGE_DEADLINE_S) == "~ a\t1\t2"
        assert lines.get(timeout=OUTAGE_DEADLINE_S) == "+ b\t2"
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=OUTAGE_DEADLINE_S) == 0
        assert lines.get(timeout=OUTAGE_DEADLINE_S) is None  # nothing printed twice
    finally:
        if process is not None:
            if process.poll() is None:
                process.kill()
                process.wait()
            close_pipes(process)
        server.kill9()


class Done(Exception):
    """Ends the watch loop of the test below once every expected line came."""


class CuttingOutput(io.StringIO):
    """The watch's output: cuts the link to the server after the ``cut_after``-th line (inside a generation's
    diff, between two of its pages) and ends the watch after ``lines`` lines."""

    def __init__(self, proxy: TcpProxy, cut_after: int, lines: int) -> None:
        super().__init__()
        self.proxy, self.cut_after, self.lines, self.count = proxy, cut_after, lines, 0

    def write(self, text: str) -> int:
        written = super().write(text)
        self.count += text.count("\n")
        if self.count == self.cut_after:
            self.proxy.cut(refuse=True)
        if self.count == self.lines:
            raise Done
        return written


def test_a_diff_cut_short_by_an_outage_is_finished_without_printing_a_line_twice(server: LiveServer) -> None:
    keys = [b"k%04d" % i for i in range(450)]  # three diff pages of 200
    with server.client() as client, TcpProxy(server.url.removeprefix("http://")) as proxy:
        client.create_collection("W", manual=True).write_generation(b"1", [(k, b"v") for k in keys])
        output = CuttingOutput(proxy, cut_after=101, lines=1 + len(keys))
        outage = OutageWatch(
            "the server", RetryPolicy(initial_s=0.05, max_s=0.2), logging.getLogger("test.watch")
        )

        def restore() -> None:
            wait_until(lambda: outage.waiting, OUTAGE_DEADLINE_S, what="the watch to wait")
            proxy.accept()

        restorer = threading.Thread(target=restore, daemon=True)
        restorer.start()
        with Client(f"http://{proxy.address}") as through_proxy, pytest.raises(Done):
            remote = RemoteBackend(through_proxy)
            watch(remote, remote.collection("W"), True, output, b"", "text", outage)
        restorer.join(OUTAGE_DEADLINE_S)
        assert output.getvalue().splitlines() == ['generation 1 (from "")'] + [
            f"+ {k.decode()}\tv" for k in keys
        ]
        assert not outage.waiting


def test_watch_gives_up_after_the_time_it_was_given(tmp_path: Path) -> None:
    server = Server(tmp_path / "db").start()
    process: subprocess.Popen[str] | None = None
    try:
        with server.client() as client:
            client.create_collection("W", manual=True).write_generation(b"1")
        command = [sys.executable, "-m", "diffstore.cli", "watch", "W", "--since", "", "--url", server.url]
        process = subprocess.Popen(
            [*command, "--give-up-after-s", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        lines: queue.Queue[str | None] = queue.Queue()
        assert process.stdout is not None
        threading.Thread(target=read_lines, args=(process.stdout, lines), daemon=True).start()
        assert lines.get(timeout=OUTAGE_DEADLINE_S) == 'generation 1 (from "")'  # it runs
        server.kill9()
        assert process.wait(timeout=OUTAGE_DEADLINE_S) == 1
        assert process.stderr is not None
        err = process.stderr.read()
        assert "does not answer; retrying with back-off for up to 1 s" in err and "gave up after" in err
        assert "Traceback" not in err
    finally:
        if process is not None:
            if process.poll() is None:
                process.kill()
                process.wait()
            close_pipes(process)
        server.kill9()
