"""The data commands (collections, get, put, query, diff, readers) against a real server.

Most run ``diffstore.cli.main`` in this process (the server runs in a thread); the failures a newcomer
meets (a server that is down, a wrong token, a bad flag) also run as real subprocesses, which must print
one line and no traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diffstore import shell
from diffstore.cli import main
from diffstore.errors import InvalidEncoding
from tests.helpers import LiveServer, running_server

from .conftest import DEADLINE_S


def run(capsys: pytest.CaptureFixture[str], server: LiveServer, *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "--url", server.url])
    out, err = capsys.readouterr()
    return code, out, err


def cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "diffstore", *argv],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S * 3,
        env=env,
    )


def test_text_form_round_trips() -> None:
    for data in (b"", b"orders", "ünï".encode(), b"\x00\x01", b"a\tb", b"base64:x", b"\xff"):
        assert shell.parse(shell.show(data)) == data
    assert shell.show(b"orders-1") == "orders-1"
    assert shell.show(b"\x00\x00\x00\x01") == "base64:AAAAAQ=="
    assert shell.show(b"base64:x") == "base64:YmFzZTY0Ong="
    with pytest.raises(InvalidEncoding):
        shell.parse("base64:*")


def test_collections_ls_create_show_rm(capsys: pytest.CaptureFixture[str], server: LiveServer) -> None:
    assert run(capsys, server, "collections", "create", "orders", "--auto") == (
        0,
        "created collection orders (auto)\n",
        "",
    )
    assert run(capsys, server, "collections", "create", "m", "--manual")[0] == 0
    assert run(capsys, server, "collections", "ls") == (0, "m\tmanual\norders\tauto\n", "")
    code, out, _ = run(capsys, server, "collections", "ls", "--format", "json")
    assert json.loads(out) == {
        "collections": [{"name": "m", "manual": True}, {"name": "orders", "manual": False}]
    }
    code, out, _ = run(capsys, server, "collections", "show", "m", "--format", "json")
    assert code == 0 and json.loads(out)["manual"] is True
    code, out, _ = run(capsys, server, "collections", "show", "orders")
    assert code == 0 and out.splitlines()[:3] == ["FIELD\tVALUE", "name\torders", "mode\tauto"]
    code, out, _ = run(capsys, server, "collections", "show", "orders", "--no-headers")
    assert code == 0 and out.splitlines()[:2] == ["name\torders", "mode\tauto"]
    assert run(capsys, server, "collections", "rm", "m", "--yes") == (0, "removed collection m\n", "")
    assert [info.name for info in server.store.collections()] == ["orders"]


def test_collections_create_asks_which_kind(capsys: pytest.CaptureFixture[str], server: LiveServer) -> None:
    """The shell has no default kind (the Python API's is manual, the HTTP API requires isManual)."""
    with pytest.raises(SystemExit) as exited:
        run(capsys, server, "collections", "create", "c")
    assert exited.value.code == 2
    assert "one of the arguments --manual --auto is required" in capsys.readouterr().err
    assert server.store.collections() == []
    with pytest.raises(SystemExit):
        run(capsys, server, "collections", "create", "c", "--manual", "--auto")
    assert server.store.collections() == []


def test_every_python_front_defaults_to_manual() -> None:
    import inspect

    from diffstore import Store
    from diffstore.client import AsyncClient, Client

    for front in (Store, Client, AsyncClient):
        assert inspect.signature(front.create_collection).parameters["manual"].default is True, front


def test_put_get_query_diff_and_generation_ids_round_trip(
    capsys: pytest.CaptureFixture[str], server: LiveServer
) -> None:
    assert run(capsys, server, "collections", "create", "c", "--auto")[0] == 0
    code, out, _ = run(capsys, server, "put", "c", "k1", "one", "--format", "json")
    assert code == 0
    first = json.loads(out)["generationId"]
    assert shell.parse(first) == server.store.collection("c").generation_id
    assert run(capsys, server, "put", "c", "base64:AAE=", "base64:/w==")[0] == 0
    assert run(capsys, server, "put", "c", "k1", "uno")[0] == 0
    assert run(capsys, server, "get", "c", "k1") == (0, "uno\n", "")
    # the generation id printed by put is accepted back as it is
    assert run(capsys, server, "get", "c", "k1", "--generation", first) == (0, "one\n", "")
    code, out, _ = run(capsys, server, "get", "c", "base64:AAE=", "--format", "json")
    assert code == 0 and json.loads(out)["value"] == "base64:/w=="
    assert run(capsys, server, "query", "c") == (0, "base64:AAE=\tbase64:/w==\nk1\tuno\n", "")
    assert run(capsys, server, "query", "c", "--from-key", "k", "--format", "json") == (
        0,
        '{"key":"k1","value":"uno"}\n',
        "",
    )
    assert run(capsys, server, "query", "c", "--limit", "1")[1] == "base64:AAE=\tbase64:/w==\n"
    assert run(capsys, server, "query", "c", "--generation", first)[1] == "k1\tone\n"
    assert run(capsys, server, "diff", "c", "--from", first) == (
        0,
        "+ base64:AAE=\tbase64:/w==\n~ k1\tone\tuno\n",
        "",
    )
    code, out, _ = run(capsys, server, "diff", "c", "--to", first, "--format", "json")
    assert json.loads(out) == {"key": "k1", "fromValue": None, "toValue": "one"}


def test_get_of_an_absent_key_exits_1(capsys: pytest.CaptureFixture[str], server: LiveServer) -> None:
    server.store.create_collection("c", manual=False)
    code, out, err = run(capsys, server, "get", "c", "nope")
    assert (code, out) == (1, "")
    assert err.startswith("diffstore get: no key nope in c at generation ")


def test_readers_ls_and_diff_from_reader(capsys: pytest.CaptureFixture[str], server: LiveServer) -> None:
    assert run(capsys, server, "collections", "create", "c", "--auto")[0] == 0
    code, out, _ = run(capsys, server, "put", "c", "a", "1", "--format", "json")
    first = shell.parse(json.loads(out)["generationId"])
    with server.client() as client:
        client.collection("c").create_reader("indexer", generation_id=first)
    assert run(capsys, server, "put", "c", "b", "2")[0] == 0  # waits for its generation to commit
    row = f"indexer\tc\t{shell.show(first)}\n"
    assert run(capsys, server, "readers", "ls", "c") == (0, "NAME\tTARGET\tGENERATION\n" + row, "")
    assert run(capsys, server, "readers", "ls", "c", "--no-headers") == (0, row, "")
    assert run(capsys, server, "--no-headers", "readers", "ls", "c") == (0, row, "")
    code, out, _ = run(capsys, server, "readers", "ls", "c", "--format", "json")
    assert json.loads(out) == {"name": "indexer", "collection": "c", "generationId": shell.show(first)}
    assert run(capsys, server, "diff", "c", "--from-reader", "indexer") == (0, "+ b\t2\n", "")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (("get", "nosuch", "k"), "diffstore get: no collection named 'nosuch' (noSuchCollection)\n"),
        (("collections", "rm", "nosuch"), "diffstore collections rm: no collection named 'nosuch'"),
        (("collections", "create", "c", "--auto"), "(collectionExists)"),
        (("put", "m", "k", "v"), "diffstore put: collection m is manual"),
        (("diff", "c", "--from-reader", "nobody"), "(noSuchReader)"),
        (("get", "c", "base64:*"), "(invalidEncoding)"),
    ],
)
def test_failures_are_one_line_and_change_nothing(
    capsys: pytest.CaptureFixture[str], server: LiveServer, argv: tuple[str, ...], expected: str
) -> None:
    server.store.create_collection("c", manual=False)
    server.store.create_collection("m", manual=True)
    code, out, err = run(capsys, server, *argv)
    assert code == 1 and out == ""
    assert expected in err and err.count("\n") == 1
    assert [info.name for info in server.store.collections()] == ["c", "m"]
    assert list(server.store.collection("m").query()) == []


