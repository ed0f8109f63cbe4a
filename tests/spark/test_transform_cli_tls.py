"""``diffstore transform --url https://…`` (issue 51): its TLS options reach the check of its collections,
made before Spark starts; plain ``http://`` to the TLS server is one line, before Spark (the pattern of
``test_transform_cli.py``: a ``pyspark`` that leaves a marker and refuses to import)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_transform_cli import only_line, transform

from tests.helpers import Certificates, make_certificates, running_tls_server


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def test_transform_over_https_checks_its_collections_with_a_client_certificate(
    tmp_path: Path, certs: Certificates
) -> None:
    with running_tls_server(tmp_path / "data", certs, client_ca=True) as server:
        server.store.create_collection("A")
        plain = server.url.replace("https://", "http://")
        done, marker = transform(tmp_path, plain, "--target", "C", "--source", "a=A", "--create-target")
        assert "the server speaks TLS (HTTPS) only" in only_line(done)
        files = ["--ca-file", str(certs.ca), "--client-cert", str(certs.client_cert)]
        done, marker = transform(tmp_path, server.url, "--target", "C", "--source", "a=A", "--create-target")
        assert "--ca-file" in only_line(done)  # the private CA is not trusted without it
        assert [info.name for info in server.store.collections()] == ["A"]
        assert not marker.exists()
        done, marker = transform(
            tmp_path, server.url, *files, "--client-key", str(certs.client_key), "--target", "C",
            "--source", "a=A", "--create-target",
        )  # fmt: skip
        # past the check over https (the target created), it went on to start Spark, which this test forbids
        assert marker.exists(), done.stderr
        assert [info.name for info in server.store.collections()] == ["A", "C"]
