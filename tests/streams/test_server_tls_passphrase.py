"""The streams server's encrypted TLS key (issue 51 item 3): its passphrase from ``--tls-key-password-file``,
``DIFFSTORE_TLS_KEY_PASSWORD`` or ``--tls-key-password`` (which warns once); decrypted in memory, since gRPC
reads no encrypted key; a missing or wrong passphrase refused in one line before anything is opened."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from diffstore.streams.client import StreamClient, StreamClientConfig
from diffstore.streams.server import ServerThread, StreamServerConfig
from tests.helpers import Certificates, close_pipes, make_certificates

PASSPHRASE = "streams passphrase"
WAIT_S = 60.0


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def locked(certs: Certificates, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("locked") / "server.key"
    subprocess.run(
        ["openssl", "pkey", "-in", str(certs.server_key), "-aes256", "-passout", f"pass:{PASSPHRASE}"]
        + ["-out", str(out)],
        check=True,
        capture_output=True,
    )
    return out


def test_an_encrypted_key_serves_hstreams(tmp_path: Path, certs: Certificates, locked: Path) -> None:
    config = StreamServerConfig(
        data_dir=tmp_path / "hstream",
        port=0,
        sync=False,
        tls_cert=certs.server_cert,
        tls_key=locked,
        tls_key_password=PASSPHRASE,
    )
    assert PASSPHRASE not in repr(config)
    server = ServerThread(config).start()
    try:
        client_config = StreamClientConfig(server.url, root_certificates=certs.ca.read_bytes())
        with StreamClient(client_config) as client:
            client.create_stream("secure", shard_count=1)
            assert "secure" in [stream.streamName for stream in client.list_streams()]
    finally:
        server.stop()


def serve(
    tmp_path: Path, certs: Certificates, key: Path, *args: str, env: dict[str, str] | None = None
) -> list[str]:
    data = tmp_path / "hstream"
    return [
        sys.executable, "-m", "diffstore.cli", "streams", "serve", "--data", str(data), "--port", "0",
        "--tls-cert", str(certs.server_cert), "--tls-key", str(key), *args,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        ((), {}, "the key is encrypted: give its passphrase"),
        (("--tls-key-password-file", "WRONG"), {}, "passphrase is wrong"),
        ((), {"DIFFSTORE_TLS_KEY_PASSWORD": "nope"}, "passphrase is wrong"),
    ],
)
def test_a_missing_or_wrong_passphrase_is_one_line(
    tmp_path: Path,
    certs: Certificates,
    locked: Path,
    args: tuple[str, ...],
    env: dict[str, str],
    message: str,
) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("nope\n")
    given = [str(wrong) if arg == "WRONG" else arg for arg in args]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DIFFSTORE_")}
    result = subprocess.run(
        serve(tmp_path, certs, locked, *given),
        capture_output=True,
        text=True,
        env={**clean, **env},
        timeout=WAIT_S,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert "nope" not in result.stderr
    assert not (tmp_path / "hstream").exists()


def test_the_passphrase_on_the_command_line_works_and_warns(
    tmp_path: Path, certs: Certificates, locked: Path
) -> None:
    command = serve(tmp_path, certs, locked, "--tls-key-password", PASSPHRASE)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        lines = []
        for line in process.stdout:  # ends when the server is up (its log line) or exits
            lines.append(line)
            if "hstream-compatible server on" in line or process.poll() is not None:
                break
        output = "".join(lines)
        assert "hstream-compatible server on" in output, output
        warned = [line for line in lines if "warning" in line]
        assert len(warned) == 1 and "--tls-key-password can be read by every user" in warned[0]
        assert PASSPHRASE not in output
    finally:
        process.terminate()
        process.wait(WAIT_S)
        close_pipes(process)
