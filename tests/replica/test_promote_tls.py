"""``diffstore promote`` over ``https://`` (issue 51): the command reaches a TLS replica with the CLI's
files, and the promotion reaches its old primary with the replica link's (``serve --replica-of https://…
--ca-file --client-cert --client-key``), which steps down: both servers require client certificates."""

from __future__ import annotations

from pathlib import Path

import pytest

from diffstore.client import Client
from diffstore.errors import Fenced
from tests.helpers import Certificates, make_certificates, wait_until
from tests.server.test_tls import cli, client_args, serving, tls_args, value_of, written


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def test_promote_over_https_steps_the_old_primary_down(tmp_path: Path, certs: Certificates) -> None:
    mine = (str(certs.client_cert), str(certs.client_key))
    secured = tls_args(certs, client_ca=True)
    with serving(tmp_path / "primary", certs, "--workers", "1", *secured) as primary:
        with Client(primary.url, ca_file=str(certs.ca), cert=mine) as old:
            old.create_collection("c", manual=False)
            written(old, "c", b"k", b"1")
            link = ("--replica-of", primary.url, *client_args(certs))
            with (
                serving(tmp_path / "replica", certs, "--workers", "1", *link, *secured) as replica,
                Client(replica.url, ca_file=str(certs.ca), cert=mine) as new,
            ):
                wait_until(lambda: value_of(new, "c", b"k") == b"1", 180, interval=0.05)
                plain = replica.url.replace("https://", "http://")
                refused = cli("promote", "--url", plain)
                assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
                assert "the server speaks TLS (HTTPS) only" in refused.stderr
                result = cli("promote", "--url", replica.url, "--wait", "120", *client_args(certs))
                assert result.returncode == 0, result.stderr
                assert "the old primary stepped down" in result.stdout, result.stdout
                with pytest.raises(Fenced):
                    old.collection("c").put(b"k", b"stale")
                written(new, "c", b"k", b"2")
            assert value_of(old, "c", b"k") == b"1"
