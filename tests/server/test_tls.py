"""HTTPS on every HTTP link (issue 51 item 1) and secrets off the command line (item 3), over real
``diffstore serve`` processes with certificates made by the test (a private CA, a server and a client
certificate, and a client certificate of another CA)."""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from diffstore.client import AsyncClient, Client
from diffstore.engine.store import Store
from diffstore.errors import NoSuchCollection, StorageError
from tests.helpers import Certificates, close_pipes, free_port, make_certificates, wait_until

STARTUP_S = 90.0
CLI = [sys.executable, "-m", "diffstore.cli"]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def tls_args(certs: Certificates, client_ca: bool = False) -> list[str]:
    args = ["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)]
    return args + (["--tls-client-ca", str(certs.ca)] if client_ca else [])


def client_args(certs: Certificates) -> list[str]:
    return [
        "--ca-file",
        str(certs.ca),
        "--client-cert",
        str(certs.client_cert),
        "--client-key",
        str(certs.client_key),
    ]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIFFSTORE_")}
    return {**env, **extra}


class Serve:
    """One ``diffstore serve`` process; its output in a log file."""

    def __init__(
        self, data: Path, certs: Certificates, *args: str, env: dict[str, str] | None = None
    ) -> None:
        self.certs = certs
        self.port = free_port()
        self.tls = "--tls-cert" in args
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"
        self.log = data.parent / f"{data.name}-{self.port}.log"
        command = [*CLI, "serve", "--data", str(data), "--port", str(self.port), "--commit-delay-ms", "10"]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [*command, *args], stdout=log, stderr=subprocess.STDOUT, env=env or clean_env()
            )

    def healthy(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"serve exited with {self.process.returncode}: {self.log.read_text()}")
        context: ssl.SSLContext | bool = True
        if self.tls:
            context = ssl.create_default_context(cafile=str(self.certs.ca))
            context.load_cert_chain(str(self.certs.client_cert), str(self.certs.client_key))
        try:
            return httpx.get(f"{self.url}/healthz", verify=context, timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(60)
        close_pipes(self.process)


@contextmanager
def serving(
    data: Path, certs: Certificates, *args: str, env: dict[str, str] | None = None
) -> Iterator[Serve]:
    server = Serve(data, certs, *args, env=env)
    try:
        wait_until(server.healthy, STARTUP_S, interval=0.05, what=f"{server.url} to answer /healthz")
        yield server
    finally:
        server.stop()


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env or clean_env(), timeout=120)


def written(client: Client, name: str, key: bytes, value: bytes) -> None:
    """Writes ``key`` in automatic collection ``name`` and waits until its auto-commit shows it."""
    collection = client.collection(name)
    collection.put(key, value)
    wait_until(lambda: collection.get(key) is not None, 30, interval=0.02, what=f"{key!r} to be committed")


def value_of(client: Client, name: str, key: bytes) -> bytes | None:
    try:
        record = client.collection(name).get(key)
    except NoSuchCollection:  # a replica that has not copied the collection yet
        return None
    return None if record is None else record.value


def test_every_worker_serves_https_to_both_clients(tmp_path: Path, certs: Certificates) -> None:
    with serving(tmp_path / "data", certs, "--workers", "2", *tls_args(certs)) as server:
        assert server.url.startswith("https://")
        with Client(server.url, ca_file=str(certs.ca)) as client:
            client.create_collection("c", manual=False)
            written(client, "c", b"k", b"v")
            assert [r.key for r in client.collection("c").query()] == [b"k"]
        # fresh connections land on either worker (SO_REUSEPORT): every one of them is served over TLS
        for _ in range(12):
            with Client(server.url, ca_file=str(certs.ca)) as client:
                assert value_of(client, "c", b"k") == b"v"

        async def read() -> bytes | None:
            async with AsyncClient(server.url, ca_file=str(certs.ca)) as client:
                record = await (await client.collection("c")).get(b"k")
                return None if record is None else record.value

        assert asyncio.run(read()) == b"v"
        assert "diffstore serving https://127.0.0.1:" in server.log.read_text()


