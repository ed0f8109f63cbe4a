"""``diffstore revert`` and ``revert()`` in both clients (SPEC §8) against a real server."""

from __future__ import annotations

import asyncio
import json

import pytest

from diffstore import RevertResult, shell
from diffstore.client import AsyncClient, Client
from diffstore.errors import GenerationCollected, GenerationMismatch, NoSuchGeneration
from tests.helpers import LiveServer

from .test_commands import cli, run


def _history(server: LiveServer) -> None:
    """Manual C: g1 {a:1, b:1} -> g2 {a:2, b deleted}; automatic A: two commits."""
    with Client(server.url) as client:
        c = client.create_collection("C")
        c.start_generation(b"g1")
        c.put_many([(b"a", b"1"), (b"b", b"1")], generation_id=b"g1")
        c.commit_generation(b"g1")
        c.start_generation(b"g2")
        c.put_many([(b"a", b"2"), (b"b", None)], generation_id=b"g2")
        c.commit_generation(b"g2")


def _rows(client: Client, name: str, generation: bytes | None = None) -> dict[bytes, bytes]:
    return {r.key: r.value for r in client.collection(name).query(generation_id=generation)}


def test_clients_revert(server: LiveServer) -> None:
    _history(server)
    with Client(server.url) as client:
        c = client.collection("C")
        c.start_generation(b"g3")
        with pytest.raises(GenerationMismatch):
            c.revert(b"g1")
        with pytest.raises(NoSuchGeneration):
            c.revert(b"g1x", generation_id=b"g3")
        assert c.revert(b"g1", generation_id=b"g3") == RevertResult(b"g3", 2)
        assert _rows(client, "C", b"g3") == {b"a": b"1", b"b": b"1"}

    async def from_async() -> None:
        async with AsyncClient(server.url) as client:
            collection = await client.collection("C")
            assert await collection.revert(b"g2", generation_id=b"g3") == RevertResult(b"g3", 2)

    asyncio.run(from_async())
    with Client(server.url) as client:
        assert _rows(client, "C", b"g3") == {b"a": b"2"}


def test_revert_command_on_manual_and_automatic_collections(
    capsys: pytest.CaptureFixture[str], server: LiveServer
) -> None:
    _history(server)
    with Client(server.url) as client:
        client.collection("C").start_generation(b"g3")
    code, out, err = run(capsys, server, "revert", "C", "g1", "--generation", "g3")
    assert (code, err) == (0, "")
    assert out == "reverted C to g1: 2 keys changed in generation g3 (open: commit it to keep the revert)\n"
    code, out, err = run(capsys, server, "revert", "C", "~0", "--generation", "@open", "--format", "json")
    assert (code, err) == (0, "")
    assert json.loads(out) == {
        "collection": "C",
        "toGenerationId": "g2",
        "generationId": "g3",
        "changedKeys": 2,
    }
    code, out, err = run(capsys, server, "collections", "create", "A", "--auto")
    assert code == 0
    for value in ("1", "2"):
        assert run(capsys, server, "put", "A", "k", value)[0] == 0
    with Client(server.url) as client:
        first = client.collection("A").history(limit=2)[0][1].generation_id
    code, out, err = run(capsys, server, "revert", "A", shell.show(first), "--format", "json")
    assert (code, err) == (0, "")
    answer = json.loads(out)
    assert answer["changedKeys"] == 1 and answer["collection"] == "A"
    with Client(server.url) as client:  # the command waited for the commit
        assert _rows(client, "A") == {b"k": b"1"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["revert", "nope", "g1"], "noSuchCollection"),
        (["revert", "C", "g1"], "--generation (generation g3 is open) (generationMismatch)"),
        (["revert", "C", "g1x", "--generation", "g3"], "noSuchGeneration"),
        (["revert", "C", "g1", "--generation", "g9"], "generationMismatch"),
        (["revert", "C", "base64:!", "--generation", "g3"], "GENERATION"),
        (["revert", "C", "~9", "--generation", "g3"], "GENERATION ~9"),
    ],
)
def test_failures_are_one_line_and_change_nothing(server: LiveServer, argv: list[str], message: str) -> None:
    _history(server)
    with Client(server.url) as client:
        client.collection("C").start_generation(b"g3")
        before = _rows(client, "C", b"g3")
    done = cli(*argv, "--url", server.url)
    assert done.returncode == 1, done
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and message in done.stderr, done.stderr
    with Client(server.url) as client:
        assert _rows(client, "C", b"g3") == before


def test_manual_without_an_open_generation_says_so(server: LiveServer) -> None:
    _history(server)
    done = cli("revert", "C", "g1", "--url", server.url)
    assert done.returncode == 1 and "none is open" in done.stderr, done.stderr


def test_below_the_readers_minimum_is_collected(server: LiveServer) -> None:
    _history(server)
    with Client(server.url) as client:
        c = client.collection("C")
        c.create_reader("r", generation_id=b"g2")
        c.start_generation(b"g3")
        with pytest.raises(GenerationCollected):
            c.revert(b"g1", generation_id=b"g3")
    done = cli("revert", "C", "g1", "--generation", "g3", "--url", server.url)
    assert done.returncode == 1 and "generationCollected" in done.stderr, done.stderr


def test_help() -> None:
    done = cli("revert", "--help")
    assert done.returncode == 0 and "usage: diffstore revert" in done.stdout and "--generation" in done.stdout
