"""Any SparkSession: the format found without registering it, options checked, one-line errors, tokens.

The suite's session is a plain ``SparkSession.builder`` session (see ``conftest.py``): nothing registers
the ``diffstore`` format in it before these tests run.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from conftest import REMOTE_ENV, TOKEN
from helpers_spark import commit_items, snapshot
from pyspark.sql import functions as F

from diffstore import Store
from diffstore.spark import Transform


def _rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted(tuple(bytes(v) if v is not None else None for v in row) for row in df.collect())


def test_misspelled_option_is_one_line_listing_the_valid_ones(spark, server_url, store: Store, names) -> None:
    a = names["A"]
    store.create_collection(a, manual=True)
    commit_items(store, a, [(b"k", b"v")])
    reader = spark.read.format("diffstore").option("url", server_url).option("collection", a)
    with pytest.raises(Exception) as info:
        reader.option("fromReadr", "r").load()  # would silently read a snapshot if ignored
    message = str(info.value)
    assert "unknown diffstore read option 'fromreadr' (did you mean 'fromReader'?)" in message
    valid = "valid options: caFile, clientCert, clientKey, codec, collection, fromGenerationId, fromReader,"
    assert valid in message
    assert "Traceback" not in message
    assert [line for line in message.splitlines() if "diffstore" in line] == [message.splitlines()[0]]


def test_writing_into_a_generation_that_is_not_open_fails_before_any_task(
    spark, server_url, store: Store, names
) -> None:
    c = names["C"]
    store.create_collection(c, manual=True)
    frame = spark.createDataFrame([(b"k", b"v")], "key binary, value binary")
    writer = frame.write.format("diffstore").mode("append").option("url", server_url).option("collection", c)
    with pytest.raises(Exception) as info:
        writer.option("generationId", "nope").save()
    message = str(info.value)
    assert "GenerationMismatch: generation b'nope' is not open" in message and "Traceback" not in message
    assert snapshot(store, c) == {} and store.collection(c).next_generation_id is None


def test_token_option_reaches_a_protected_server(spark, token_server_url, store: Store, names) -> None:
    a = names["A"]
    store.create_collection(a, manual=True)
    commit_items(store, a, [(b"k1", b"v1"), (b"k2", b"v2")])

    def reader() -> Any:
        return spark.read.format("diffstore").option("url", token_server_url).option("collection", a)

    assert _rows(reader().option("token", TOKEN).load()) == [(b"k1", b"v1"), (b"k2", b"v2")]
    with pytest.raises(Exception) as info:
        reader().load().collect()
    message = str(info.value)
    assert "missing bearer token" in message and "Traceback" not in message


def test_transform_on_a_plain_session_with_a_token(spark, token_server_url, store: Store, names) -> None:
    a, c = names["A"], names["C"]
    store.create_collection(a, manual=True)
    store.create_collection(c, manual=True)
    commit_items(store, a, [(b"k1", b"1"), (b"k2", b"2")])

    def upper(spark: Any, diffs: dict[str, Any], lookup: Any) -> Any:
        return diffs["a"].select("key", F.concat(F.col("toValue"), F.lit(b"!")).alias("value"))

    transform = Transform(spark, token_server_url, c, {"a": a}, upper, token=TOKEN, partitions=1)
    try:
        rounds = transform.run()
    finally:
        transform.close()
    assert len(rounds) == 1
    assert snapshot(store, c) == {b"k1": b"1!", b"k2": b"2!"}


def test_the_sessions_made_here_leave_dataframe_debugging_off(spark) -> None:
    """PySpark's DataFrame debugging captures the Python call site of every column function and DataFrame
    method in a classic session (py4j calls each: a fifth of a small round's time); the local and
    cluster sessions made here turn it off. A Connect server's own configuration decides it there."""
    from diffstore.spark.session import DATAFRAME_DEBUGGING

    if os.environ.get(REMOTE_ENV):
        pytest.skip("a Spark Connect server's static setting, not the client's")
    assert spark.conf.get(DATAFRAME_DEBUGGING) == "false"


LONG_RUNNING_SCRIPT = """
import sys, psutil
from diffstore.spark import local_session
spark = local_session("jit", cores=1, long_running=sys.argv[1] == "long")
java = [p for p in psutil.Process().children(recursive=True) if p.name() == "java"]
print(" ".join(java[0].cmdline()))
spark.stop()
"""


@pytest.mark.parametrize("kind", ["short", "long"])
def test_a_long_running_local_session_gives_the_jvm_its_full_jit(kind: str, tmp_path) -> None:
    """A young session starts faster with C1 only; a long-running one (``--watch``) runs its rounds faster
    with the full JIT. Checked on the driver JVM's own command line, in a process of its own."""
    import subprocess
    import sys

    script = tmp_path / "session.py"
    script.write_text(LONG_RUNNING_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), kind], capture_output=True, text=True, timeout=180, check=True
    )
    command = done.stdout.strip().splitlines()[-1]
    assert "-XX:+UseSerialGC" in command
    assert ("-XX:TieredStopAtLevel=1" in command) == (kind == "short")
