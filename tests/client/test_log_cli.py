"""``diffstore log`` and the history in the clients (SPEC §8) against a real server; reads at an unknown
generation from the command line."""

from __future__ import annotations

import asyncio
import json
import re
import time

import pytest

from diffstore import shell
from diffstore.client import AsyncClient, Client
from diffstore.client.log_cli import ago
from diffstore.errors import InvalidRequest, NoSuchGeneration

from .conftest import LiveServer
from .test_commands import cli, run


def _commits(server: LiveServer) -> None:
    with Client(server.url) as client:
        c = client.create_collection("C")
        c.start_generation(b"g1")
        c.put_many([(b"a", b"1"), (b"b", b"2")], generation_id=b"g1")
        c.commit_generation(b"g1", metadata={"job": "nightly", "run": "42"})
        c.start_generation(b"g2\xff")
        c.put(b"a", None, generation_id=b"g2\xff")
        c.commit_generation(b"g2\xff")


def test_clients_page_through_the_history(server: LiveServer) -> None:
    _commits(server)
    with Client(server.url) as client:
        c = client.collection("C")
        infos, more = c.history(limit=2)
        assert [i.generation_id for i in infos] == [b"g2\xff", b"g1"] and more
        assert [i.changed_keys for i in infos] == [1, 2]
        assert infos[1].metadata == {"job": "nightly", "run": "42"} and infos[0].metadata is None
        assert all(i.committed_at_ms is not None for i in infos)
        rest, more = c.history(before=infos[-1].generation_id, limit=2)
        assert [(i.generation_id, i.committed_at_ms) for i in rest] == [(b"", None)] and not more
        with pytest.raises(InvalidRequest):
            c.commit_generation(b"g9", metadata={"x": "y" * 5000})

    async def from_async() -> None:
        async with AsyncClient(server.url) as client:
            collection = await client.collection("C")
            assert (await collection.history(limit=2)) == (infos, True)

    asyncio.run(from_async())


def test_log_prints_time_keys_and_metadata(capsys: pytest.CaptureFixture[str], server: LiveServer) -> None:
    _commits(server)
    code, out, err = run(capsys, server, "log", "C")
    assert (code, err) == (0, "")
    lines = [line.split("\t") for line in out.splitlines()]
    assert [line[0] for line in lines] == [shell.show(b"g2\xff"), "g1", ""]
    assert lines[0][2] == "1 key" and lines[1][2] == "2 keys" and lines[1][3] == "job=nightly run=42"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+ \((just now|\d+ \S+ ago)\)", lines[0][1])
    assert lines[2] == ["", "-", "-"]
    code, out, _ = run(capsys, server, "log", "C", "--limit", "1", "--format", "json")
    (only,) = [json.loads(line) for line in out.splitlines()]
    assert (
        only["generationId"] == shell.show(b"g2\xff")
        and only["changedKeys"] == 1
        and only["metadata"] is None
    )
    assert abs(only["committedAtMs"] - time.time() * 1000) < 3_600_000


def test_ago_reads_like_a_person() -> None:
    assert [ago(ms) for ms in (0, 42_000, 180_000, 5 * 3_600_000, 86_400_000, 3 * 86_400_000)] == [
        "just now",
        "42 s ago",
        "3 min ago",
        "5 h ago",
        "1 day ago",
        "3 days ago",
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["log", "nope"], "noSuchCollection"),
        (["query", "C", "--generation", "nosuchgen"], "noSuchGeneration"),
        (["get", "C", "a", "--generation", "nosuchgen"], "noSuchGeneration"),
    ],
)
def test_failures_are_one_line(server: LiveServer, argv: list[str], message: str) -> None:
    _commits(server)
    done = cli(*argv, "--url", server.url)
    assert done.returncode == 1, done
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and message in done.stderr, done.stderr


def test_bad_limit_is_a_usage_error(server: LiveServer) -> None:
    done = cli("log", "C", "--limit", "0", "--url", server.url)
    assert done.returncode == 2 and "usage: diffstore log" in done.stderr


def test_a_read_at_an_unknown_generation_is_refused(server: LiveServer) -> None:
    _commits(server)
    with Client(server.url) as client:
        with pytest.raises(NoSuchGeneration):
            client.collection("C").get(b"a", generation_id=b"zzz")