def test_a_client_without_the_private_ca_refuses_the_server(
    tmp_path: Path, certs: Certificates, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serving(tmp_path / "data", certs, "--workers", "1", *tls_args(certs)) as server:
        with Client(server.url) as client, pytest.raises(StorageError, match="CERTIFICATE_VERIFY_FAILED"):
            client.collections()
        # the environment names the CA when no argument does
        monkeypatch.setenv("DIFFSTORE_CA_FILE", str(certs.ca))
        with Client(server.url) as client:
            assert client.collections() == []
        result = cli("collections", "ls", "--url", server.url)
        assert result.returncode == 1
        assert len(result.stderr.strip().splitlines()) == 1
        assert "CERTIFICATE_VERIFY_FAILED" in result.stderr and "not trusted" in result.stderr
        assert "--ca-file" in result.stderr


def test_https_to_a_plain_server_fails_in_one_line(tmp_path: Path, certs: Certificates) -> None:
    with serving(tmp_path / "data", certs, "--workers", "1") as server:
        secure = server.url.replace("http://", "https://")
        with Client(secure, ca_file=str(certs.ca)) as client, pytest.raises(StorageError) as caught:
            client.collections()
        assert caught.value.reason == f"{secure}: the server does not speak TLS: use {server.url}"
        result = cli("collections", "ls", "--url", secure, "--ca-file", str(certs.ca))
        assert result.returncode == 1 and result.stderr.count("\n") == 1
        assert "the server does not speak TLS" in result.stderr


def test_plain_http_to_a_tls_server_fails_in_one_line(tmp_path: Path, certs: Certificates) -> None:
    with serving(tmp_path / "data", certs, "--workers", "1", *tls_args(certs)) as server:
        with Client(server.url, ca_file=str(certs.ca)) as client:
            client.create_collection("c", manual=False)
            written(client, "c", b"k", b"v")
        plain = server.url.replace("https://", "http://")
        with Client(plain) as client, pytest.raises(StorageError, match="speaks TLS") as caught:
            client.collection("c").put(b"k", b"changed")
        assert f"use {server.url}" in caught.value.reason
        result = cli("put", "--url", plain, "c", "k", "changed")
        assert result.returncode == 1
        assert result.stderr.count("\n") == 1 and "the server speaks TLS (HTTPS) only" in result.stderr
        out = tmp_path / "backup"
        result = cli("backup", "--url", plain, str(out))
        assert result.returncode == 1
        assert result.stderr.count("\n") == 1 and "the server speaks TLS (HTTPS) only" in result.stderr
        with Client(server.url, ca_file=str(certs.ca)) as client:  # nothing was written
            assert value_of(client, "c", b"k") == b"v"


def test_the_cli_and_a_long_poll_over_https(tmp_path: Path, certs: Certificates) -> None:
    with serving(tmp_path / "data", certs, "--workers", "2", *tls_args(certs)) as server:
        env = clean_env(DIFFSTORE_URL=server.url, DIFFSTORE_CA_FILE=str(certs.ca))
        assert cli("collections", "create", "--manual", "m", env=env).returncode == 0
        assert cli("generation", "start", "m", "g1", env=env).returncode == 0
        assert cli("put", "--generation", "g1", "m", "k", "v1", env=env).returncode == 0
        with Client(server.url, ca_file=str(certs.ca)) as client:
            seen: list[bool] = []
            poll = threading.Thread(target=lambda: seen.append(client.wait_for_change({"m": b""}, 60_000)))
            poll.start()
            result = cli("generation", "commit", "m", "g1", "--url", server.url, "--ca-file", str(certs.ca))
            assert result.returncode == 0, result.stderr
            poll.join(90)
            assert seen == [True]
        result = cli("get", "m", "k", env=env)
        assert result.returncode == 0 and result.stdout.strip() == "v1", result.stderr


def test_client_certificates_required_and_refused(tmp_path: Path, certs: Certificates) -> None:
    with serving(tmp_path / "data", certs, "--workers", "1", *tls_args(certs, client_ca=True)) as server:
        mine = (str(certs.client_cert), str(certs.client_key))
        with Client(server.url, ca_file=str(certs.ca), cert=mine) as client:
            client.create_collection("c", manual=False)
            written(client, "c", b"k", b"v")
        stranger = (str(certs.stranger_cert), str(certs.stranger_key))
        for cert in (None, stranger):
            with (
                Client(server.url, ca_file=str(certs.ca), cert=cert) as client,
                pytest.raises(StorageError, match="without a client certificate it trusts"),
            ):
                client.collection("c").put(b"k", b"changed")
        refused = cli("put", "--url", server.url, "--ca-file", str(certs.ca), "c", "k", "changed")
        assert refused.returncode == 1 and refused.stderr.count("\n") == 1
        assert "--client-cert and --client-key" in refused.stderr
        with Client(server.url, ca_file=str(certs.ca), cert=mine) as client:  # nothing was written
            assert value_of(client, "c", b"k") == b"v"
        result = cli("get", "--url", server.url, *client_args(certs), "c", "k")
        assert result.returncode == 0 and result.stdout.strip() == "v", result.stderr
        env = clean_env(
            DIFFSTORE_URL=server.url,
            DIFFSTORE_CA_FILE=str(certs.ca),
            DIFFSTORE_CLIENT_CERT=str(certs.client_cert),
            DIFFSTORE_CLIENT_KEY=str(certs.client_key),
        )
        result = cli("get", "c", "k", env=env)
        assert result.returncode == 0 and result.stdout.strip() == "v", result.stderr


def test_backup_over_https_with_a_client_certificate(tmp_path: Path, certs: Certificates) -> None:
    with serving(tmp_path / "data", certs, "--workers", "1", *tls_args(certs, client_ca=True)) as server:
        mine = (str(certs.client_cert), str(certs.client_key))
        with Client(server.url, ca_file=str(certs.ca), cert=mine) as client:
            client.create_collection("c", manual=False)
            written(client, "c", b"k", b"v")
        refused = cli("backup", "--url", server.url, "--ca-file", str(certs.ca), str(tmp_path / "refused"))
        assert refused.returncode == 1 and refused.stderr.count("\n") == 1
        out = tmp_path / "backup"
        result = cli("backup", "--url", server.url, *client_args(certs), str(out))
        assert result.returncode == 0, result.stderr
    with Store.open(out) as store:
        assert store.collection("c").get(b"k") is not None


def test_a_replica_follows_its_primary_over_https(tmp_path: Path, certs: Certificates) -> None:
    primary_args = ("--workers", "1", *tls_args(certs, client_ca=True))
    with serving(tmp_path / "primary", certs, *primary_args) as primary:
        mine = (str(certs.client_cert), str(certs.client_key))
        with Client(primary.url, ca_file=str(certs.ca), cert=mine) as client:
            client.create_collection("c", manual=False)
            written(client, "c", b"before", b"1")
            replica_args = ("--workers", "1", "--replica-of", primary.url, *client_args(certs))
            with serving(tmp_path / "replica", certs, *replica_args) as replica, Client(replica.url) as copy:
                wait_until(lambda: value_of(copy, "c", b"before") == b"1", 60, interval=0.05)
                written(client, "c", b"after", b"2")
                wait_until(lambda: value_of(copy, "c", b"after") == b"2", 60, interval=0.05)
                assert [r.key for r in copy.collection("c").query()] == [b"after", b"before"]


def test_a_replica_with_wrong_tls_settings_is_refused_in_one_line(
    tmp_path: Path, certs: Certificates
) -> None:
    with serving(tmp_path / "primary", certs, "--workers", "1", *tls_args(certs, client_ca=True)) as primary:
        plain = primary.url.replace("https://", "http://")
        for url, extra, message in (
            (plain, [], "the server speaks TLS (HTTPS) only"),
            (primary.url, [], "not trusted"),
            (primary.url, ["--ca-file", str(certs.ca)], "--client-cert and --client-key"),
        ):
            data = tmp_path / "replica"
            result = cli(
                "serve", "--data", str(data), "--port", str(free_port()), "--replica-of", url, *extra
            )
            assert result.returncode == 2 and message in result.stderr, result.stderr
            assert result.stderr.count("\n") == 1


def test_tokens_from_a_file_or_the_environment_and_the_warning(tmp_path: Path, certs: Certificates) -> None:
    secret = tmp_path / "token"
    secret.write_text("s3cret-token\n")
    secret.chmod(0o600)
    args = ("--workers", "1", "--token-from-file", str(secret), *tls_args(certs))
    with serving(tmp_path / "data", certs, *args) as server:
        assert "warning" not in server.log.read_text()
        base = ["--url", server.url, "--ca-file", str(certs.ca)]
        assert (
            cli("collections", "create", *base, "--token-from-file", str(secret), "--manual", "m").returncode
            == 0
        )
        result = cli("collections", "ls", *base, env=clean_env(DIFFSTORE_TOKEN="s3cret-token"))
        assert result.returncode == 0 and result.stdout.split() == ["m", "manual"] and not result.stderr
        result = cli("collections", "ls", *base, "--token", "s3cret-token")
        assert result.returncode == 0 and result.stdout.split() == ["m", "manual"]
        warnings = result.stderr.strip().splitlines()
        assert len(warnings) == 1 and "--token can be read by every user" in warnings[0]
        refused = cli("collections", "ls", *base)  # no token at all
        assert refused.returncode == 1 and "s3cret" not in refused.stderr
    with serving(tmp_path / "data", certs, "--workers", "1", "--token", "s3cret-token") as server:
        warned = [line for line in server.log.read_text().splitlines() if "warning" in line]
        assert len(warned) == 1 and "--token can be read by every user" in warned[0]
        assert "s3cret-token" not in server.log.read_text()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tls-cert", "CERT"], "--tls-cert and --tls-key go together"),
        (["--tls-cert", "/nonexistent.crt", "--tls-key", "KEY"], "/nonexistent.crt"),
        (["--tls-cert", "CERT", "--tls-key", "CA"], "--tls-cert"),
        (["--tls-client-ca", "CA"], "--tls-client-ca needs --tls-cert"),
        (["--tls-cert", "CERT", "--tls-key", "KEY", "--tls-client-ca", "/nonexistent.ca"], "/nonexistent.ca"),
        (["--token-from-file", "/nonexistent.token"], "--token-from-file /nonexistent.token"),
        (["--token-from-file", "EMPTY"], "is empty"),
        (["--token-from-file", "EMPTY", "--token", "t"], "not both"),
    ],
)
def test_bad_tls_and_token_files_are_refused_in_one_line(
    tmp_path: Path, certs: Certificates, args: list[str], message: str
) -> None:
    (tmp_path / "empty").write_text("\n")
    files = {"CERT": certs.server_cert, "KEY": certs.server_key, "CA": certs.ca, "EMPTY": tmp_path / "empty"}
    args = [str(files[arg]) if arg in files else arg for arg in args]
    result = cli("serve", "--data", str(tmp_path / "data"), "--port", str(free_port()), *args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert not (tmp_path / "data").exists()  # refused before anything was opened
