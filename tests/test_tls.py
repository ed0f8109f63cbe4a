"""The pure parts of ``diffstore.tls``: where a client's files and a token come from, in which order, and
the one-line refusals (no server; the HTTPS fronts are in tests/server/test_tls.py)."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

import pytest

from diffstore import tls
from diffstore.errors import InvalidRequest
from tests.helpers import Certificates, make_certificates


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def test_client_files_given_win_over_the_environment() -> None:
    env = {tls.CA_FILE_ENV: "env-ca", tls.CLIENT_CERT_ENV: "env-crt", tls.CLIENT_KEY_ENV: "env-key"}
    assert tls.ClientTls.resolve(None, None, env) == tls.ClientTls("env-ca", ("env-crt", "env-key"))
    assert tls.ClientTls.resolve("ca", ("c", "k"), env) == tls.ClientTls("ca", ("c", "k"))
    assert tls.ClientTls.resolve(None, None, {}) == tls.ClientTls(None, None)
    assert tls.ClientTls.resolve(None, None, None) == tls.ClientTls(None, None)


def test_bad_client_files_are_named_in_one_line(tmp_path: Path, certs: Certificates) -> None:
    with pytest.raises(InvalidRequest, match="CA file /nonexistent.crt"):
        tls.ClientTls("/nonexistent.crt").context()
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello\n")
    with pytest.raises(InvalidRequest, match=f"client certificate {not_pem}"):
        tls.ClientTls(str(certs.ca), (str(not_pem), str(not_pem))).context()
    tls.ClientTls(str(certs.ca), (str(certs.client_cert), str(certs.client_key))).context()


def test_server_files_are_checked_before_serving(certs: Certificates) -> None:
    crt, key, ca = str(certs.server_cert), str(certs.server_key), str(certs.ca)
    tls.check_server_files(crt, key, ca)
    tls.check_server_files(None, None, None)
    with pytest.raises(InvalidRequest, match="go together"):
        tls.check_server_files(crt, None, None)
    with pytest.raises(InvalidRequest, match="--tls-client-ca needs"):
        tls.check_server_files(None, None, ca)
    with pytest.raises(InvalidRequest, match="--tls-cert"):
        tls.check_server_files(crt, str(certs.client_key), None)  # a key of another certificate
    assert tls.uvicorn_options(None, None, None) == {}
    assert tls.uvicorn_options(crt, key, ca)["ssl_ca_certs"] == ca


def args(**given: str | None) -> argparse.Namespace:
    return argparse.Namespace(**{"token": None, "token_from_file": None, **given})


def test_the_token_from_a_file_the_flag_or_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = tmp_path / "token"
    secret.write_text("  from-file \n")
    env = {"DIFFSTORE_TOKEN": "from-env"}
    assert tls.token_from_args(args(token_from_file=str(secret)), "serve", env) == "from-file"
    assert tls.token_from_args(args(), "serve", env) == "from-env"
    assert tls.token_from_args(args(), "serve", {}) is None
    assert capsys.readouterr().err == ""
    assert tls.token_from_args(args(token="from-flag"), "serve", env) == "from-flag"
    warned = capsys.readouterr().err.splitlines()
    assert len(warned) == 1 and warned[0].startswith("diffstore serve: warning: --token can be read")
    assert "from-flag" not in warned[0]


@pytest.mark.parametrize(
    ("given", "content", "message"),
    [
        ({"token": "t", "token_from_file": "F"}, "x", "not both"),
        ({"token_from_file": "F"}, "\n", "is empty"),
        ({"token_from_file": "F"}, "one\ntwo\n", "more than one line"),
        ({"token_from_file": "/nonexistent/token"}, None, "/nonexistent/token"),
        ({"token": " "}, None, "--token is empty"),
    ],
)
def test_bad_tokens_are_refused_without_a_warning(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    given: dict[str, str],
    content: str | None,
    message: str,
) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    given = {k: (str(path) if v == "F" else v) for k, v in given.items()}
    with pytest.raises(InvalidRequest, match=message) as caught:
        tls.token_from_args(args(**given), "serve", {})
    assert "\n" not in caught.value.reason and capsys.readouterr().err == ""


def test_the_client_commands_token_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="diffstore get")
    tls.add_client_token_arguments(parser, "a token")
    tls.add_client_arguments(parser)
    secret = tmp_path / "token"
    secret.write_text("from-file\n")
    parsed = parser.parse_args(["--token-from-file", str(secret)])
    assert parsed.token == "from-file" and capsys.readouterr().err == ""
    parsed = parser.parse_args(["--token", "from-flag"])
    assert parsed.token == "from-flag"
    assert capsys.readouterr().err.count("warning: --token can be read by every user") == 1
    with pytest.raises(SystemExit):
        parser.parse_args(["--token-from-file", str(tmp_path / "missing")])
    assert "--token-from-file" in capsys.readouterr().err
    with pytest.raises(InvalidRequest, match="--client-key needs --client-cert"):
        tls.client_tls_from_args(parser.parse_args(["--client-key", "k"]))
    parsed = parser.parse_args(["--ca-file", "ca", "--client-cert", "c", "--client-key", "k"])
    assert tls.client_kwargs(parsed) == {"ca_file": "ca", "cert": ("c", "k")}


def test_explain_says_nothing_of_failures_that_are_not_tls() -> None:
    with socket.socket() as sock:  # a port nothing listens on: refused, not TLS
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert tls.explain(f"http://127.0.0.1:{port}", ConnectionRefusedError("refused")) is None
    assert tls.speaks_tls(f"http://127.0.0.1:{port}") is False
    assert "use https://h:1" in tls.speaks_tls_message("http://h:1")
