"""A consumer over ``https://`` with a private CA and a client certificate the server requires (issue 51):
its diffs, checkpoints, lease and the long poll that wakes it all go over TLS; a client without the
certificate is refused in one line and delivers nothing."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from diffstore.client import Client
from diffstore.consumer import Consumer, WindowListener
from diffstore.errors import StorageError
from tests.helpers import Certificates, make_certificates, running_tls_server, wait_until

DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


class Seen(WindowListener):
    def __init__(self) -> None:
        self.events: list[tuple[bytes, bytes | None]] = []

    def on_data_event(self, source: str, key: bytes, old: bytes | None, new: bytes | None) -> bool:
        self.events.append((key, new))
        return True


def test_a_consumer_over_https_with_a_client_certificate(tmp_path: Path, certs: Certificates) -> None:
    mine = (str(certs.client_cert), str(certs.client_key))
    with running_tls_server(tmp_path / "db", certs, client_ca=True) as server:
        with Client(server.url, ca_file=str(certs.ca), cert=mine) as client:
            source = client.create_collection("A", manual=True)
            source.write_generation(b"g1", [(b"k1", b"v1")])
            with Client(server.url, ca_file=str(certs.ca)) as stranger:  # no client certificate
                nobody = Seen()
                with pytest.raises(StorageError, match="without a client certificate it trusts"):
                    Consumer(stranger, ["A"], "checkpoints", nobody).run_pending()
                assert nobody.events == []
            seen = Seen()
            consumer = Consumer(client, ["A"], "checkpoints", seen, wait_timeout_ms=1_000, lease_ttl_ms=5_000)
            stop = threading.Event()
            errors: list[BaseException] = []

            def run() -> None:
                try:
                    consumer.run(stop)
                except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
                    errors.append(exc)

            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            try:
                wait_until(lambda: seen.events == [(b"k1", b"v1")], DEADLINE_S, what="the first window")
                source.write_generation(b"g2", [(b"k2", b"v2")])  # the consumer's long poll wakes up
                wait_until(lambda: len(seen.events) == 2, DEADLINE_S, what="the second window")
            finally:
                stop.set()
                thread.join(DEADLINE_S)
            assert not thread.is_alive() and errors == []
            assert seen.events == [(b"k1", b"v1"), (b"k2", b"v2")]
            readers = {r.name: r.generation_id for r in client.collection("checkpoints").readers()}
            assert b"g2" in readers.values()
