"""``diffstore lineage`` against a real server: the tree in text and JSON, the text form of ids, failures."""

from __future__ import annotations

import json

import pytest

from diffstore import shell
from diffstore.client import Client
from diffstore.engine.types import ReaderUpdate
from tests.helpers import LiveServer

from .test_commands import cli, run

STREAM = "hstream://events"
SHARD = "hstream/sub/0"
P1 = (20).to_bytes(8, "big") + bytes(4)
P2 = (40).to_bytes(8, "big") + bytes(4)


def _pipeline(server: LiveServer) -> None:
    with Client(server.url) as client:
        a = client.create_collection("A")
        b = client.create_collection("B")
        c = client.create_collection("C")
        a.create_reader(SHARD, collection=STREAM)
        a.create_reader("keep")
        c.create_reader("from_a", collection="A")
        c.create_reader("from_b", collection="B")
        for g, position in ((b"a1", P1), (b"a2", P2)):
            a.start_generation(g)
            a.commit_generation(g, [(SHARD, position)])
        b.start_generation(b"b1")
        b.commit_generation(b"b1")
        c.start_generation(b"c1")
        c.commit_generation(b"c1", [ReaderUpdate("from_a", b"a1"), ReaderUpdate("from_b", b"b1")])
        c.start_generation(b"c2")
        c.commit_generation(b"c2", [ReaderUpdate("from_a", b"a2"), ReaderUpdate("from_b", b"b1")])


def test_lineage_text_tree(capsys: pytest.CaptureFixture[str], server: LiveServer) -> None:
    _pipeline(server)
    assert run(capsys, server, "lineage", "C", "c2") == (
        0,
        "C c2\n  from_a\tA\ta1 -> a2\n  from_b\tB\tb1 -> b1\n",
        "",
    )
    code, out, err = run(capsys, server, "lineage", "C", "--depth", "3")  # the current generation: c2
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "C c2",
        "  from_a\tA\ta1 -> a2",
        f"    {SHARD}\t{STREAM}\t{shell.show(P1)} -> {shell.show(P2)}",
        "  from_b\tB\tb1 -> b1",
    ]
    assert shell.show(P1).startswith("base64:")
    # a position printed by the command is accepted back as a GENERATION
    code, out, _ = run(capsys, server, "lineage", "A", shell.show(b"a2"), "--format", "json")
    assert code == 0
    assert json.loads(out) == {
        "collection": "A",
        "generationId": "a2",
        "sources": [
            {
                "readerName": SHARD,
                "collectionName": None,
                "target": STREAM,
                "fromGenerationId": shell.show(P1),
                "toGenerationId": shell.show(P2),
            }
        ],
    }


def test_lineage_json_walk(capsys: pytest.CaptureFixture[str], server: LiveServer) -> None:
    _pipeline(server)
    code, out, _ = run(capsys, server, "lineage", "C", "c1", "--depth", "2", "--format", "json")
    assert code == 0
    answer = json.loads(out)
    assert answer["sources"][0]["sources"] == [
        {
            "readerName": SHARD,
            "collectionName": None,
            "target": STREAM,
            "fromGenerationId": None,
            "toGenerationId": shell.show(P1),
        }
    ]
    assert answer["sources"][1]["sources"] == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["lineage", "C", "c9"], "invalidRequest"),
        (["lineage", "nope", "x"], "noSuchCollection"),
        (["lineage", "C", "base64:*"], "invalidEncoding"),
    ],
)
def test_lineage_failures_are_one_line(server: LiveServer, argv: list[str], message: str) -> None:
    _pipeline(server)
    done = cli(*argv, "--url", server.url)
    assert done.returncode == 1, done
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and message in done.stderr, done.stderr


@pytest.mark.parametrize("depth", ["0", "11"])
def test_bad_depth_is_a_usage_error(server: LiveServer, depth: str) -> None:
    done = cli("lineage", "C", "c1", "--depth", depth, "--url", server.url)
    assert done.returncode == 2 and "usage: diffstore lineage" in done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith("argument --depth: must be within 1..10")
