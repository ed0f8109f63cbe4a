"""Small rounds without Spark reads: a source's diff of at most ``local_diff_max_rows`` changes is read on
the driver.

Reading a diff through the data source costs a Spark job (plan, tasks, Python workers) and the runner
then checkpoints it (a second job), per source and round. For a few thousand changes that is most of a
round's time, while one ``diff`` page answers them in milliseconds. So the runner first reads the round's
pinned range on the driver, in pages of up to 10,000, while it holds at most ``local_diff_max_rows``
changes; when the pages hold the whole range (the full ``toGenerationId``), their columns become the diff
DataFrame as local data (``createDataFrame`` of an Arrow table: already in memory, nothing to checkpoint).
Otherwise the pages are dropped and the diff is read by Spark tasks as before — at most
``local_diff_max_rows`` + one page read twice for a large round, and none when the source's history
already says that one of the range's generations wrote more keys than that (:func:`wrote_more_than`).

A round whose every diff was read this way is a small round through and through: its sources' lookups
run on the driver (the keys collected — no Spark job at all when Spark folded their plan into a local
relation —, their values fetched with ``getMany`` — most of them while the diffs were read
(:mod:`~diffstore.spark.lookahead`) —, handed back as local data, which Spark then joins by
broadcast), the target's lookup in the result's own job — from the whole target read on the driver
when it is small, else by executors (:func:`small_round_lookup`) —, and its result is collected to the
driver (``toArrow``) and written with putMany from here into the round's open generation, instead of
by a Python data source write (planning processes, tasks, a commit process: about a second even for a
handful of rows). The result of a small round is assumed to be small too — a job that turns a few
changes into millions of rows should set ``local_diff_max_rows=0``.

While a small round runs, the session plans its queries for small data (:data:`SMALL_ROUND_CONF`, restored
afterwards): adaptive execution off, since it runs every shuffle stage of a query as a job of its own and
re-plans between them, and one shuffle partition instead of ``spark.sql.shuffle.partitions``. On the
loaded 2-core test machine that took a round of 1,000 changes of the example job from 5.9 s to 2.4 s
(``benchmarks/small_rounds.py``); the joins of local relations are broadcast either way. And the
optimizer rule ``ConvertToLocalRelation`` is excluded (added to any the session excludes): it evaluates
the projections and filters over local data on the driver while the query is optimized, row by row, and
each query of the round (the lookups' keys, the result) does it again — ~40 us a row: a bare
``country_totals`` over 10,000 local changes spent 0.5 s optimizing its result with the rule and 0.16-0.2 s
without (1.2-1.4 s against 0.2-0.3 s at 30,000), while at 1,000 changes both took 0.1-0.2 s.
For the same reason an Arrow table of more than 128 KiB (a few thousand changes) becomes an RDD of its
batches, not a local relation (``spark.sql.execution.arrow.localRelationThreshold``; Spark's default is
48 MiB): a local relation is a plan node whose rows are one of its fields, and each analyzer and optimizer
rule that maps the plan's expressions walks those rows too — and every DataFrame the user's function
builds is analyzed. Rounds of 10,000 changes took 0.96-1.06 s against 1.11-1.23 s. Smaller tables stay
local: there the walk costs less than the RDD's task in every job that reads it, and an empty one lets
the optimizer drop the joins with it. Over Spark Connect the server builds local relations from the
client's data whatever this setting says.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from diffstore.client import Collection
from diffstore.errors import InvalidRequest
from diffstore.spark.arrow_columns import binary_batch
from diffstore.spark.lookahead import Lookahead
from diffstore.spark.lookup import GET_MANY_KEYS, get_many
from diffstore.spark.plan import TARGET, Lookup, Pinned, RoundContext, RoundPlan, SourceRange, pinned_alias
from diffstore.spark.schemas import DIFF_ARROW, LOOKUP_ARROW, LOOKUP_SCHEMA
from diffstore.wire_columns import BinaryColumn

PAGE_ROWS = 10_000
"""The server's largest diff page."""


def read_small_diff(
    context: RoundContext, source: SourceRange, on_page: Callable[[BinaryColumn], None] | None = None
) -> pa.Table | None:
    """The whole diff of ``source``'s pinned range as an Arrow table, read page by page on the driver, or
    ``None`` when it holds more than ``context.local_diff_max_rows`` changes (or that is 0), or the
    server's answer stops short of the range's end (the range is then read by Spark tasks).
    ``on_page`` is given each page's keys as it arrives (:class:`~diffstore.spark.lookahead.Lookahead`)."""
    limit = context.local_diff_max_rows
    if limit <= 0 or source.empty:
        return None
    handle = context.handle(source.collection)
    if wrote_more_than(handle, source, limit):
        return None
    page = handle.diff_page_columns(
        source.from_generation_id or b"", source.to_generation_id, limit=min(limit, PAGE_ROWS)
    )
    batches: list[pa.RecordBatch] = []
    rows = 0
    while page.to_generation_id == source.to_generation_id:
        rows += len(page.keys)
        if rows > limit:
            return None
        batches.append(binary_batch(DIFF_ARROW, page.keys, page.from_values, page.to_values))
        if on_page is not None:
            on_page(page.keys)
        if page.cursor is None:
            return pa.Table.from_batches(batches, schema=DIFF_ARROW)
        page = handle.diff_page_columns(cursor=page.cursor)
    return None


