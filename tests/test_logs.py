"""``--log-format json``: one JSON object per line with time, level, event and the record's fields."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from diffstore import logs
from tests.helpers import free_port, wait_until


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def test_json_lines_carry_time_level_event_and_fields(restore_logging: None) -> None:
    out = io.StringIO()
    logs.configure("debug", "json", out)
    log = logging.getLogger("diffstore.test")
    log.info("window committed", extra={"collection": "c", "records": 3})
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("it failed")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(lines) == 2
    first = lines[0]
    assert first["level"] == "info" and first["event"] == "window committed"
    assert first["collection"] == "c" and first["records"] == 3 and first["logger"] == "diffstore.test"
    assert first["time"].endswith("+00:00")
    assert lines[1]["level"] == "error" and "ValueError: boom" in lines[1]["exc_info"]
    assert all(line["pid"] == os.getpid() and "worker" not in line for line in lines)


def test_a_workers_lines_carry_its_number(restore_logging: None) -> None:
    out = io.StringIO()
    logs.configure("info", "json", out, worker=3)
    logging.getLogger("diffstore.test").info("hello")
    line = json.loads(out.getvalue())
    assert (line["pid"], line["worker"]) == (os.getpid(), 3)


def test_an_access_line_says_how_long_the_request_took(restore_logging: None) -> None:
    from diffstore.server.uvicorn_adapter import TimedAccessLog

    out = io.StringIO()
    logs.configure("info", "json", out)
    now = [10.0]
    access = TimedAccessLog(logging.getLogger("uvicorn.access"), 10.0, lambda: now[0])
    now[0] = 10.0125
    access.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", "/healthz", "1.1", 200)
    line = json.loads(out.getvalue())
    assert line["duration_ms"] == 12.5 and line["status"] == 200 and line["path"] == "/healthz"
    assert line["event"] == '127.0.0.1:5 - "GET /healthz HTTP/1.1" 200 in 12.5 ms'
    text = io.StringIO()
    logs.configure("info", "text", text)
    access.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", "/healthz", "1.1", 200)
    assert text.getvalue().rstrip().endswith('"GET /healthz HTTP/1.1" 200 in 12.5 ms')


def test_level_filters(restore_logging: None) -> None:
    out = io.StringIO()
    logs.configure("warning", "text", out)
    logging.getLogger("diffstore.test").info("hidden")
    logging.getLogger("diffstore.test").warning("shown")
    assert "shown" in out.getvalue() and "hidden" not in out.getvalue()
    with pytest.raises(ValueError):
        logs.configure("loud", "text", out)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_writes_json_lines_with_uvicorns_logs(tmp_path: Path, workers: str) -> None:
    """One process, or a supervisor whose spawned workers set up their own logging from the config."""
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "diffstore.cli",
            "serve",
            "--data",
            str(tmp_path / "d"),
            "--port",
            str(port),
            "--access-log",
            "--log-format",
            "json",
            "--log-level",
            "info",
            "--workers",
            workers,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={k: v for k, v in os.environ.items() if k != "DIFFSTORE_TOKEN"},  # an empty one is refused
    )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/healthz").status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(healthy, 120, what="diffstore serve to start")  # 2 workers: ~45 s at load 20
        assert httpx.get(f"{url}/collections/").status_code == 200
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    assert b"\x1b" not in output and b"\\u001b" not in output  # no terminal colours, raw or escaped
    lines = [json.loads(line) for line in output.decode().splitlines() if line.strip()]
    assert lines, output
    # the address is announced once the server accepts (after a worker's startup), at INFO, with the
    # console's and the API docs' addresses; nothing about it comes earlier, or as a warning
    (ready,) = [
        i for i, line in enumerate(lines) if line["logger"] == "diffstore.server" and url in line["event"]
    ]
    assert lines[ready]["level"] == "info" and lines[ready]["logger"] == "diffstore.server"
    assert f"console {url}/ui/" in lines[ready]["event"] and f"API docs {url}/docs" in lines[ready]["event"]
    started = [i for i, line in enumerate(lines) if line["event"] == "Application startup complete."]
    assert started and started[0] < ready
    assert not [line for line in lines if line["level"] == "warning"], lines
    for line in lines:
        assert {"time", "level", "event", "logger", "pid"} <= line.keys(), line
    # one process: its pid, no worker; a supervisor's own lines too, its workers' lines their pid and number
    assert lines[ready]["pid"] == process.pid and "worker" not in lines[ready]
    served = [line for line in lines if line["logger"].startswith("uvicorn")]
    if workers == "1":
        assert all(line["pid"] == process.pid and "worker" not in line for line in served), served
    else:
        assert all(line["pid"] != process.pid and line["worker"] in (1, 2) for line in served), served
    access = [line for line in lines if line["logger"] == "uvicorn.access"]
    assert any(
        line["path"] == "/collections/" and line["status"] == 200 and line["method"] == "GET"
        for line in access
    )
    assert all(isinstance(line["duration_ms"], float) and line["duration_ms"] >= 0 for line in access)
    assert any(
        line["logger"] == "uvicorn.error" and "Started server process" in line["event"] for line in lines
    ), lines
