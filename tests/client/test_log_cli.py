"""``diffstore log`` and the history in the clients (SPEC §8) against a real server; reads at an unknown
generation from the command line."""

from __future__ import annotations

import asyncio
import json
import re
import time
from datetime import UTC, datetime, timedelta

import pytest

from diffstore import shell
from diffstore.client import AsyncClient, Client
from diffstore.client.log_cli import ago, since_ms
from diffstore.engine.types import ReaderUpdate
from diffstore.errors import InvalidRequest, NoSuchGeneration
from tests.helpers import LiveServer

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
    header, *rows = out.splitlines()
    assert header == "GENERATION\tCOMMITTED\tCHANGED\tMETADATA\tREADERS MOVED"
    assert run(capsys, server, "log", "C", "--no-headers")[1] == "".join(row + "\n" for row in rows)
    lines = [line.split("\t") for line in rows]
    assert [line[0] for line in lines] == [shell.show(b"g2\xff"), "g1", '""']
    assert lines[0][2] == "1 key" and lines[1][2] == "2 keys" and lines[1][3] == "job=nightly run=42"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+ \((just now|\d+ \S+ ago)\)", lines[0][1])
    assert lines[2] == ['""', "-", "-"]  # the initial generation, "" (as watch prints it)
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


def _pipeline(server: LiveServer) -> None:
    """A: a1, a2; C reads A with from_a: c1 moves it to a1, c2 to a2; c3 moves nothing."""
    with Client(server.url) as client:
        a = client.create_collection("A")
        c = client.create_collection("C")
        c.create_reader("from_a", collection="A")
        for g in (b"a1", b"a2"):
            a.start_generation(g)
            a.put(b"k", g, generation_id=g)
            a.commit_generation(g)
        for g, to in ((b"c1", b"a1"), (b"c2", b"a2"), (b"c3", None)):
            c.start_generation(g)
            c.put(b"k", g, generation_id=g)
            c.commit_generation(
                g, [] if to is None else [ReaderUpdate("from_a", to)], metadata={"round": g.decode()}
            )


def test_log_shows_the_readers_each_commit_moved(
    capsys: pytest.CaptureFixture[str], server: LiveServer
) -> None:
    _pipeline(server)
    code, out, err = run(capsys, server, "log", "C", "--no-headers")
    assert (code, err) == (0, "")
    assert [line.split("\t")[3:] for line in out.splitlines()] == [
        ["round=c3"],
        ["round=c2", "from_a A a1 -> a2"],
        ["round=c1", "from_a A - -> a1"],  # created at the beginning (null), as lineage prints it
        [],
    ]
    code, out, _ = run(capsys, server, "log", "C", "--limit", "2", "--format", "json")
    c3, c2 = (json.loads(line) for line in out.splitlines())
    assert c3["movedReaders"] == []
    assert c2["movedReaders"] == [
        {"readerName": "from_a", "target": "A", "fromGenerationId": "a1", "toGenerationId": "a2"}
    ]
    # below the readers' minimum a commit's moves are gone with its generation: marked collected, no moves
    with Client(server.url) as client:
        client.collection("C").create_reader("keep", generation_id=b"c2")
    code, out, _ = run(capsys, server, "log", "C", "--no-headers")
    lines = [line.split("\t") for line in out.splitlines()]
    assert [line[0] for line in lines] == ["c3", "c2", "c1 (collected)", '"" (collected)']
    assert [line[4:] for line in lines][1:3] == [["from_a A a1 -> a2"], []]
    code, out, _ = run(capsys, server, "log", "C", "c1", "--format", "json")
    first = json.loads(out.splitlines()[0])
    assert first["movedReaders"] is None and first["collected"] is True


def test_log_starts_at_a_ref_and_stops_at_since(
    capsys: pytest.CaptureFixture[str], server: LiveServer
) -> None:
    _pipeline(server)
    code, out, _ = run(capsys, server, "log", "C", "~1", "--no-headers")
    assert code == 0 and [line.split("\t")[0] for line in out.splitlines()] == ["c2", "c1", '""']
    code, out, _ = run(capsys, server, "log", "C", "c1", "--limit", "1", "--no-headers")
    assert [line.split("\t")[0] for line in out.splitlines()] == ["c1"]
    # --since: a span back from now (every commit is recent) and a time after the last commit
    code, out, _ = run(capsys, server, "log", "C", "--since", "1h", "--no-headers")
    assert [line.split("\t")[0] for line in out.splitlines()] == ["c3", "c2", "c1"]
    with Client(server.url) as client:
        times = {g: client.collection("C").resolve_ref(g).committed_at_ms for g in ("c3", "c2", "c1")}
    c2_ms = times["c2"]
    assert c2_ms is not None
    iso = datetime.fromtimestamp(c2_ms // 1000, UTC) + timedelta(milliseconds=c2_ms % 1000)
    code, out, _ = run(capsys, server, "log", "C", "--since", iso.isoformat(), "--no-headers")
    # c3 and c2, and c1 only if it was committed in the same millisecond as c2
    since = [g for g, at in times.items() if at is not None and at >= c2_ms]
    assert [line.split("\t")[0] for line in out.splitlines()] == since
    later = datetime.now(UTC) + timedelta(hours=1)
    assert run(capsys, server, "log", "C", "--since", later.isoformat()) == (0, "", "")  # no header alone


def test_since_reads_spans_and_times() -> None:
    now = 1_800_000_000_000
    assert since_ms("90s", now) == now - 90_000
    assert since_ms("30m", now) == since_ms("30min", now) == now - 1_800_000
    assert since_ms("2h", now) == now - 7_200_000 and since_ms("7d", now) == now - 7 * 86_400_000
    assert since_ms("2027-01-15T08:00:00+00:00") == int(
        datetime(2027, 1, 15, 8, tzinfo=UTC).timestamp() * 1000
    )
    local = datetime(2027, 1, 15, 8)  # no zone: local time
    assert since_ms("2027-01-15T08:00:00") == int(local.astimezone().timestamp() * 1000)


@pytest.mark.parametrize("since", ["yesterday", "5 weeks", "-3h", ""])
def test_a_bad_since_is_a_usage_error(server: LiveServer, since: str) -> None:
    done = cli("log", "C", "--since", since, "--url", server.url)
    assert done.returncode == 2 and "usage: diffstore log" in done.stderr and "--since" in done.stderr


def test_a_bad_start_is_one_line(server: LiveServer) -> None:
    _pipeline(server)
    done = cli("log", "C", "~7", "--url", server.url)
    assert done.returncode == 1 and done.stdout == ""
    assert (
        done.stderr.count("\n") == 1 and "GENERATION ~7" in done.stderr and "noSuchGeneration" in done.stderr
    )
