"""The write commands against a real server: ``generation start|commit|abort``, ``put`` and ``delete``
(manual with ``--generation``, automatic without), ``readers create|move|rm`` and the confirmation of
``collections rm``. Every refused write is one line, and the stored data is unchanged."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from typing import Any

import pytest

from diffstore.client import Client
from diffstore.client.write_cli import next_generation_id

from .conftest import DEADLINE_S, LiveServer
from .test_commands import cli, run


def _state(server: LiveServer) -> list[Any]:
    """Everything a write could change: each collection's generations, open generation, data (the open
    generation's too) and readers."""
    out: list[Any] = []
    for info in server.store.collections():
        c = server.store.collection(info.name)
        current, open_one = c.generation_state()
        out += [info, current, open_one, list(c.query()), c.readers(), c.history(limit=100)]
        if open_one is not None:
            out.append(list(c.query(generation_id=open_one)))
    return out


def test_a_manual_collection_from_the_shell(capsys: pytest.CaptureFixture[str], server: LiveServer) -> None:
    assert run(capsys, server, "collections", "create", "m", "--manual")[0] == 0
    assert run(capsys, server, "generation", "start", "m", "g1") == (0, "started generation g1 of m\n", "")
    code, out, _ = run(capsys, server, "put", "m", "apple", "red", "--generation", "g1")
    assert (code, out) == (
        0,
        "put apple in m (generation g1; visible once 'diffstore generation commit m' commits it)\n",
    )
    assert run(capsys, server, "put", "m", "base64:AAE=", "base64:/w==", "--generation", "@open")[0] == 0
    assert run(capsys, server, "query", "m") == (0, "", "")  # not committed yet
    code, out, _ = run(
        capsys, server, "generation", "commit", "m", "--metadata", "job=shell", "--metadata", "by=me=x"
    )
    assert (code, out) == (0, "committed generation g1 of m\n")
    assert run(capsys, server, "query", "m") == (0, "base64:AAE=\tbase64:/w==\napple\tred\n", "")
    info = server.store.collection("m").history(limit=1)[0][0]
    assert info.metadata == {"job": "shell", "by": "me=x"} and info.changed_keys == 2
    # delete, then abort: nothing of g2 remains
    assert run(capsys, server, "generation", "start", "m", "g2")[0] == 0
    code, out, _ = run(capsys, server, "delete", "m", "apple", "--generation", "g2", "--format", "json")
    assert json.loads(out) == {"key": "apple", "generationId": "g2", "committed": False}
    assert run(capsys, server, "generation", "abort", "m") == (0, "aborted generation g2 of m\n", "")
    assert server.store.collection("m").generation_state() == (b"g1", None)
    assert run(capsys, server, "get", "m", "apple")[1] == "red\n"
    # a delete that commits
    assert run(capsys, server, "generation", "start", "m", "g3")[0] == 0
    assert run(capsys, server, "delete", "m", "apple", "--generation", "g3")[0] == 0
    assert run(capsys, server, "generation", "commit", "m", "g3", "--format", "json")[1] == (
        '{"collection":"m","committed":"g3","metadata":null}\n'
    )
    assert server.store.collection("m").get(b"apple") is None


def test_an_automatic_collection_commits_each_write(
    capsys: pytest.CaptureFixture[str], server: LiveServer
) -> None:
    assert run(capsys, server, "collections", "create", "a", "--auto")[0] == 0
    code, out, _ = run(capsys, server, "put", "a", "k", "v", "--format", "json")
    put = json.loads(out)
    assert code == 0 and put["committed"] is True
    assert server.store.collection("a").generation_id >= shell_bytes(put["generationId"])
    code, out, _ = run(capsys, server, "delete", "a", "k")
    assert code == 0 and out.startswith("deleted k in a (generation ")
    assert server.store.collection("a").get(b"k") is None  # committed when the command returned


