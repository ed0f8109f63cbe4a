"""The Spark fronts over ``https://`` with a private CA and a client certificate the server requires
(issue 51): the data source (read and write), the A+B→C transform (its diffs read by tasks, its lookups
and puts in executors), and a reader pickled as Spark ships it to an executor where the TLS files do not
exist: they travel by content."""

from __future__ import annotations

import pickle
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from helpers_spark import commit_items, initial_load, load_example_job, snapshot

from diffstore.client import Client
from diffstore.errors import InvalidRequest
from diffstore.spark import Transform
from diffstore.spark.options import SparkReadOptions
from diffstore.spark.source import DiffstoreReader
from tests.helpers import Certificates, make_certificates
from tests.server.test_tls import serving, tls_args

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


class Secure:
    """A ``diffstore serve`` process requiring client certificates (a process: Spark's Python workers keep
    their TLS connections for as long as they live), and a client of it, which tests use as their store."""

    def __init__(self, url: str, store: Client) -> None:
        self.url, self.store = url, store


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory, certs: Certificates) -> Iterator[Secure]:
    data = tmp_path_factory.mktemp("tls-store") / "data"
    with serving(data, certs, "--workers", "1", *tls_args(certs, client_ca=True)) as server:
        mine = (str(certs.client_cert), str(certs.client_key))
        with Client(server.url, ca_file=str(certs.ca), cert=mine, timeout_s=120) as client:
            yield Secure(server.url, client)


def tls_options(certs: Certificates) -> dict[str, str]:
    return {"caFile": str(certs.ca), "clientCert": str(certs.client_cert), "clientKey": str(certs.client_key)}


def loaded(store: Client, name: str, rows: int) -> None:
    store.create_collection(name, manual=True)
    commit_items(store, name, [(b"k%03d" % i, b"v%d" % i) for i in range(rows)])


def test_a_reader_carries_the_tls_files_to_an_executor_that_lacks_them(
    secure: Secure, certs: Certificates, tmp_path: Path
) -> None:
    loaded(secure.store, "shipped", 50)
    copies = tmp_path / "copies"
    shutil.copytree(certs.ca.parent, copies)
    options = {"url": secure.url, "collection": "shipped", "partitions": "1"}
    options.update({k: str(copies / Path(v).name) for k, v in tls_options(certs).items()})
    reader = DiffstoreReader(SparkReadOptions.parse(options))  # on the driver: the files are read here
    assert "BEGIN" not in repr(reader.options)  # the key's PEM never shows in a repr (Spark's logs)
    shipped = pickle.dumps((reader, reader.partitions()[0]))
    shutil.rmtree(copies)  # an executor on another machine: none of the paths exist there
    script = (
        "import pickle, sys\n"
        "reader, part = pickle.loads(sys.stdin.buffer.read())\n"
        "print(sum(batch.num_rows for batch in reader.read(part)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], input=shipped, capture_output=True, cwd=REPO, timeout=120
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == "50"


def test_bad_tls_options_are_refused_on_the_driver(certs: Certificates) -> None:
    base = {"url": "https://127.0.0.1:1", "collection": "c"}
    with pytest.raises(InvalidRequest, match="clientKey needs the option clientCert"):
        SparkReadOptions.parse({**base, "clientKey": str(certs.client_key)})
    with pytest.raises(InvalidRequest, match="TLS file /nonexistent/ca.crt"):
        SparkReadOptions.parse({**base, "caFile": "/nonexistent/ca.crt"})


def test_the_data_source_reads_and_writes_over_https(
    spark: Any, secure: Secure, certs: Certificates, names: dict[str, str]
) -> None:
    loaded(secure.store, names["A"], 200)
    frame = spark.read.format("diffstore").options(
        url=secure.url, collection=names["A"], partitions="2", **tls_options(certs)
    )
    rows = {(r.key, r.value) for r in frame.load().collect()}
    assert rows == {(b"k%03d" % i, b"v%d" % i) for i in range(200)}

    secure.store.create_collection(names["C"], manual=True).start_generation(b"g1")
    table = pa.table({"key": [b"x", b"y"], "value": [b"1", b"2"]})
    writes = spark.createDataFrame(table.to_pandas()).write.format("diffstore")
    writes.options(url=secure.url, collection=names["C"], generationId="g1", **tls_options(certs))
    writes.mode("append").save()
    assert snapshot(secure.store, names["C"]) == {b"x": b"1", b"y": b"2"}


def test_plain_http_to_the_tls_server_fails_saying_so(
    spark: Any, secure: Secure, names: dict[str, str]
) -> None:
    loaded(secure.store, names["A"], 3)
    plain = secure.url.replace("https://", "http://")
    frame = spark.read.format("diffstore").options(url=plain, collection=names["A"])
    with pytest.raises(Exception, match="the server speaks TLS \\(HTTPS\\) only"):
        frame.load().collect()


def test_a_transform_over_https_with_a_client_certificate(
    spark: Any, secure: Secure, certs: Certificates, names: dict[str, str]
) -> None:
    store, rng = secure.store, random.Random(7)
    for name in names.values():
        store.create_collection(name, manual=True)
    a, b = initial_load(rng, 300)
    commit_items(store, names["A"], a)
    commit_items(store, names["B"], b)
    job = load_example_job()
    mine = (str(certs.client_cert), str(certs.client_key))
    sources = {"a": names["A"], "b": names["B"]}
    # diffs over 100 changes are read by Spark tasks: the data source, the lookups and the puts all in
    # executors, each with the shipped files
    transform = Transform(
        spark,
        secure.url,
        names["C"],
        sources,
        job.country_totals,
        partitions=2,
        local_diff_max_rows=100,
        ca_file=str(certs.ca),
        cert=mine,
    )
    try:
        assert len(transform.run()) == 1
    finally:
        transform.close()
    expected = job.recompute(snapshot(store, names["A"]), snapshot(store, names["B"]))
    assert snapshot(store, names["C"]) == expected and expected
