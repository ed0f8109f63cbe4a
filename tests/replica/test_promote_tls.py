"""Promotion over TLS: ``diffstore promote`` reaches an https replica with its --ca-file/--client-cert, and
the promotion reaches the https old primary with the replica link's own TLS files, so it is told to
step down (without them it would count as away and keep taking writes)."""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx

from diffstore.client import Client
from tests.helpers import Certificates, wait_until
from tests.server.test_tls import certs, cli, client_args, serving, tls_args, value_of, written

__all__ = ["certs"]  # the module's certificates fixture, shared with the server's TLS tests


def test_promote_over_https_tells_the_https_old_primary_to_step_down(
    tmp_path: Path, certs: Certificates
) -> None:
    mine = (str(certs.client_cert), str(certs.client_key))
    primary_args = ("--workers", "1", *tls_args(certs, client_ca=True))
    with serving(tmp_path / "primary", certs, *primary_args) as primary:
        with Client(primary.url, ca_file=str(certs.ca), cert=mine) as client:
            client.create_collection("c", manual=False)
            written(client, "c", b"k", b"1")
            replica_args = (
                "--workers", "1", *tls_args(certs, client_ca=True), "--replica-of", primary.url,
                *client_args(certs),
            )  # fmt: skip
            with (
                serving(tmp_path / "replica", certs, *replica_args) as replica,
                Client(replica.url, ca_file=str(certs.ca), cert=mine) as copy,
            ):
                wait_until(lambda: value_of(copy, "c", b"k") == b"1", 60, interval=0.05)
                untrusted = cli("promote", "--url", replica.url)
                assert untrusted.returncode == 1 and "certificate" in untrusted.stderr
                assert untrusted.stderr.count("\n") == 1
                promoted = cli("promote", "--url", replica.url, *client_args(certs))
                assert promoted.returncode == 0, promoted.stderr
                assert "the old primary stepped down" in promoted.stdout, promoted.stdout
                # the old primary refuses writes now; the new one takes them
                refused = httpx.post(
                    f"{primary.url}/collections/c/put",
                    json={"item": {"key": {"value": "k"}, "value": {"value": "2"}}},
                    verify=_context(certs),
                )
                assert (refused.status_code, refused.json()["error"]) == (409, "fenced")
                written(copy, "c", b"k", b"3")
                assert value_of(client, "c", b"k") == b"1"


def _context(certs: Certificates) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs.ca))
    context.load_cert_chain(str(certs.client_cert), str(certs.client_key))
    return context