def test_generation_start_without_g_counts_on_from_the_current_id(
    capsys: pytest.CaptureFixture[str], server: LiveServer
) -> None:
    assert run(capsys, server, "collections", "create", "n", "--manual")[0] == 0
    # from the empty start: 8 bytes, the shape automatic collections use
    assert run(capsys, server, "generation", "start", "n") == (
        0,
        "started generation base64:AAAAAAAAAAE= of n\n",
        "",
    )
    assert run(capsys, server, "generation", "commit", "n")[0] == 0
    assert (
        run(capsys, server, "generation", "start", "n")[1] == "started generation base64:AAAAAAAAAAI= of n\n"
    )
    assert run(capsys, server, "generation", "abort", "n")[0] == 0
    # after the writer's own ids: the same length, one more
    assert run(capsys, server, "generation", "start", "n", "g1")[0] == 0
    assert run(capsys, server, "generation", "commit", "n")[0] == 0
    assert run(capsys, server, "generation", "start", "n")[1] == "started generation g2 of n\n"
    assert server.store.collection("n").generation_state() == (b"g1", b"g2")


def test_generation_start_without_g_refuses_while_one_is_open(server: LiveServer) -> None:
    _manual_with_open(server)
    before = _state(server)
    done = cli("generation", "start", "m", "--url", server.url)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert _state(server) == before


@pytest.mark.parametrize(
    ("current", "following"),
    [
        (b"", b"\x00" * 7 + b"\x01"),
        (b"g1", b"g2"),
        (b"\x00\xff", b"\x01\x00"),
        (b"\xff\xff", b"\xff\xff\x00"),
    ],
)
def test_next_generation_id_is_the_least_id_above(current: bytes, following: bytes) -> None:
    assert next_generation_id(current) == following and following > current


def shell_bytes(text: str) -> bytes:
    from diffstore import shell

    return shell.parse(text)


def test_readers_create_move_rm(capsys: pytest.CaptureFixture[str], server: LiveServer) -> None:
    with Client(server.url) as client:
        src = client.create_collection("src")
        for g in (b"s1", b"s2"):
            src.start_generation(g)
            src.commit_generation(g)
        client.create_collection("dst")
    assert run(capsys, server, "readers", "create", "dst", "from_src", "--target", "src") == (
        0,
        "created reader from_src\tsrc\t-\n",
        "",
    )
    assert run(capsys, server, "readers", "create", "dst", "self", "--generation", "@current")[1] == (
        "created reader self\tdst\t-\n"  # dst's current generation is "", the beginning
    )
    assert (
        run(capsys, server, "readers", "move", "dst", "from_src", "~1")[1]
        == "moved reader from_src\tsrc\ts1\n"
    )
    code, out, _ = run(
        capsys, server, "readers", "move", "dst", "from_src", "@current", "--expect", "s1", "--format", "json"
    )
    assert json.loads(out) == {"name": "from_src", "collection": "src", "generationId": "s2"}
    assert (
        run(capsys, server, "readers", "ls", "dst", "--no-headers")[1] == "from_src\tsrc\ts2\nself\tdst\t-\n"
    )
    assert run(capsys, server, "readers", "rm", "dst", "from_src") == (0, "removed reader from_src\n", "")
    assert [r.name for r in server.store.collection("dst").readers()] == ["self"]


