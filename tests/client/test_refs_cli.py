"""Refs from the clients and the command line against a real server: ``resolve_ref`` (sync and async) and
every option that takes a generation (``--generation``, ``--from``, ``--to``, lineage's GENERATION,
``watch --since``); a bad ref is one line naming the option, and changes nothing."""

from __future__ import annotations

import asyncio
import json

import pytest

from diffstore import ResolvedRef
from diffstore.client import AsyncClient, Client
from diffstore.errors import NoSuchGeneration, NoSuchReader
from tests.helpers import LiveServer

from .test_commands import cli, run


def _history(server: LiveServer) -> None:
    """C: g1 {a=1}, g2 {a=2, b=2}, g3 {b deleted}; D's reader r of C at g1; g4 open."""
    with Client(server.url) as client:
        c = client.create_collection("C")
        for g, items in (
            (b"g1", [(b"a", b"1")]),
            (b"g2", [(b"a", b"2"), (b"b", b"2")]),
            (b"g3", [(b"b", None)]),
        ):
            c.start_generation(g)
            c.put_many(items, generation_id=g)
            c.commit_generation(g)
        client.create_collection("D").create_reader("r", collection="C", generation_id=b"g1")
        c.start_generation(b"g4")


def test_clients_resolve_refs(server: LiveServer) -> None:
    _history(server)
    with Client(server.url) as client:
        c = client.collection("C")
        current = c.resolve_ref("@current")
        assert current.generation_id == b"g3" and current.committed_at_ms is not None
        assert c.resolve_ref("~2").generation_id == b"g1"
        assert c.resolve_ref("@open") == ResolvedRef(b"g4", None)
        assert c.resolve_ref("@reader:r").generation_id == b"g1"
        with pytest.raises(NoSuchReader):
            c.resolve_ref("@reader:D/nobody")

    async def from_async() -> None:
        async with AsyncClient(server.url) as client:
            collection = await client.collection("C")
            assert await collection.resolve_ref("@current") == current
            with pytest.raises(NoSuchGeneration):
                await collection.resolve_ref("~9")

    asyncio.run(from_async())


def test_options_take_refs(capsys: pytest.CaptureFixture[str], server: LiveServer) -> None:
    _history(server)
    assert run(capsys, server, "query", "C", "--generation", "~1") == (0, "a\t2\nb\t2\n", "")
    assert run(capsys, server, "query", "C", "--generation", "@reader:r") == (0, "a\t1\n", "")
    assert run(capsys, server, "get", "C", "a", "--generation", "~2") == (0, "1\n", "")
    assert run(capsys, server, "diff", "C", "--from", "@reader:D/r", "--to", "~1") == (
        0,
        "~ a\t1\t2\n+ b\t2\n",
        "",
    )
    assert run(capsys, server, "diff", "C", "--from", "~1", "--to", "@current")[1] == "- b\t2\n"
    code, out, _ = run(capsys, server, "lineage", "C", "~1", "--format", "json")
    assert (code, json.loads(out)["generationId"]) == (0, "g2")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["query", "C", "--generation", "@yesterday"], ["--generation @yesterday", "invalidRequest"]),
        (["query", "C", "--generation", "~9"], ["--generation ~9", "noSuchGeneration"]),
        (["get", "C", "a", "--generation", "@reader:nobody"], ["--generation", "noSuchReader"]),
        (["diff", "C", "--from", "@2026-11-25T10:00:00"], ["--from", "zone", "invalidRequest"]),
        (["diff", "C", "--from", "~1", "--to", "~x"], ["--to ~x", "invalidRequest"]),
        (["lineage", "C", "@nope"], ["GENERATION @nope", "invalidRequest"]),
    ],
)
def test_a_bad_ref_is_one_line_naming_the_option(
    server: LiveServer, argv: list[str], words: list[str]
) -> None:
    _history(server)
    with Client(server.url) as client:
        before = list(client.collection("C").query()), client.collection("D").readers()
    done = cli(*argv, "--url", server.url)
    assert done.returncode == 1 and done.stdout == "", done
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert all(word in done.stderr for word in words), done.stderr
    with Client(server.url) as client:
        assert (list(client.collection("C").query()), client.collection("D").readers()) == before
