"""A replica refuses every write whatever the collection's name -- one it holds, one the primary has that
it has not copied yet, one nowhere, odd names -- with 409 readOnlyReplica and nothing changed, from the
HTTP API and from the command line; the primary's token reaches it from a file or the environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.faults import TcpProxy
from tests.helpers import wait_until

from .compare import caught_up, every_read, generations, state
from .conftest import Server
from .promote_store import live

FOLLOW_S = 180.0
ES = {"value": "k"}
NAMES = ("M", "late", "nowhere", "名前 with space", "x" * 255, "..." + "y")


def _writes(name: str) -> list[tuple[str, str, Any]]:
    c = f"/collections/{quote(name, safe='')}"
    return [
        ("POST", "/collections/", {"collectionName": name, "isManual": True}),
        ("DELETE", c, None),
        ("POST", f"{c}/put", {"item": {"key": ES, "value": ES}}),
        ("POST", f"{c}/putMany/", {"items": [{"key": ES, "value": ES}], "generationId": {"value": "9"}}),
        ("POST", f"{c}/generation/start", {"generationId": {"value": "9"}}),
        ("POST", f"{c}/generation/commit", {"generationId": {"value": "9"}}),
        ("POST", f"{c}/generation/abort", {"generationId": {"value": "9"}}),
        ("POST", f"{c}/readers/", {"readerName": "r2", "generationId": None}),
        ("PUT", f"{c}/readers/r", {"generationId": None}),
        ("DELETE", f"{c}/readers/r", None),
        ("POST", f"{c}/phantom/start", {}),
        ("POST", f"{c}/leases/l/acquire", {"owner": "me", "ttlMs": 10_000}),
        ("POST", f"{c}/revert", {"toGenerationId": {"value": ""}}),
        ("POST", f"{c}/anything/added/later", {}),
    ]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "diffstore.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_every_write_to_any_collection_name_is_refused_on_a_replica(
    tmp_path: Path, primary: Server, servers: list[Server]
) -> None:
    with TcpProxy(primary.url.removeprefix("http://")) as proxy:
        replica = Server(tmp_path / "replica", "--replica-of", f"http://{proxy.address}")
        servers.append(replica.start())
        with primary.client() as p, replica.client() as r:
            live(p, lambda: wait_until(lambda: caught_up(p, r), FOLLOW_S))
            wait_until(lambda: caught_up(p, r), FOLLOW_S, what="the replica to copy")
            proxy.stall()  # the replica cannot copy what comes now
            late = p.create_collection("late", manual=True)
            late.write_generation(b"1", [(b"k", b"v")])
            held = generations(r)
            before = state(r), every_read(r, {"M": held["M"], "T": held["T"]})
            with httpx.Client(base_url=replica.url, timeout=60) as http:
                for name in NAMES:
                    for method, path, body in _writes(name):
                        answer = http.request(method, path, json=body)
                        assert answer.status_code == 409, (method, path, answer.text)
                        assert answer.json()["error"] == "readOnlyReplica", (method, path)
            # the command line says the same for a collection not copied yet (it looks it up first)
            url = ["--url", replica.url]
            for args in (
                ["put", "late", "k", "v"],
                ["delete", "late", "k"],
                ["generation", "start", "late"],
                ["generation", "commit", "late"],
                ["readers", "create", "late", "r2"],
                ["readers", "rm", "late", "r"],
                ["revert", "late", "@current"],
                ["put", "M", "k", "v", "--generation", "g9"],
            ):
                done = _cli(*args, *url)
                assert done.returncode == 1, (args, done.stdout, done.stderr)
                assert done.stderr.strip().endswith("(readOnlyReplica)"), (args, done.stderr)
                assert len(done.stderr.strip().splitlines()) == 1
            assert (state(r), every_read(r, {"M": held["M"], "T": held["T"]})) == before
            assert "late" not in state(r)
            proxy.passing()
            wait_until(lambda: caught_up(p, r), FOLLOW_S, what="the replica to copy what came meanwhile")


def test_the_primary_token_from_a_file_or_the_environment(
    tmp_path: Path, servers: list[Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "s3cret-of-the-primary"
    primary = Server(tmp_path / "primary", token=secret)
    servers.append(primary.start())
    token_file = tmp_path / "token"
    token_file.write_text(secret + "\n")
    from_file = Server(
        tmp_path / "from-file", "--replica-of", primary.url, "--replica-token-file", str(token_file)
    )
    servers.append(from_file.start())
    monkeypatch.setenv("DIFFSTORE_REPLICA_TOKEN", secret)
    from_env = Server(tmp_path / "from-env", "--replica-of", primary.url)
    servers.append(from_env.start())
    monkeypatch.delenv("DIFFSTORE_REPLICA_TOKEN")
    on_line = Server(tmp_path / "on-line", "--replica-of", primary.url, "--replica-token", secret)
    servers.append(on_line.start())
    with primary.client() as p:
        p.create_collection("A", manual=True).write_generation(b"1", [(b"k", b"v")])
        for replica in (from_file, from_env, on_line):
            with replica.client() as r:
                wait_until(lambda r=r: caught_up(p, r), FOLLOW_S, what=f"{replica.data.name} to follow")
    # no secret on the command lines of the first two; the third warned, once
    for replica in (from_file, from_env):
        assert replica.process is not None
        assert secret not in Path(f"/proc/{replica.process.pid}/cmdline").read_text(errors="replace")
    warnings = [
        line for line in on_line.log.read_text().splitlines() if "--replica-token can be read" in line
    ]
    assert len(warnings) == 1, warnings
    assert not any("--replica-token can be read" in s.log.read_text() for s in (from_file, from_env))
    # what cannot be used is refused in one line, before anything starts
    base = ["serve", "--data", str(tmp_path / "bad"), "--port", "0", "--replica-of", primary.url]
    empty = tmp_path / "empty"
    empty.write_text("\n")
    two_lines = tmp_path / "two-lines"
    two_lines.write_text("a\nb\n")
    for extra, expected in (
        (["--replica-token-file", str(empty)], "is empty or holds more than one line"),
        (["--replica-token-file", str(two_lines)], "is empty or holds more than one line"),
        (["--replica-token-file", str(tmp_path / "missing")], "No such file or directory"),
        (["--replica-token-file", str(token_file), "--replica-token", secret], "not both"),
    ):
        done = _cli(*base, *extra)
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and expected in done.stderr, done.stderr
    assert not (tmp_path / "bad").exists() or not any((tmp_path / "bad").iterdir())
    assert "--replica-token-file" in _cli("serve", "--help").stdout
    env = {**os.environ, "DIFFSTORE_REPLICA_TOKEN": ""}
    blank = subprocess.run(
        [sys.executable, "-m", "diffstore.cli", *base], capture_output=True, text=True, timeout=120, env=env
    )
    assert blank.returncode == 2 and "DIFFSTORE_REPLICA_TOKEN is empty" in blank.stderr