def test_server_down_is_one_line(tmp_path: Path) -> None:
    with running_server(tmp_path / "data") as server:
        url = server.url
    done = cli("collections", "ls", "--url", url)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith(f"diffstore collections ls: cannot reach a diffstore server at {url}")
    assert "DIFFSTORE_URL" in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1


def test_token_from_flag_or_environment_and_a_wrong_one(tmp_path: Path) -> None:
    with running_server(tmp_path / "data", token="s3cret") as server:
        server.store.create_collection("c", manual=False)
        wrong = cli("get", "c", "k", "--url", server.url, "--token", "nope")
        assert wrong.returncode == 1 and wrong.stdout == ""
        assert "(unauthorized)" in wrong.stderr and "--token or DIFFSTORE_TOKEN" in wrong.stderr
        # the error's one line, after the one warning that a token on the command line is readable by all
        assert "Traceback" not in wrong.stderr and wrong.stderr.count("\n") == 2
        assert "warning: --token can be read by every user" in wrong.stderr.splitlines()[0]
        missing = cli("collections", "ls", "--url", server.url)
        assert missing.returncode == 1 and "(unauthorized)" in missing.stderr
        done = cli("put", "c", "k", "v", "--url", server.url, "--token", "s3cret")
        assert done.returncode == 0, done.stderr
        env = {**os.environ, "DIFFSTORE_URL": server.url, "DIFFSTORE_TOKEN": "s3cret"}
        assert cli("get", "c", "k", env=env).stdout == "v\n"


def test_version_module_entry_and_bad_flag_usage() -> None:
    version = cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("diffstore ")
    bad = cli("query", "c", "--limt", "3")
    assert bad.returncode == 2
    assert bad.stderr.startswith("usage: diffstore query ") and "Traceback" not in bad.stderr
    helped = cli("diff", "--help")
    assert helped.returncode == 0 and "--from-reader" in helped.stdout and "--token" in helped.stdout