HISTORY_PEEK = 16
"""How many of a source's newest generations :func:`wrote_more_than` looks at (one history page)."""


def wrote_more_than(handle: Collection, source: SourceRange, limit: int) -> bool:
    """Whether one generation of ``source``'s range wrote more than ``limit`` keys, as the first page of its
    history says (``changed_keys``): its diff then holds more changes than a small round takes, except
    where keys were rewritten with the values they had (the round is then read by tasks, to the same
    result), and reading ``limit`` of them on the driver first would be wasted. ``False`` when the range
    reaches below that page, or the counts are unknown (an older server)."""
    infos, _ = handle.history(limit=HISTORY_PEEK)
    inside = False
    for info in infos:
        if info.generation_id == source.from_generation_id:
            break
        inside = inside or info.generation_id == source.to_generation_id
        if inside and info.changed_keys is not None and info.changed_keys > limit:
            return True
    return False


EXCLUDED_RULES = "spark.sql.optimizer.excludedRules"
"""A comma-separated list: :func:`session_conf` adds to the session's value instead of replacing it."""
ARROW_LOCAL_RELATION_THRESHOLD = "spark.sql.execution.arrow.localRelationThreshold"
"""The size in bytes below which ``createDataFrame`` of an Arrow table makes a local relation."""

SMALL_ROUND_CONF: Mapping[str, str] = {
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.shuffle.partitions": "1",
    EXCLUDED_RULES: "org.apache.spark.sql.catalyst.optimizer.ConvertToLocalRelation",
    ARROW_LOCAL_RELATION_THRESHOLD: str(128 * 1024),
}
"""The session's SQL settings while a small round runs (see the module doc)."""


@contextmanager
def session_conf(spark: Any, settings: Mapping[str, str]) -> Iterator[None]:
    """Sets runtime SQL ``settings`` on ``spark`` (classic or Connect) and restores the previous values
    after, even on failure. Other queries of the session that run meanwhile (other threads) see them too."""
    saved = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        old = saved[key]
        if key == EXCLUDED_RULES and old:
            value = ",".join(dict.fromkeys([*old.split(","), *value.split(",")]))
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)


PUT_BATCH = 5_000
FETCH_THREADS = 4
FETCH_SLICE_MIN = 500
"""A driver lookup of more keys than this fetches contiguous slices of them in ``FETCH_THREADS`` threads."""


def write_small_result(context: RoundContext, plan: RoundPlan, result: DataFrame) -> int:
    """Collects a small round's result (``key``, ``value``) and puts it into the round's open generation
    from the driver (fenced by the round's lease); returns the number of rows."""
    table = result.toArrow()
    keys, values = table.column("key").to_pylist(), table.column("value").to_pylist()
    if any(key is None for key in keys):
        raise InvalidRequest("a diffstore key must not be null")
    target = context.handle(context.target)
    items = list(zip(keys, values, strict=True))
    for start in range(0, len(items), PUT_BATCH):
        target.put_many(items[start : start + PUT_BATCH], generation_id=plan.generation_id, lease=plan.lease)
    return len(items)


ARROW_KEYS_MIN_ROWS = 2_000
"""A driver lookup in a round whose diffs hold more changes than this collects its keys with
``toArrow`` (one Spark job more; ~15 us a key less than ``collect``'s Row objects)."""


