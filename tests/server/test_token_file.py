"""The token file: its format, re-reading it while the server runs (change, SIGHUP), a bad file keeping the
old tokens, revoking, and rotating a secret while clients hammer the server."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from diffstore.errors import InvalidRequest
from diffstore.server import ServerConfig
from diffstore.server.scopes import Token, TokenFileError, TokenScope, TokenTable, parse_token_file
from diffstore.server.tokens import Tokens
from tests.helpers import close_pipes, free_port, wait_until
from tests.server.conftest import Live, live_server

SECRET = "s3cr3t-value-that-must-never-leak"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"app {SECRET}\n", "line 1: expected NAME SECRET SCOPE [COLLECTIONS-GLOB], got 2 fields"),
        (f"app {SECRET} write * extra\n", "got 5 fields"),
        (f"# c\n\napp {SECRET} owner\n", "line 3 (app): the scope must be read, write or admin, not 'owner'"),
        (f"app {SECRET} read orders-*\n", "line 1 (app): a read token reads every collection"),
        (f"-app {SECRET} read\n", "line 1: a name is 1..64 of"),
        (f"a {SECRET} read\nb {SECRET} write\n", "line 2 (b): the secret is already that of line 1"),
        (f"a {SECRET} read\na {SECRET}2 write\n", "line 2 (a): the name is on line 1 with another scope"),
        (f"token {SECRET} admin\n", "line 1 (token): the name 'token' is taken by --token"),
        ("# only comments\n\n", "no token in the file"),
    ],
)
def test_a_bad_file_is_refused_naming_the_line_never_the_secret(text: str, message: str) -> None:
    with pytest.raises(TokenFileError) as caught:
        parse_token_file(text, frozenset({"token"}))
    assert message in str(caught.value)
    assert SECRET not in str(caught.value)


def test_lines_comments_globs_and_two_secrets_of_one_name() -> None:
    tokens = parse_token_file(
        "# who  secret  scope  glob\n"
        "viewer v-secret read   # the console\n"
        "\n"
        "etl e-secret-old write orders-*\n"
        "etl e-secret-new write orders-*\n"
        "ops o-secret admin\n"
    )
    assert [(t.name, t.scope, t.glob) for t in tokens] == [
        ("viewer", TokenScope.READ, "*"),
        ("etl", TokenScope.WRITE, "orders-*"),
        ("etl", TokenScope.WRITE, "orders-*"),
        ("ops", TokenScope.ADMIN, "*"),
    ]
    table = TokenTable(tokens)
    assert table.find(b"e-secret-old") is tokens[1] and table.find(b"e-secret-new") is tokens[2]
    assert table.find(b"e-secret") is None and table.find(b"") is None
    assert "secret" not in repr(tokens[1])


def test_what_each_scope_may() -> None:
    etl = Token("etl", b"x", TokenScope.WRITE, "orders-*")
    assert etl.may(TokenScope.READ, "anything") and etl.may(TokenScope.READ, None)
    assert etl.may(TokenScope.WRITE, "orders-1") and not etl.may(TokenScope.WRITE, "Orders-1")
    assert not etl.may(TokenScope.WRITE, None) and not etl.may(TokenScope.ADMIN, "orders-1")
    ops = Token("ops", b"y", TokenScope.ADMIN)
    assert ops.may(TokenScope.ADMIN, None) and ops.may(TokenScope.WRITE, "any")
    team = Token("team", b"z", TokenScope.ADMIN, "team-*")
    assert team.may(TokenScope.ADMIN, "team-a") and not team.may(TokenScope.ADMIN, None)


def test_a_changed_file_is_taken_and_a_bad_one_keeps_the_tokens(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "tokens"
    path.write_text("a a-secret read\n")
    tokens = Tokens(None, str(path))
    assert tokens.check() is False  # unchanged
    replace(path, "a a-secret read\nb b-secret write\n")
    assert tokens.check() is True and tokens.table.find(b"b-secret") is not None
    caplog.set_level(logging.INFO, "diffstore.server.tokens")
    replace(path, f"a a-secret read\nb {SECRET} sudo\n")
    assert tokens.check() is False and tokens.check() is False and tokens.check() is False
    refusals = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(refusals) == 1  # one line per version of the file, not one a look
    assert "line 2 (b)" in refusals[0].getMessage() and SECRET not in caplog.text
    assert tokens.table.find(b"b-secret") is not None  # the old tokens stay
    path.unlink()
    assert tokens.check() is False and tokens.table.find(b"a-secret") is not None
    replace(path, "c c-secret admin\n")
    assert tokens.check() is True
    assert tokens.table.find(b"a-secret") is None and tokens.table.find(b"c-secret") is not None


def test_a_bad_file_at_the_start_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="--token-file .*: No such file"):
        Tokens(None, str(tmp_path / "missing"))
    (tmp_path / "bad").write_text(f"x {SECRET}\n")
    with pytest.raises(InvalidRequest) as caught:
        Tokens(None, str(tmp_path / "bad"))
    assert "line 1" in caught.value.reason and SECRET not in caught.value.reason


def replace(path: Path, text: str) -> None:
    """Replaces the file in one step, as the guide says to (a reader never sees half of it)."""
    fresh = path.with_name(path.name + ".new")
    fresh.write_text(text)
    os.replace(fresh, path)


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[tuple[Live, Path]]:
    path = tmp_path / "tokens"
    path.write_text("app app-secret-1 write\nops ops-secret admin\n")
    config = ServerConfig(token_file=str(path), token_poll_s=0.05)
    with live_server(tmp_path / "data", config) as live:
        live.store.create_collection("c", manual=False)
        yield live, path


def status(live: Live, secret: str) -> int:
    put = {"item": {"key": {"value": "k"}, "value": {"value": "v"}}}
    return live.call(
        "POST", "/collections/c/put", put, headers={"authorization": f"Bearer {secret}"}
    ).status_code


def test_a_revoked_token_is_refused_without_a_restart(watched: tuple[Live, Path]) -> None:
    live, path = watched
    assert status(live, "app-secret-1") == 200
    replace(path, "ops ops-secret admin\n")
    wait_until(lambda: status(live, "app-secret-1") == 401, what="the revoked token to be refused")
    assert status(live, "ops-secret") == 200
    replace(path, "ops ops-secret admin\napp app-secret-1 read\n")  # back, as a reader only
    wait_until(lambda: status(live, "app-secret-1") == 403, what="the token to come back as a reader")


def test_rotation_while_clients_run_refuses_no_valid_token(watched: tuple[Live, Path]) -> None:
    """Two threads write and read all along, each with the secret that is valid when it sends; the
    secret is rotated in two steps: add the new one (same name), move the clients, remove the old."""
    live, path = watched
    tokens = live.app.state.tokens
    current = ["app-secret-1"]
    stop = threading.Event()
    refused: list[tuple[str, int, str]] = []
    sent_with: list[set[str]] = [set(), set()]
    done = [0, 0]

    def client(number: int) -> None:
        put = {"item": {"key": {"value": f"k{number}"}, "value": {"value": "v"}}}
        get = {"key": {"value": f"k{number}"}}
        with httpx.Client(base_url=live.url, timeout=60) as http:
            while not stop.is_set():
                secret = current[0]
                headers = {"authorization": f"Bearer {secret}"}
                for path_, body in (("/collections/c/put", put), ("/collections/c/get", get)):
                    answer = http.post(path_, json=body, headers=headers)
                    if answer.status_code != 200:
                        refused.append((secret, answer.status_code, answer.text))
                sent_with[number].add(secret)
                done[number] += 1

    threads = [threading.Thread(target=client, args=(n,)) for n in (0, 1)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: min(done) >= 20, what="both clients to run")
        taken = tokens.reloads
        replace(path, "app app-secret-1 write\napp app-secret-2 write\nops ops-secret admin\n")
        wait_until(lambda: tokens.reloads > taken, what="the new secret to be taken")
        current[0] = "app-secret-2"  # every client sends the new secret from its next request on
        marks = list(done)
        wait_until(lambda: all(d > m + 1 for d, m in zip(done, marks, strict=True)), what="clients to move")
        taken = tokens.reloads
        replace(path, "app app-secret-2 write\nops ops-secret admin\n")
        wait_until(lambda: tokens.reloads > taken, what="the old secret to be removed")
        marks = list(done)
        wait_until(lambda: all(d >= m + 20 for d, m in zip(done, marks, strict=True)), what="more requests")
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert refused == []
    assert all(used == {"app-secret-1", "app-secret-2"} for used in sent_with)
    assert status(live, "app-secret-1") == 401 and status(live, "app-secret-2") == 200


def test_sighup_rereads_the_file_of_a_real_serve(tmp_path: Path) -> None:
    """``serve --workers 2`` with a watch too slow to matter: only the SIGHUP (forwarded by the
    supervisor to each worker) can make the new token known."""
    path = tmp_path / "tokens"
    path.write_text("ops ops-secret admin\n")
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "diffstore", "serve", "--data", str(tmp_path / "data"), "--port", str(port),
         "--workers", "2", "--token-file", str(path), "--token-poll-s", "3600", "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def answers(secret: str) -> int:
        try:
            # a new connection each time: the kernel spreads them over both workers
            return httpx.get(f"{url}/collections/", headers={"authorization": f"Bearer {secret}"}).status_code
        except httpx.TransportError:
            return 0

    try:
        wait_until(lambda: answers("ops-secret") == 200, timeout=120, what="serve to answer")
        wake = tmp_path / "data" / "wake"  # each worker listens for commits there once its app is built
        wait_until(
            lambda: len(list(wake.iterdir())) == 2, timeout=120, what="both workers to have their tokens"
        )
        assert answers("new-secret") == 401
        replace(path, "ops ops-secret admin\nnew new-secret read\n")
        assert all(answers("new-secret") == 401 for _ in range(5))  # the watch is off: not known yet
        process.send_signal(signal.SIGHUP)
        wait_until(lambda: all(answers("new-secret") == 200 for _ in range(20)), timeout=60, what="SIGHUP")
        assert process.poll() is None  # SIGHUP did not end the server
    finally:
        process.terminate()
        process.wait(timeout=60)
        close_pipes(process)


def test_serve_refuses_a_bad_token_file_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "tokens").write_text(f"ops {SECRET} root\n")
    done = subprocess.run(
        [sys.executable, "-m", "diffstore", "serve", "--data", str(tmp_path / "data"),
         "--port", str(free_port()), "--workers", "1", "--token-file", str(tmp_path / "tokens")],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"diffstore serve: error: --token-file {tmp_path / 'tokens'}: line 1 (ops): the scope must be read,"
        " write or admin, not 'root'"
    ]
    assert SECRET not in done.stderr + done.stdout
    assert not (tmp_path / "data").exists()  # nothing opened
