"""Encrypted TLS keys (issue 51 item 3): the server's key passphrase from ``--tls-key-password-file``,
``DIFFSTORE_TLS_KEY_PASSWORD`` or ``--tls-key-password`` (which warns once), a client key's from the
client's ``cert`` third item, ``DIFFSTORE_CLIENT_KEY_PASSWORD`` or ``--client-key-password-file``; a missing
or wrong passphrase refused in one line, never asked for on a terminal, never printed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from diffstore.client import Client
from diffstore.errors import InvalidRequest
from tests.helpers import Certificates, free_port, make_certificates
from tests.server.test_tls import clean_env, cli, serving

PASSPHRASE = "correct horse battery"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def encrypted(key: Path, out: Path) -> Path:
    subprocess.run(
        ["openssl", "pkey", "-in", str(key), "-aes256", "-passout", f"pass:{PASSPHRASE}", "-out", str(out)],
        check=True,
        capture_output=True,
    )
    assert "ENCRYPTED" in out.read_text()
    return out


@pytest.fixture(scope="module")
def locked(certs: Certificates, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The server's and the client's keys encrypted with :data:`PASSPHRASE`, and a file holding it."""
    directory = tmp_path_factory.mktemp("locked")
    phrase = directory / "passphrase"
    phrase.write_text(PASSPHRASE + "\n")
    phrase.chmod(0o600)
    server = encrypted(certs.server_key, directory / "server.key")
    client = encrypted(certs.client_key, directory / "client.key")
    return server, client, phrase


def test_serve_with_an_encrypted_key_from_a_file_the_environment_or_the_command_line(
    tmp_path: Path, certs: Certificates, locked: tuple[Path, Path, Path]
) -> None:
    key, client_key, phrase = locked
    base = ("--workers", "1", "--tls-cert", str(certs.server_cert), "--tls-key", str(key))
    ways = [
        (("--tls-key-password-file", str(phrase)), {}),
        ((), {"DIFFSTORE_TLS_KEY_PASSWORD": PASSPHRASE}),
        (("--tls-key-password", PASSPHRASE), {}),
    ]
    for index, (given, env) in enumerate(ways):
        with serving(tmp_path / f"data{index}", certs, *base, *given, env=clean_env(**env)) as server:
            # the client's key is encrypted too: its passphrase as cert's third item
            mine = (str(certs.client_cert), str(client_key), PASSPHRASE)
            with Client(server.url, ca_file=str(certs.ca), cert=mine) as client:
                assert client.collections() == []
            log = server.log.read_text()
        assert PASSPHRASE not in log
        warned = [line for line in log.splitlines() if "warning" in line]
        if given and given[0] == "--tls-key-password":
            assert len(warned) == 1 and "--tls-key-password can be read by every user" in warned[0]
        else:
            assert warned == []


@pytest.mark.parametrize(
    ("given", "env", "message"),
    [
        ((), {}, "the key is encrypted and its passphrase is missing or wrong"),
        (("--tls-key-password", "wrong"), {}, "the key is encrypted and its passphrase is missing or wrong"),
        ((), {"DIFFSTORE_TLS_KEY_PASSWORD": "wrong"}, "passphrase is missing or wrong"),
        (("--tls-key-password-file", "/nonexistent/phrase"), {}, "--tls-key-password-file /nonexistent"),
        (("--tls-key-password-file", "PHRASE", "--tls-key-password", "x"), {}, "not both"),
    ],
)
def test_a_missing_or_wrong_server_passphrase_is_refused_in_one_line(
    tmp_path: Path,
    certs: Certificates,
    locked: tuple[Path, Path, Path],
    given: tuple[str, ...],
    env: dict[str, str],
    message: str,
) -> None:
    key, _, phrase = locked
    args = [str(phrase) if arg == "PHRASE" else arg for arg in given]
    tls = ["--tls-cert", str(certs.server_cert), "--tls-key", str(key)]
    data = tmp_path / "data"
    command = ["serve", "--data", str(data), "--port", str(free_port()), *tls, *args]
    result = cli(*command, env=clean_env(**env))
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if "warning" not in line]
    assert len(errors) == 1 and message in errors[0], result.stderr
    assert PASSPHRASE not in result.stderr and "wrong" not in result.stderr.replace("or wrong", "")
    assert not data.exists()


def test_an_encrypted_client_key_from_the_environment_or_a_file(
    tmp_path: Path, certs: Certificates, locked: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, client_key, phrase = locked
    tls = ("--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key))
    tls += ("--tls-client-ca", str(certs.ca))
    with serving(tmp_path / "data", certs, "--workers", "1", *tls) as server:
        mine = (str(certs.client_cert), str(client_key))
        refusal = "passphrase is missing or wrong.*DIFFSTORE_CLIENT_KEY_PASSWORD"
        with pytest.raises(InvalidRequest, match=refusal):
            Client(server.url, ca_file=str(certs.ca), cert=mine)
        monkeypatch.setenv("DIFFSTORE_CLIENT_KEY_PASSWORD", PASSPHRASE)
        with Client(server.url, ca_file=str(certs.ca), cert=mine) as client:
            client.create_collection("c", manual=False)
        monkeypatch.delenv("DIFFSTORE_CLIENT_KEY_PASSWORD")
        files = ["--url", server.url, "--ca-file", str(certs.ca), "--client-cert", str(certs.client_cert)]
        files += ["--client-key", str(client_key)]
        refused = cli("collections", "ls", *files)
        assert refused.returncode != 0 and refused.stderr.count("\n") == 1, refused.stderr
        assert "passphrase is missing or wrong" in refused.stderr
        result = cli("collections", "ls", *files, "--client-key-password-file", str(phrase))
        assert result.returncode == 0 and result.stdout.split()[0] == "c", result.stderr
        env = clean_env(DIFFSTORE_CLIENT_KEY_PASSWORD=PASSPHRASE)
        result = cli("collections", "ls", *files, env=env)
        assert result.returncode == 0 and result.stdout.split()[0] == "c", result.stderr
        assert PASSPHRASE not in result.stderr + refused.stderr
