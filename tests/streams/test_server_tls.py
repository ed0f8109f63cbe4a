"""The embedded server over TLS (``--tls-cert``/``--tls-key``): our client's ``hstreams://`` end to end."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from diffstore.streams.client import StreamClient, StreamClientConfig, StreamError
from diffstore.streams.producer import BufferedProducer
from diffstore.streams.server import ServerThread, StreamServerConfig
from diffstore.streams.subscriber import StreamSubscriber

WAIT_S = 20.0


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, made by the openssl command."""
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


@pytest.fixture
def tls_server(tmp_path: Path, certificate: tuple[Path, Path]) -> Iterator[ServerThread]:
    cert, key = certificate
    config = StreamServerConfig(
        data_dir=tmp_path / "hstream",
        port=0,
        resend_tick=0.005,
        assignment_interval=0.01,
        sync=False,
        tls_cert=cert,
        tls_key=key,
    )
    server = ServerThread(config).start()
    try:
        yield server
    finally:
        server.stop()


def test_records_travel_over_tls(tls_server: ServerThread, certificate: tuple[Path, Path]) -> None:
    assert tls_server.url.startswith("hstreams://127.0.0.1:")
    config = StreamClientConfig(tls_server.url, root_certificates=certificate[0].read_bytes())
    with StreamClient(config) as client:
        client.create_stream("secure", shard_count=2)
        client.create_subscription("sub", "secure")
        with BufferedProducer(client, "secure") as producer:
            sent = {
                producer.append(b"r%d" % i, key=f"k{i % 3}").result(WAIT_S): b"r%d" % i for i in range(50)
            }
        received = {}
        with StreamSubscriber(client, "sub") as consumer:
            deadline = time.monotonic() + WAIT_S
            while len(received) < len(sent):
                assert time.monotonic() < deadline, f"got {len(received)} of {len(sent)}"
                batch = consumer.poll(0.5)
                if batch is not None:
                    received.update({r.record_id: r.payload for r in batch.records})
                    consumer.ack(batch.record_ids)
    assert received == sent


def test_plain_and_untrusting_clients_are_refused(tls_server: ServerThread) -> None:
    with StreamClient(StreamClientConfig(f"hstream://{tls_server.address}", timeout_s=2)) as plain:
        with pytest.raises(StreamError):
            plain.describe_cluster()
    # TLS, but without the self-signed root: the certificate is not trusted
    with StreamClient(StreamClientConfig(tls_server.url, timeout_s=2)) as untrusting:
        with pytest.raises(StreamError):
            untrusting.describe_cluster()


def test_tls_needs_both_files_and_says_so_in_one_line(tmp_path: Path, certificate: tuple[Path, Path]) -> None:
    with pytest.raises(ValueError, match="both a certificate and its key"):
        StreamServerConfig(data_dir=tmp_path, tls_cert=certificate[0])
    with pytest.raises(ValueError, match="not a readable file"):
        StreamServerConfig(data_dir=tmp_path, tls_cert=tmp_path / "missing.pem", tls_key=certificate[1])
    done = subprocess.run(
        [sys.executable, "-m", "diffstore.streams.cli", "streams", "serve", "--data", str(tmp_path / "d")]
        + ["--port", "0", "--tls-cert", str(certificate[0])],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "--tls-cert and --tls-key" in done.stderr