def _manual_with_open(server: LiveServer) -> None:
    with Client(server.url) as client:
        m = client.create_collection("m")
        m.start_generation(b"g1")
        m.put(b"k", b"v", generation_id=b"g1")
        m.commit_generation(b"g1")
        m.start_generation(b"g2")
        m.put(b"k", b"w", generation_id=b"g2")
        client.create_collection("a", manual=False)
        m.create_reader("r", collection="m", generation_id=b"g1")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["put", "m", "k", "x"], ["diffstore put: collection m is manual", "--generation", "(notAutomatic)"]),
        (["delete", "m", "k"], ["collection m is manual", "(notAutomatic)"]),
        (["put", "m", "k", "x", "--generation", "g9"], ["generationMismatch"]),
        (["put", "m", "k", "x", "--generation", "@nope"], ["--generation @nope", "invalidRequest"]),
        (["delete", "m", "k", "--generation", "g1"], ["generationMismatch"]),
        (["delete", "nosuch", "k"], ["noSuchCollection"]),
        (["generation", "start", "m", "g0"], ["outdatedGeneration"]),
        (
            ["generation", "start", "m", "g09"],
            ["not above the current generation g1", "zero-pad", "outdatedGeneration"],
        ),
        (["generation", "start", "a", "x"], ["notManual"]),
        (["generation", "commit", "m", "g9"], ["generationMismatch"]),
        (["generation", "commit", "m", "--metadata", "big=" + "x" * 5000], ["invalidRequest", "4096"]),
        (["generation", "abort", "m", "g1"], ["generationMismatch"]),
        (["generation", "abort", "a"], ["notManual"]),
        (["readers", "create", "m", "r", "--generation", "g2"], ["readerExists"]),
        (
            ["readers", "create", "m", "x", "--target", "nosuch", "--generation", "~1"],
            ["nosuch", "noSuchCollection"],
        ),
        (["readers", "move", "m", "r", "@current", "--expect", "g9"], ["is at g1, expected g9 (badVersion)"]),
        (["readers", "create", "m", "x", "--target", "TYPO"], ["reader target 'TYPO'", "noSuchCollection"]),
        (["readers", "create", "m", "x", "--generation", "zz"], ["generation zz", "noSuchGeneration"]),
        (["readers", "move", "m", "nobody", "@current"], ["diffstore readers move:", "noSuchReader"]),
        (["readers", "move", "m", "r", "~5"], ["G ~5", "noSuchGeneration"]),
        (["readers", "rm", "m", "nobody"], ["noSuchReader"]),
        (["collections", "rm", "m"], ["stdin is not a terminal", "--yes", "invalidRequest"]),
        (["collections", "rm", "nosuch"], ["noSuchCollection"]),
    ],
)
def test_refused_writes_are_one_line_and_change_nothing(
    server: LiveServer, argv: list[str], words: list[str]
) -> None:
    _manual_with_open(server)
    before = _state(server)
    done = cli(*argv, "--url", server.url)
    assert done.returncode == 1 and done.stdout == "", done
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert all(word in done.stderr for word in words), done.stderr
    assert _state(server) == before


@pytest.mark.parametrize(
    "argv",
    [
        ["generation", "commit", "m", "--metadata", "novalue"],
        ["generation", "start"],
        ["readers", "move", "m", "r"],
        ["put", "m", "k"],
    ],
)
def test_bad_arguments_are_usage_errors(server: LiveServer, argv: list[str]) -> None:
    _manual_with_open(server)
    before = _state(server)
    done = cli(*argv, "--url", server.url)
    assert done.returncode == 2 and "usage: diffstore" in done.stderr
    assert _state(server) == before


@pytest.mark.parametrize(
    "command",
    [
        ["generation", "start"],
        ["generation", "commit"],
        ["delete"],
        ["readers", "move"],
        ["readers", "create"],
        ["readers", "rm"],
        ["collections", "rm"],
    ],
)
def test_every_write_command_has_help(command: list[str]) -> None:
    done = cli(*command, "--help")
    assert done.returncode == 0 and done.stdout.startswith("usage: diffstore " + " ".join(command))


def _rm_on_a_terminal(server: LiveServer, answer: bytes, *flags: str) -> subprocess.CompletedProcess[bytes]:
    """``collections rm m`` with a pseudo-terminal as stdin, answering ``answer`` to its question."""
    controller, terminal = pty.openpty()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "diffstore", "collections", "rm", "m", *flags, "--url", server.url],
            stdin=terminal,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        os.write(controller, answer)
        out, err = process.communicate(timeout=DEADLINE_S * 3)
    finally:
        os.close(controller)
        os.close(terminal)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def test_collections_rm_asks_on_a_terminal(server: LiveServer) -> None:
    _manual_with_open(server)
    before = _state(server)
    done = _rm_on_a_terminal(server, b"n\n")
    assert done.returncode == 1 and b"remove collection m (current generation g1)" in done.stdout
    assert b"not confirmed" in done.stderr and done.stderr.count(b"\n") == 1
    assert _state(server) == before
    done = _rm_on_a_terminal(server, b"y\n")
    assert done.returncode == 0 and b"removed collection m" in done.stdout, done
    assert [info.name for info in server.store.collections()] == ["a"]


def test_collections_rm_yes_asks_nothing(server: LiveServer) -> None:
    _manual_with_open(server)
    done = cli("collections", "rm", "m", "--yes", "--url", server.url)
    assert (done.returncode, done.stdout, done.stderr) == (0, "removed collection m\n", "")
    assert [info.name for info in server.store.collections()] == ["a"]
