"""``lookup``'s executor side: the values of a partition's keys at a pinned generation, by range queries.

The runner hands each task the keys of one key range, sorted (see :meth:`Transform._lookup
<diffstore.spark.transform.Transform._lookup>`), so the keys a task looks up are dense in the records
it reads. The task streams: as soon as a chunk of keys has arrived it is fetched with one range query
(``query/`` from the chunk's first key to just after its last), in a background thread, while Spark
is still sending the next keys and taking the previous chunk's values. Duplicate keys (adjacent, the
input being sorted) are looked up once, so the output holds each key once.

A chunk whose range holds too many other records (sparse keys) is halved until its query fits in one
page, down to single keys, so the work stays near min(records in the key range, number of keys).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa

from diffstore.client import Collection
from diffstore.errors import InvalidRequest
from diffstore.spark._clients import shared_client
from diffstore.spark._prefetch import ahead

CHUNK = 5_000
"""Keys per range query: with dense keys one page (the server's maximum is 10,000 items)."""

SCHEMA = "key binary, value binary"
_ARROW = pa.schema([pa.field("key", pa.binary()), pa.field("value", pa.binary())])


def fetch(collection: Collection, generation_id: bytes, chunk: list[bytes]) -> dict[bytes, bytes]:
    """The records of ascending ``chunk`` present at ``generation_id``, with range queries."""
    limit = min(10_000, 2 * len(chunk) + 16)
    page = collection.query_page_columns(generation_id, None, chunk[0], chunk[-1] + b"\0", limit)
    if page.cursor is None or len(chunk) == 1:
        return dict(zip(page.keys, page.values, strict=True))
    middle = len(chunk) // 2
    return fetch(collection, generation_id, chunk[:middle]) | fetch(collection, generation_id, chunk[middle:])


def sorted_chunks(batches: Iterator[pa.RecordBatch], size: int) -> Iterator[list[bytes]]:
    """Distinct keys of sorted ``key`` batches in ascending chunks of ``size`` (nulls are skipped).

    Raises:
        InvalidRequest: a key arrived below its predecessor (the input was not sorted).
    """
    chunk: list[bytes] = []
    last: bytes | None = None
    for batch in batches:
        for key in batch.column("key").to_pylist():
            if key is None or key == last:
                continue
            if last is not None and key < last:
                raise InvalidRequest("lookup keys must arrive sorted within their partition")
            last = key
            chunk.append(key)
            if len(chunk) >= size:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def lookup_partition(
    url: str, codec: str, collection: str, generation_id: bytes, token: str | None = None
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of ``lookup``: sorted keys in, ``(key, value)`` at the generation out
    (``value`` null for a key absent there)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        handle = shared_client(url, codec, token).collection(collection)

        def results() -> Iterator[pa.RecordBatch]:
            for chunk in sorted_chunks(batches, CHUNK):
                found = fetch(handle, generation_id, chunk)
                values = [found.get(key) for key in chunk]
                yield pa.RecordBatch.from_arrays(
                    [pa.array(chunk, pa.binary()), pa.array(values, pa.binary())], schema=_ARROW
                )

        # keys are read and fetched in a thread while Spark takes the previous chunk's values
        yield from ahead(results())

    return run
