"""Retention from the command line: ``collections create --keep/--keep-generations``,
``collections retention``, ``collections show``, ``serve --default-keep``; and in the clients."""

from __future__ import annotations

import argparse
import json

import pytest

from diffstore.client import AsyncClient, Client
from diffstore.client.retention_cli import duration_ms, show_duration
from diffstore.engine.types import RetentionPolicy
from diffstore.server.cli import add_commands as add_serve
from diffstore.server.cli import default_retention
from tests.engine.util import raw_state
from tests.helpers import LiveServer

from .test_commands import cli, run


def test_durations_read_and_print_like_a_person() -> None:
    assert duration_ms("7d") == 7 * 86_400_000
    assert duration_ms("1d12h") == 36 * 3_600_000
    assert duration_ms("500ms") == 500
    assert duration_ms("2W") == 14 * 86_400_000
    for bad in ("", "7", "d", "7days", "-1d", "0s", "1.5h", "7d x"):
        with pytest.raises(argparse.ArgumentTypeError):
            duration_ms(bad)
    assert [show_duration(ms) for ms in (604_800_000, 36 * 3_600_000, 90_000, 1_500)] == [
        "1w",
        "36h",
        "90s",
        "1500ms",
    ]


def test_create_with_a_policy_then_show_change_and_remove_it(
    capsys: pytest.CaptureFixture[str], server: LiveServer
) -> None:
    code, out, err = run(
        capsys, server, "collections", "create", "c", "--manual", "--keep", "7d", "--keep-generations", "100"
    )
    assert (code, err) == (0, "")
    assert server.store.collection("c").retention() == RetentionPolicy(7 * 86_400_000, 100)
    code, out, _ = run(capsys, server, "collections", "show", "c")
    assert code == 0 and "retention\tkeep 1w, keep 100 generations" in out.splitlines()
    code, out, _ = run(capsys, server, "collections", "show", "c", "--format", "json")
    assert json.loads(out)["retention"] == {"keepMs": 604_800_000, "keepGenerations": 100}
    assert run(capsys, server, "collections", "retention", "c") == (
        0,
        "retention of c: keep 1w, keep 100 generations\n",
        "",
    )
    assert run(capsys, server, "collections", "retention", "c", "--keep-generations", "1") == (
        0,
        "retention of c: now keep 1 generation\n",
        "",
    )
    assert server.store.collection("c").retention() == RetentionPolicy(keep_generations=1)
    code, out, _ = run(capsys, server, "collections", "retention", "c", "--no-retention", "--format", "json")
    assert code == 0 and json.loads(out) == {"name": "c", "retention": {}}
    assert server.store.collection("c").retention() is None
    code, out, _ = run(capsys, server, "collections", "show", "c")
    assert "retention\tnone (readers alone decide what GC collects)" in out.splitlines()


def test_bad_retention_options_are_refused_and_change_nothing(
    capsys: pytest.CaptureFixture[str], server: LiveServer
) -> None:
    server.store.create_collection("c", manual=True, retention=RetentionPolicy(keep_generations=5))
    before = raw_state(server.store)
    for argv in (["--keep", "7 days"], ["--keep-generations", "0"], ["--keep-generations", "x"]):
        with pytest.raises(SystemExit) as exited:
            run(capsys, server, "collections", "retention", "c", *argv)
        assert exited.value.code == 2
        assert "argument --keep" in capsys.readouterr().err
    code, _, err = run(capsys, server, "collections", "retention", "c", "--no-retention", "--keep", "1d")
    assert code != 0 and "--no-retention goes alone" in err
    code, _, err = run(capsys, server, "collections", "retention", "nope", "--keep", "1d")
    assert code != 0 and "nope" in err
    assert raw_state(server.store) == before


def test_every_new_option_has_help() -> None:
    for argv, flag in (
        (["collections", "retention", "--help"], "--keep-generations N"),
        (["collections", "create", "--help"], "--no-retention"),
        (["serve", "--help"], "--default-keep-generations N"),
    ):
        done = cli(*argv)
        assert done.returncode == 0, done.stderr
        assert flag in done.stdout


def test_serve_default_retention_options() -> None:
    parser = argparse.ArgumentParser()
    add_serve(parser.add_subparsers())
    args = parser.parse_args(["serve", "--default-keep", "30d", "--default-keep-generations", "10"])
    assert default_retention(args) == RetentionPolicy(30 * 86_400_000, 10)
    assert default_retention(parser.parse_args(["serve"])) is None


def test_both_clients_set_and_read_the_policy(server: LiveServer) -> None:
    with Client(server.url) as client:
        c = client.create_collection("c", retention=RetentionPolicy(keep_ms=5_000))
        assert c.retention() == RetentionPolicy(keep_ms=5_000)
        assert client.collection("c").state().retention == RetentionPolicy(keep_ms=5_000)
        assert c.set_retention(RetentionPolicy(keep_generations=3)) == RetentionPolicy(keep_generations=3)
        assert c.set_retention(None) is None

    async def from_async() -> None:
        async with AsyncClient(server.url) as client:
            c = await client.create_collection("d", retention=RetentionPolicy(keep_generations=2))
            assert await c.retention() == RetentionPolicy(keep_generations=2)
            assert await c.set_retention(RetentionPolicy()) is None

    import asyncio

    asyncio.run(from_async())
    assert server.store.collection("d").retention() is None


def test_diff_to_open_prints_the_pending_changes(
    capsys: pytest.CaptureFixture[str], server: LiveServer
) -> None:
    with Client(server.url) as client:
        c = client.create_collection("P")
        c.start_generation(b"p1")
        c.put_many([(b"tea", b"3"), (b"coffee", b"5")], generation_id=b"p1")
        c.commit_generation(b"p1")
        c.start_generation(b"p2")
        c.put_many([(b"tea", b"4"), (b"coffee", None), (b"milk", b"1")], generation_id=b"p2")
    assert run(capsys, server, "diff", "P", "--from", "p1", "--to", "@open") == (
        0,
        "- coffee\t5\n+ milk\t1\n~ tea\t3\t4\n",
        "",
    )
    assert run(capsys, server, "diff", "P", "--to", "@open") == (0, "+ milk\t1\n+ tea\t4\n", "")
    assert run(capsys, server, "diff", "P", "--from", "@current", "--to", "@open", "--stat") == (
        0,
        "1 inserted, 1 updated, 1 deleted\n",
        "",
    )