def driver_lookup(
    spark: SparkSession,
    handle: Callable[[str], Collection],
    pinned: Mapping[str, Pinned],
    diff_rows: int = 0,
    lookahead: Lookahead | None = None,
) -> Lookup:
    """``lookup`` run on the driver (small rounds, previews): the keys collected here, their values
    fetched from here with ``getMany`` where ``pinned`` says each alias reads (or taken from those
    ``lookahead`` fetched meanwhile), handed back as local data. ``diff_rows``, the changes in the
    round's diffs, says how many keys to expect at most (usually)."""

    def lookup(alias: str, keys: DataFrame) -> DataFrame:
        where = pinned_alias(pinned, alias)
        if diff_rows > ARROW_KEYS_MIN_ROWS:  # 10,000 keys: 0.13-0.16 s against 0.33-0.4 s by collect()
            column = keys.select("key").toArrow().column(0).to_pylist()
            wanted = sorted({key for key in column if key is not None})
        else:  # collect(): no Spark job when the keys' plan is a local relation with nothing to compute
            wanted = sorted({bytes(row[0]) for row in keys.select("key").collect() if row[0] is not None})
        collection = handle(where.collection)

        def fetch(chunk: list[bytes]) -> pa.Array:
            return get_many(collection, where.generation_id, chunk, where.phantom_id)

        def fetch_all(keys: list[bytes]) -> pa.Array:
            # contiguous slices fetched concurrently: the server answers several requests at once
            size = min(GET_MANY_KEYS, max(FETCH_SLICE_MIN, -(-len(keys) // FETCH_THREADS)))
            slices = [keys[start : start + size] for start in range(0, len(keys), size)]
            if len(slices) > 1:
                with ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="diffstore-lookup") as pool:
                    values = list(pool.map(fetch, slices))
            else:
                values = [fetch(chunk) for chunk in slices]
            return pa.concat_arrays(values) if values else pa.array([], pa.binary())

        found = lookahead.values(alias, wanted, fetch_all) if lookahead is not None else fetch_all(wanted)
        columns = [pa.array(wanted, pa.binary()), found]
        return spark.createDataFrame(pa.Table.from_arrays(columns, names=["key", "value"]), LOOKUP_SCHEMA)

    return lookup


TARGET_LOCAL_MAX_ROWS = 1_000
"""A target of at most this many records at the round's base is read whole on the driver (one query
page) for a small round's :data:`~diffstore.spark.plan.TARGET` lookup."""


def read_small_target(handle: Callable[[str], Collection], where: Pinned) -> pa.Table | None:
    """The whole target at ``where`` (its base generation) as an Arrow table (``key``, ``value``), read
    with one query page, or ``None`` when it holds more than :data:`TARGET_LOCAL_MAX_ROWS` records."""
    if not where.generation_id:  # nothing committed yet: an empty target
        return LOOKUP_ARROW.empty_table()
    page = handle(where.collection).query_page_columns(
        where.generation_id, where.phantom_id, limit=TARGET_LOCAL_MAX_ROWS
    )
    if page.cursor is not None:
        return None
    return pa.Table.from_batches([binary_batch(LOOKUP_ARROW, page.keys, page.values)])


def small_round_lookup(
    spark: SparkSession, driver: Lookup, executors: Lookup, target: Callable[[], pa.Table | None]
) -> Lookup:
    """A small round's ``lookup``: the sources' on the ``driver``; :data:`~diffstore.spark.plan.TARGET`'s
    from the whole ``target`` as local data when it is small (read once per round, on first use), else by
    the ``executors`` in the job that computes the result.

    A small target (the example's: a total per country) is joined in the result's plan as a local
    relation, which no Python worker reads. On the 2-core test machine the target's lookup by
    ``executors`` cost the example's round a Python stage (its task deserialization alone 0.1 s under
    load): at load ~6, rounds of 1,000 changes took 1.14 s against 1.58 s, of 10 changes 1.09 s against
    1.31 s (medians of 5, alternating in one session).

    A source's keys are usually picked from the local diffs by projections and filters, which Spark
    folds into local data: the driver collects them without a job. The target's keys are usually the
    result's own (the totals a round changes, computed by a join and an aggregation of everything
    else), and its values join the result last: collected on the driver, those keys would cost the
    whole computation once for the lookup and once more for the result (two jobs of the same join,
    and a broadcast job more). Left in the plan, the target's lookup reads its keys from the result's
    own aggregation (Spark reuses the exchange), so the round runs one job for the result. Measured
    with ``benchmarks/small_rounds.py`` (docs/spark.md).
    """

    whole: list[pa.Table | None] = []

    def lookup(alias: str, keys: DataFrame) -> DataFrame:
        if alias != TARGET:
            return driver(alias, keys)
        if not whole:
            whole.append(target())
        if whole[0] is None:
            return executors(alias, keys)
        # Every requested key once, its value from the target (null when absent), as a lookup answers.
        # Its keys are usually the result's own aggregation, which the result's job should compute once
        # (Spark reuses the aggregation's exchange, as for the executors' lookup):
        # * hinted, so that the result's join with it is shuffled, not broadcast: a broadcast would run
        #   the keys' plan, and the user's computation in it, as a job of its own;
        # * the value behind a nondeterministic no-op (a partition id is never negative), over which
        #   Spark pushes no filter: a filter that the result's join infers (``key`` not null) would
        #   otherwise be pushed into the keys' plan, make it differ from the result's, and run the
        #   user's computation again for the lookup (``mapInArrow`` stops the push-down the same way).
        known = spark.createDataFrame(whole[0], LOOKUP_SCHEMA)
        joined = keys.select("key").distinct().join(known, "key", "left")
        barrier = F.when(F.spark_partition_id() >= 0, F.col("value")).alias("value")
        return joined.select("key", barrier).hint("shuffle_hash")

    return lookup
