"""``diffstore ingest --url https://…`` (issue 51): a private CA, a client certificate the server requires,
the token from a file; and the one-line refusals of a wrong TLS setting, which create nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from ingest_helpers import produce

from diffstore.client import Client
from diffstore.streams.client import StreamClient
from tests.helpers import Certificates, close_pipes, make_certificates, running_tls_server

WAIT_S = 60.0
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("DIFFSTORE_")}


def ingest(stream_url: str, *destination: str) -> list[str]:
    return [
        sys.executable, "-m", "diffstore.cli", "ingest", "--hstream", stream_url, "--subscription", "sub",
        "--collection", "C", *destination, "--create-collection", "--window-records", "30",
        "--window-ms", "20", "--log-commits",
    ]  # fmt: skip


def test_ingest_into_an_https_server_that_requires_a_client_certificate(
    stream_server: Any, tmp_path: Path, certs: Certificates
) -> None:
    with StreamClient(stream_server.url) as streams:
        streams.create_stream("s", shard_count=1)
        streams.create_subscription("sub", "s")
        ids = produce(streams, "s", [("k", b"%d" % i) for i in range(100)])
    secret = tmp_path / "token"
    secret.write_text("s3cret\n")
    with running_tls_server(tmp_path / "db", certs, client_ca=True, token="s3cret") as server:
        tls_args = ["--ca-file", str(certs.ca), "--client-cert", str(certs.client_cert)]
        tls_args += ["--client-key", str(certs.client_key), "--token-from-file", str(secret)]
        pipe = subprocess.PIPE
        command = ingest(stream_server.url, "--url", server.url, *tls_args)
        process = subprocess.Popen(command, stdout=pipe, stderr=pipe, text=True, cwd=REPO, env=clean_env())
        try:
            assert process.stdout is not None and process.stderr is not None
            applied, deadline = 0, time.monotonic() + WAIT_S
            while applied < len(ids):
                assert time.monotonic() < deadline
                line = process.stdout.readline()
                assert line, process.stderr.read()
                applied = int(json.loads(line)["applied"])
            process.terminate()
            assert process.wait(WAIT_S) == 0
            assert "warning" not in process.stderr.read()  # the token came from a file
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            close_pipes(process)
        mine = (str(certs.client_cert), str(certs.client_key))
        with Client(server.url, token="s3cret", ca_file=str(certs.ca), cert=mine) as client:
            record = client.collection("C").get(b"k")
        assert record is not None and record.value == b"99"


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("plain", "the server speaks TLS (HTTPS) only"),
        ("no-ca", "not trusted"),
        ("no-client-cert", "--client-cert and --client-key"),
    ],
)
def test_a_wrong_tls_setting_stops_ingest_in_one_line_and_creates_nothing(
    stream_server: Any, tmp_path: Path, certs: Certificates, how: str, message: str
) -> None:
    with StreamClient(stream_server.url) as streams:
        streams.create_stream("s", shard_count=1)
        streams.create_subscription("sub", "s")
    with running_tls_server(tmp_path / "db", certs, client_ca=True) as server:
        destination = {
            "plain": ["--url", server.url.replace("https://", "http://")],
            "no-ca": ["--url", server.url],
            "no-client-cert": ["--url", server.url, "--ca-file", str(certs.ca)],
        }[how]
        command = ingest(stream_server.url, *destination)
        result = subprocess.run(
            command, capture_output=True, text=True, cwd=REPO, env=clean_env(), timeout=WAIT_S
        )
        assert result.returncode == 2, result.stderr
        assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr
        assert server.store.collections() == []


def test_ingest_from_an_hstreams_server_of_a_private_ca(tmp_path: Path, certs: Certificates) -> None:
    from diffstore.engine import Store
    from diffstore.streams.client import StreamClientConfig
    from diffstore.streams.server import ServerThread, StreamServerConfig

    config = StreamServerConfig(
        data_dir=tmp_path / "hstream",
        port=0,
        resend_tick=0.005,
        assignment_interval=0.01,
        sync=False,
        tls_cert=certs.server_cert,
        tls_key=certs.server_key,
    )
    server = ServerThread(config).start()
    try:
        with StreamClient(StreamClientConfig(server.url, root_certificates=certs.ca.read_bytes())) as streams:
            streams.create_stream("s", shard_count=1)
            streams.create_subscription("sub", "s")
            ids = produce(streams, "s", [("k", b"%d" % i) for i in range(40)])
        data = ["--data", str(tmp_path / "db")]
        refused = subprocess.run(
            ingest(server.url, *data),
            capture_output=True,
            text=True,
            cwd=REPO,
            env=clean_env(),
            timeout=WAIT_S,
        )
        assert refused.returncode == 2, refused.stderr  # (gRPC logs its handshake failures on stderr too)
        assert "--hstream-ca-file" in refused.stderr.splitlines()[-1], refused.stderr
        assert not (tmp_path / "db").exists()
        command = ingest(server.url, *data, "--hstream-ca-file", str(certs.ca))
        pipe = subprocess.PIPE
        process = subprocess.Popen(command, stdout=pipe, stderr=pipe, text=True, cwd=REPO, env=clean_env())
        try:
            assert process.stdout is not None and process.stderr is not None
            applied, deadline = 0, time.monotonic() + WAIT_S
            while applied < len(ids):
                assert time.monotonic() < deadline
                line = process.stdout.readline()
                assert line, process.stderr.read()
                applied = int(json.loads(line)["applied"])
            process.terminate()
            assert process.wait(WAIT_S) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            close_pipes(process)
    finally:
        server.stop()
    with Store.open(tmp_path / "db") as store:
        record = store.collection("C").get(b"k")
        assert record is not None and record.value == b"39"
