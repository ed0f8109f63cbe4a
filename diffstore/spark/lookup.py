"""``lookup``'s executor side: the values of a partition's keys at a pinned generation, by range queries.

The runner hands each task the keys of one key range, sorted (see :meth:`Transform._lookup
<diffstore.spark.transform.Transform._lookup>`), so the keys a task looks up are dense in the records
it reads. The task streams: as soon as a chunk of keys has arrived it is fetched with one range query
(``query/`` from the chunk's first key to just after its last), in a background thread, while Spark
is still sending the next keys and taking the previous chunk's values. Duplicate keys (adjacent, the
input being sorted) are looked up once, so the output holds each key once.

A chunk is read page by page, each page starting at the first key not resolved yet (gaps between
wanted keys are skipped, never paged through). A range page costs about 2-4 us per record it holds, a
``getMany`` (many point reads in one request, beyond the contract: docs/protocol.md) about 5-10 us per
key (10,000 keys in 50-110 ms against 40,000 records in 160 ms, measured on a loaded 2-core machine), so
when a page resolved fewer than one wanted key per :data:`SPARSE_RECORDS` records, the rest of the chunk
is read by one ``getMany`` instead: the work stays near min(records between the keys, one point read
per key). (Before ``getMany`` the threshold was one key per 200 records, read by point ``get`` calls: 1%
of a collection's keys were paged through record by record.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from diffstore.client import Collection
from diffstore.errors import InvalidRequest
from diffstore.spark._clients import shared_client
from diffstore.spark._prefetch import ahead
from diffstore.spark.arrow_columns import binary_array
from diffstore.spark.schemas import LOOKUP_ARROW
from diffstore.tls import ShippedTls

CHUNK = 5_000
"""Keys per range query: with dense keys one page (the server's maximum is 10,000 items)."""


SPARSE_RECORDS = 4
"""Records per wanted key above which point reads beat paging through the range (see the module doc)."""

PAGE = 10_000
"""The server's largest page."""

PROBE = 1_024
"""Records of a chunk's first page: enough to tell sparse keys (fewer than 256 of them resolved) from dense
ones, at a tenth of a full page's cost; pages then grow fourfold while they pay."""


def fetch(collection: Collection, generation_id: bytes, chunk: pa.Array) -> pa.Array:
    """The values at ``generation_id`` of ascending, distinct, non-null keys ``chunk`` (a binary array): a
    binary array aligned with it, null where a key is absent. The pages' records are matched with the
    chunk's keys by Arrow (a hash of a page's keys), not key by key in Python."""
    page_keys: list[pa.Array] = []
    page_values: list[pa.Array] = []
    start, end = 0, len(chunk)
    last = chunk[end - 1].as_py() if end else b""
    limit = min(PROBE, 2 * end + 16)
    rest: list[bytes] = []
    while start < end:
        if end - start == 1:
            rest = [last]
            break
        page = collection.query_page_columns(generation_id, None, chunk[start].as_py(), last + b"\0", limit)
        page_keys.append(binary_array(page.keys))
        page_values.append(binary_array(page.values))
        if page.cursor is None or not page.keys:
            break  # the page reached the end of the chunk's range: the keys it did not hold are absent
        # the chunk is sorted: the keys at or below the page's last record are resolved
        resolved = start + pc.sum(pc.less_equal(chunk[start:], page_keys[-1][-1])).as_py()
        sparse = (resolved - start) * SPARSE_RECORDS < len(page.keys)
        start, limit = resolved, min(PAGE, 4 * limit)  # pages grow while they pay
        if sparse:
            rest = chunk[start:].to_pylist()
            break
    if rest:
        page_keys.append(pa.array(rest, pa.binary()))
        page_values.append(get_many(collection, generation_id, rest))
    if not page_keys:
        return pa.nulls(len(chunk), pa.binary())
    index = pc.index_in(chunk, value_set=pa.concat_arrays(page_keys))
    return pa.concat_arrays(page_values).take(index)


GET_MANY_KEYS = 10_000
"""Keys per ``getMany`` request (the server's maximum)."""


def get_many(
    collection: Collection, generation_id: bytes, keys: list[bytes], phantom_id: bytes | None = None
) -> pa.Array:
    """The values at ``generation_id`` (with ``phantom_id``) of ``keys``, by ``getMany`` requests: a binary
    array aligned with ``keys``, null where a key is absent."""
    parts = []
    for start in range(0, len(keys), GET_MANY_KEYS):
        answer = collection.get_many_columns(keys[start : start + GET_MANY_KEYS], generation_id, phantom_id)
        parts.append(binary_array(answer.values))
    return pa.concat_arrays(parts) if parts else pa.array([], pa.binary())


def sorted_chunks(batches: Iterator[pa.RecordBatch], size: int) -> Iterator[pa.Array]:
    """Distinct keys of sorted ``key`` batches in ascending binary arrays of ``size`` (nulls are skipped).

    Raises:
        InvalidRequest: a key arrived below its predecessor (the input was not sorted).
    """
    pending: list[pa.Array] = []
    held = 0
    last: bytes | None = None
    for batch in batches:
        keys = batch.column("key").drop_null()
        if keys.type != pa.binary():
            keys = keys.cast(pa.binary())
        if len(keys) > 1:
            earlier, later = keys[:-1], keys[1:]
            if pc.any(pc.less(later, earlier)).as_py():
                raise InvalidRequest("lookup keys must arrive sorted within their partition")
            keys = keys.filter(pa.concat_arrays([pa.array([True]), pc.not_equal(later, earlier)]))
        if len(keys) and last is not None:
            first = keys[0].as_py()
            if first < last:
                raise InvalidRequest("lookup keys must arrive sorted within their partition")
            if first == last:
                keys = keys[1:]
        if not len(keys):
            continue
        last = keys[-1].as_py()
        pending.append(keys)
        held += len(keys)
        if held >= size:
            whole = pa.concat_arrays(pending)
            cut = len(whole) - len(whole) % size
            for at in range(0, cut, size):
                yield whole[at : at + size]
            pending, held = ([whole[cut:]], len(whole) - cut) if cut < len(whole) else ([], 0)
    if held:
        yield pa.concat_arrays(pending)


def lookup_partition(
    url: str,
    codec: str,
    collection: str,
    generation_id: bytes,
    token: str | None = None,
    tls: ShippedTls | None = None,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of ``lookup``: sorted keys in, ``(key, value)`` at the generation out
    (``value`` null for a key absent there)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        handle = shared_client(url, codec, token, tls).collection(collection)

        def results() -> Iterator[pa.RecordBatch]:
            for chunk in sorted_chunks(batches, CHUNK):
                values = fetch(handle, generation_id, chunk)
                yield pa.RecordBatch.from_arrays([chunk, values], schema=LOOKUP_ARROW)

        # keys are read and fetched in a thread while Spark takes the previous chunk's values
        yield from ahead(results())

    return run
