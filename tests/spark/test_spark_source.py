"""The ``diffstore`` data source against the HTTP API's own answers (read with plain httpx JSON)."""

from __future__ import annotations

import base64
from typing import Any

import httpx
from helpers_spark import commit_items, user_key

from diffstore import Store


def _es(data: dict[str, Any] | None) -> bytes | None:
    if data is None:
        return None
    if data.get("encoding") == "base64":
        return base64.b64decode(data["value"])
    return str(data["value"]).encode()


def _b64(data: bytes) -> dict[str, str]:
    return {"value": base64.b64encode(data).decode(), "encoding": "base64"}


def _http_pages(url: str, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every item of a paged query or diff, following cursors, straight from the JSON API."""
    items: list[dict[str, Any]] = []
    with httpx.Client(base_url=url) as http:
        answer = http.post(path, json={**body, "limit": 7}).raise_for_status().json()
        while True:
            items.extend(answer["items"])
            if "cursorId" not in answer:
                return items
            answer = http.get(f"{path}{answer['cursorId']}").raise_for_status().json()


def _rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted(tuple(bytes(v) if v is not None else None for v in row) for row in df.collect())


def test_snapshot_and_diff_match_the_http_api(spark, server_url, store: Store, names) -> None:
    name = names["A"]
    store.create_collection(name, manual=True)
    first = commit_items(
        store, name, [(user_key(i), b"v1-%d" % i) for i in range(50)] + [(b"", b"empty key")]
    )
    changes: list[tuple[bytes, bytes | None]] = [(user_key(i), None) for i in range(0, 50, 5)]
    changes += [(user_key(i), b"\x00\xffv2") for i in range(1, 50, 7)] + [(user_key(99), b"")]
    second = commit_items(store, name, changes)
    path = f"/collections/{name}"

    def base() -> Any:  # DataFrameReader.option mutates the reader: build a fresh one each time
        return spark.read.format("diffstore").option("url", server_url).option("collection", name)

    for partitions in ("1", "3"):
        snap = base().option("partitions", partitions).load()
        assert snap.columns == ["key", "value"]
        expected = _http_pages(server_url, f"{path}/query/", {})
        assert _rows(snap) == sorted((_es(i["key"]), _es(i["value"])) for i in expected)

    old = (
        base()
        .option("generationIdEncoding", "base64")
        .option("generationId", base64.b64encode(first).decode())
        .option("partitions", "3")
        .load()
    )
    expected = _http_pages(server_url, f"{path}/query/", {"generationId": _b64(first)})
    assert _rows(old) == sorted((_es(i["key"]), _es(i["value"])) for i in expected)

    diff = (
        base()
        .option("generationIdEncoding", "base64")
        .option("fromGenerationId", base64.b64encode(first).decode())
        .option("toGenerationId", base64.b64encode(second).decode())
        .option("partitions", "3")
        .load()
    )
    assert diff.columns == ["key", "fromValue", "toValue"]
    body = {"fromGenerationId": _b64(first), "toGenerationId": _b64(second)}
    expected = _http_pages(server_url, f"{path}/diff/", body)
    wanted = sorted((_es(i["key"]), _es(i["fromValue"]), _es(i["toValue"])) for i in expected)
    assert _rows(diff) == wanted and len(wanted) == len({key for key, _ in changes})

    # from a reader: a null reader diffs from the very beginning
    store.collection(name).create_reader("spark_probe", None, None)
    from_reader = base().option("fromReader", "spark_probe").option("partitions", "2").load()
    expected = _http_pages(server_url, f"{path}/diff/", {"fromReader": {"readerName": "spark_probe"}})
    assert _rows(from_reader) == sorted(
        (_es(i["key"]), _es(i["fromValue"]), _es(i["toValue"])) for i in expected
    )


def test_writing_commits_once_with_reader_updates(spark, server_url, store: Store, names) -> None:
    name = names["C"]
    c = store.create_collection(name, manual=True)
    c.create_reader("from_x", "hstream://elsewhere", None)  # a target need not be a collection
    generation = b"\x00\x00\x00\x00\x00\x00\x00\x01"
    c.start_generation(generation)
    rows = [(user_key(i), None if i % 4 == 0 else b"w%d" % i) for i in range(40)]
    frame = spark.createDataFrame(rows, "key binary, value binary").repartition(3)
    updates = '[{"readerName": "from_x", "generationId": "Zw==", "expectedGenerationId": null}]'
    (
        frame.write.format("diffstore")
        .mode("append")
        .option("url", server_url)
        .option("collection", name)
        .option("generationIdEncoding", "base64")
        .option("generationId", base64.b64encode(generation).decode())
        .option("updateReaders", updates)
        .option("batchRows", "7")
        .save()
    )
    c = store.collection(name)
    assert c.generation_id == generation and c.next_generation_id is None
    assert {r.name: r.generation_id for r in c.readers()} == {"from_x": b"g"}
    assert {r.key: r.value for r in c.query()} == {k: v for k, v in rows if v is not None}
