"""The exactly-once A+B→C transform runner (SPEC §6) on Spark.

One round, all on the driver except the compute step:

1. read the target's readers ``from_<alias>`` (created, null, when missing) and, per source, pin the
   range (reader, end] where ``end`` is the ``toGenerationId`` of a diff probe to the current generation;
   when every range is empty the target has caught up;
2. pick ``g`` above C's current and open generations (:func:`~diffstore.rounds.next_generation_id`) and
   ``generation/start g`` with ``abortOutdated`` (a crashed run's leftovers are deleted);
3. build one diff DataFrame per source (the ``diffstore`` format with the pinned ids), call
   ``fn(spark, diffs, lookup)`` and write its result into ``g`` — executors putMany in parallel;
4. after every task succeeded, commit ``g`` with ``updateReaders`` carrying compare-and-set expectations.

The commit is one request that the server applies in one storage transaction, so C's records and its
readers move together: a round is applied exactly once or not at all. Any failure aborts ``g`` and retries.
A runner that finds another runner's generation open (it lost a race) waits on a long poll for that
runner to commit — up to ``lease_seconds`` — instead of aborting it, so two racing runners do not starve
each other; if the other one commits first, this one's commit fails on the compare-and-set.

High availability (``lease_ttl_ms``): runners of one target compete for the target's lease ``transform``
(:mod:`diffstore.lease_keeper`); only its holder runs rounds, each carrying the lease's fencing token on
generation/start and /commit (and its version in the generation id, see :mod:`diffstore.rounds`), so a
runner that lost the lease — paused, cut off — commits nothing any more. The others stand by; when the
holder dies, one of them acquires the lease within ttl + one poll and its first round starts with
``abortOutdated``: the dead runner's open generation is dropped, and the round continues from the readers
the last commit stored. Every source change is thus applied in exactly one committed generation.

Outages (``outage``, :mod:`diffstore.backoff`): with ``watch`` a server that does not answer does not end
:meth:`Transform.run`; it is tried again after the policy's back-off (one log line when the wait starts, one
when the server is back), and a runner with a lease then finds out whether it still holds it. A round cut
short by the outage committed nothing (its open generation is dropped by the next round's start).
"""

from __future__ import annotations

import functools
import logging
import os
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from diffstore.backoff import RetryPolicy
from diffstore.client import Collection
from diffstore.engine.types import LeaseToken
from diffstore.errors import Conflict, DiffstoreError, LeaseLost, NoSuchCollection
from diffstore.lease_keeper import LeaseConfig, LeaseGuard
from diffstore.outage import OutageWatch, is_outage
from diffstore.rounds import Round, ensure_readers, source_reader
from diffstore.spark._clients import new_client
from diffstore.spark._ranges import by_key_range
from diffstore.spark.datasource import register
from diffstore.spark.lookahead import Lookahead, LookaheadPolicy
from diffstore.spark.lookup import lookup_partition
from diffstore.spark.options import encode_generation, encode_split_keys
from diffstore.spark.plan import (
    NONCE_BYTES,
    TARGET,
    Lookup,
    Pinned,
    RoundPlan,
    SourceRange,
    TransformFn,
    next_round_number,
    pinned_alias,
    pinned_lookups,
    plan_sources,
)
from diffstore.spark.preview import DEFAULT_MAX_ROWS, DEFAULT_TTL_SECONDS, PhantomIdLike, run_preview
from diffstore.spark.schemas import DIFF_ARROW, DIFF_SCHEMA, LOOKUP_SCHEMA, WRITTEN_SCHEMA
from diffstore.spark.small_rounds import (
    SMALL_ROUND_CONF,
    driver_lookup,
    read_small_diff,
    read_small_target,
    session_conf,
    small_round_lookup,
    write_small_result,
)
from diffstore.spark.source import check_writable, describe_failure, put_partition, reader_updates
from diffstore.tls import CertFiles, ClientTls, ShippedTls

EventHook = Callable[[str, dict[str, Any]], None]

_MAX_CONFLICTS = 100
_log = logging.getLogger("diffstore.transform")

LEASE_NAME = "transform"
"""The target's lease that a runner with ``lease_ttl_ms`` holds while it runs rounds."""


class TransformError(DiffstoreError):
    """A round failed ``max_attempts`` times; the target is unchanged by it."""


@dataclass(frozen=True, slots=True)
class RoundStats:
    """What one committed round did."""

    generation_id: bytes
    ranges: dict[str, tuple[bytes | None, bytes]]
    rows_read: dict[str, int | None]
    rows_written: int | None
    attempts: int
    conflicts: int
    seconds: float
    failures: list[str] = field(default_factory=list)
    number: int | None = None
    """The round's number on the target, as its commit's metadata records it (``round``)."""


class Transform:
    """Keeps target ``C`` equal to ``fn`` applied to its sources, one exactly-once round at a time.

    Args:
        spark: the session that runs the compute step.
        url: the diffstore server, reachable from the driver and every executor.
        target: the manual collection to maintain.
        sources: alias → source collection; the target's reader ``from_<alias>`` tracks each one.
        fn: ``fn(spark, diffs, lookup)``; ``diffs[alias]`` has columns ``key``, ``fromValue``, ``toValue``;
            ``lookup(alias, keys_df)`` returns ``key``, ``value`` of the source at this round's end (or of
            the target before this round, with :data:`TARGET`). Returns C's changes: ``key``, ``value``
            (binary; a null value deletes the key).
        partitions: Spark partitions per diff read (key ranges from ``/splits``).
        codec: wire format between Spark and the server (``msgpack`` or ``json``).
        max_attempts: failures of one round (its own errors, not lost races) before giving up.
        lease_seconds: how long to wait for another runner's open generation before aborting it.
        poll_timeout_ms: long-poll timeout while watching.
        on_event: called with ``(event, details)`` at every step (progress display, tests).
        materialize_diffs: read each diff once into executor storage (``localCheckpoint``) before
            ``fn`` sees it, instead of once per use.
        splits_max_age_s: deprecated, without effect (a round's key ranges cut the keys its diff
            changed, which costs the server what the diff does; they were cut over the whole
            collection and reused for this long).
        token: bearer token of a token-protected server (driver and executors send it).
        ca_file, cert: for an ``https://`` server, the authority's PEM file and a client certificate
            (:class:`~diffstore.client.Client`'s; default ``DIFFSTORE_CA_FILE``, ...): read here and shipped
            to the executors by content, so they need not exist there.
        local_diff_max_rows: a source's diff with at most this many changes (read in pages of up to
            10,000) is read on the driver and handed to Spark as local data, instead of by Spark tasks
            that are then checkpointed: small rounds skip two Spark jobs per source. 0 turns it off.
            The default, 200,000, is below where Spark's parallel tasks catch up (at 10M keys a round of
            100,000 changes took 1.9-2.7 s as a small round against 3.4-3.9 s by tasks, of 500,000 about
            as long either way: ``benchmarks/RESULTS.md``); it costs the driver the diff's size in memory
            (keys and both values of each change), so a driver short of memory, or a job with large
            values, may set less.
        lease_ttl_ms: run as one of several runners of this target, exactly one active: rounds run only
            while this runner holds the target's lease ``transform`` (renewed every ttl/3 by a
            :class:`~diffstore.lease_keeper.LeaseGuard` thread) and carry its fencing token; the others stand
            by in :meth:`run` and take over within ttl + one poll (at most 250 ms) of the active one's
            death. ``None`` (default): no lease; racing runners are still safe (compare-and-set), but
            nothing makes one of them wait.
        small_round_conf: runtime SQL settings of the session while a small round runs, restored after
            (default :data:`~diffstore.spark.small_rounds.SMALL_ROUND_CONF`: no adaptive execution, one
            shuffle partition, the round's data above 128 KiB in RDDs rather than local relations that
            every analysis walks row by row; ``{}`` leaves the session alone).
        outage: how a ``watch`` rides out a server that does not answer (default: retry for ever with
            bounded back-off; ``give_up_after_s`` raises the error once the server stayed away that long).
        on_outage: told ``True`` when an outage starts and ``False`` when it ends (a metric).
        job: the job's name in each round's commit metadata (default: ``fn``'s ``module:qualname``).
            Every round's commit records ``job``, ``round`` (its number on the target: one more than the
            last commit's) and ``source.<alias>`` = ``from..to`` (:meth:`RoundPlan.metadata
            <diffstore.spark.plan.RoundPlan.metadata>`); ``diffstore log`` and ``history()`` show them.

    Any session works: the ``diffstore`` format is registered with ``spark`` here.
    """

    def __init__(
        self,
        spark: SparkSession,
        url: str,
        target: str,
        sources: Mapping[str, str],
        fn: TransformFn,
        *,
        partitions: int = 4,
        codec: str = "msgpack",
        max_attempts: int = 3,
        lease_seconds: float = 60.0,
        poll_timeout_ms: int = 10_000,
        on_event: EventHook | None = None,
        materialize_diffs: bool = True,
        splits_max_age_s: float | None = None,
        token: str | None = None,
        local_diff_max_rows: int = 200_000,
        lease_ttl_ms: int | None = None,
        job: str | None = None,
        small_round_conf: Mapping[str, str] = SMALL_ROUND_CONF,
        outage: RetryPolicy = RetryPolicy(),  # noqa: B008 - frozen, so one shared default is safe
        on_outage: Callable[[bool], None] | None = None,
        ca_file: str | None = None,
        cert: CertFiles | None = None,
    ) -> None:
        if not sources:
            raise ValueError("a transform needs at least one source")
        if TARGET in sources:
            raise ValueError(f"{TARGET!r} is reserved for the target")
        self.spark, self.url, self.target, self.fn = spark, url, target, fn
        self.sources = dict(sources)
        self.partitions, self.codec = partitions, codec
        self.max_attempts, self.lease_seconds, self.poll_timeout_ms = (
            max_attempts,
            lease_seconds,
            poll_timeout_ms,
        )
        self._on_event = on_event
        self.materialize_diffs = materialize_diffs
        if splits_max_age_s is not None:
            warnings.warn(
                "splits_max_age_s has no effect: a round's key ranges cut the keys its diff changed",
                DeprecationWarning,
                stacklevel=2,
            )
        self.token = token
        self.tls_files = ClientTls.resolve(ca_file, cert, os.environ)
        self.tls = ShippedTls.read(self.tls_files)  # what executors' clients load
        self.local_diff_max_rows = local_diff_max_rows
        self.lease = None if lease_ttl_ms is None else LeaseConfig(LEASE_NAME, ttl_ms=lease_ttl_ms)
        self._guard: LeaseGuard | None = None
        self._guard_client: Any = None
        self._token: LeaseToken | None = None  # the lease this runner's rounds carry
        self._client = new_client(url, codec, token, self.tls)
        register(spark)
        self._handles: dict[str, Collection] = {}
        self.small_round_conf = dict(small_round_conf)
        self.job = job or f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"
        self._last_round: tuple[bytes, int] | None = None  # (generation, number) of this runner's last commit
        self._lookahead = LookaheadPolicy()  # which sources' lookups small rounds fetch ahead
        self.outage_watch = OutageWatch(f"the diffstore server {url}", outage, _log, on_outage)

    def close(self) -> None:
        """Releases the lease, if held (a standby takes over at once), and closes the driver's clients."""
        if self._guard is not None:
            self._guard.close()
            self._guard = None
            self._guard_client.close()
        self._client.close()

    def handle(self, name: str) -> Collection:
        """The driver's handle on a collection (looked up once; it raises NoSuchCollection)."""
        handle = self._handles.get(name)
        if handle is None:
            handle = self._handles[name] = self._client.collection(name)
        return handle

    def _state(self, name: str) -> tuple[bytes, bytes | None]:
        """A collection's current and open generations."""
        return self.handle(name).generation_state()

    def event(self, name: str, **details: Any) -> None:
        """Tells ``on_event`` (the runner's steps and those of :mod:`~diffstore.spark.small_rounds` and
        :mod:`~diffstore.spark.preview`, which take the runner as their ``RoundContext``)."""
        if self._on_event is not None:
            self._on_event(name, details)

    # -- the pure-ish steps ---------------------------------------------------------------------------

    def _readers(self) -> dict[str, bytes | None]:
        """The target's readers, creating missing ones (null) so that GC of the sources is held back."""
        target = self.handle(self.target)
        if not target.state().manual:
            raise NoSuchCollection(f"the target {self.target!r} must be a manual collection")
        names = {alias: source_reader(alias) for alias in self.sources}
        stored = ensure_readers(target, {names[alias]: c for alias, c in self.sources.items()})
        return {alias: stored[names[alias]].generation_id for alias in self.sources}

    def _plan(self) -> tuple[Round, RoundPlan] | None:
        readers = self._readers()
        ends = {
            alias: self.handle(collection).diff_page_columns(readers[alias] or b"", limit=1).to_generation_id
            for alias, collection in self.sources.items()
        }
        ranges = plan_sources(self.sources, readers, ends)
        if ranges is None:
            return None
        self.event("planned", ranges={r.alias: (r.from_generation_id, r.to_generation_id) for r in ranges})
        round_ = Round.next(self.handle(self.target), os.urandom(NONCE_BYTES), lease=self._token)
        return round_, RoundPlan(round_.generation_id, round_.base_generation_id, ranges, round_.lease)

    def _cuts(self, plan: RoundPlan) -> list[bytes]:
        """The key ranges of this round: ``/splits`` of the keys its first non-empty source's diff changed.

        That source's diff is read by these ranges, and every lookup is partitioned by them too (its keys
        come from the diffs). The server cuts the diff's changed keys, so this costs what the diff does
        (a cut of the keys visible at the range's end read the whole collection: seconds per million keys).
        """
        source = next((s for s in plan.sources if not s.empty), None)
        if source is None or self.partitions < 2:
            return []
        return self.handle(source.collection).splits(
            self.partitions, source.to_generation_id, from_generation_id=source.from_generation_id or b""
        )

    def _diff_frame(self, source: SourceRange, cuts: list[bytes] | None) -> DataFrame:
        """The diff of one source over its pinned range (no server call at all when it is empty)."""
        if source.empty:
            # from an empty Arrow table: a local relation, not an RDD that runs Python workers per use
            return self.spark.createDataFrame(DIFF_ARROW.empty_table(), DIFF_SCHEMA)
        reader = (
            self.spark.read.format("diffstore")
            .option("url", self.url)
            .option("collection", source.collection)
            .option("codec", self.codec)
            .option("generationIdEncoding", "base64")
            .option("fromGenerationId", encode_generation(source.from_generation_id or b""))
            .option("toGenerationId", encode_generation(source.to_generation_id))
            .option("partitions", str(self.partitions))
        )
        if self.token is not None:
            reader = reader.option("token", self.token)
        if self.tls_files.ca_file is not None:
            reader = reader.option("caFile", self.tls_files.ca_file)
        if self.tls_files.cert is not None:
            reader = reader.option("clientCert", self.tls_files.cert[0])
            reader = reader.option("clientKey", self.tls_files.cert[1])
        if cuts is not None:
            reader = reader.option("splitKeys", encode_split_keys(cuts))
        return reader.load()

    def _lookup(self, pinned: Mapping[str, Pinned], cuts: list[bytes] | None) -> Lookup:
        """``lookup`` run by executors, reading where ``pinned`` says: each task reads the values of one
        key range's keys (``cuts``), or with ``cuts=None`` of the keys its partition holds after a
        ``distinct`` (a small round's :data:`TARGET` lookup, see
        :func:`~diffstore.spark.small_rounds.small_round_lookup`)."""

        def lookup(alias: str, keys: DataFrame) -> DataFrame:
            where = pinned_alias(pinned, alias)
            if cuts is None:
                # equal keys in one partition (each looked up once), with no shuffle of its own when
                # the keys come out of an aggregation by them, as a result's keys do
                ranged = keys.select("key").distinct().sortWithinPartitions("key")
            else:
                # Each task looks up the keys of one of the round's key ranges (routed by an expression,
                # not repartitionByRange, whose sampling job would evaluate the upstream plan once more):
                # a task's sorted keys are then dense in its range and each record is read once.
                ranged = by_key_range(keys.select("key"), "key", cuts).sortWithinPartitions("key")
            return ranged.mapInArrow(
                lookup_partition(
                    self.url, self.codec, where.collection, where.generation_id, self.token, self.tls
                ),
                LOOKUP_SCHEMA,
            )

        return lookup

    def _run_job(self, plan: RoundPlan) -> tuple[dict[str, int | None], int | None]:
        pinned = pinned_lookups(plan, self.target)
        lookahead = self._lookahead.start(self.handle, pinned, [s.alias for s in plan.sources])
        try:
            local = {
                s.alias: read_small_diff(self, s, functools.partial(lookahead.offer, s.alias))
                for s in plan.sources
                if not s.empty
            }
            if all(table is not None for table in local.values()):
                answer = self._run_small(plan, local, pinned, lookahead)
                self._lookahead.learn(lookahead)
                self.event("lookahead", fetched=sorted(lookahead.fetched), taken=dict(lookahead.taken))
                return answer
        finally:
            lookahead.close()
        cuts = self._cuts(plan)
        first = next((s.alias for s in plan.sources if not s.empty), None)
        diffs: dict[str, DataFrame] = {}
        # Counted by the runner itself, with public calls only (no Observation, whose "did it run" needs
        # the JVM's handle and does not exist over Spark Connect): local tables by their length, a
        # materialized diff by a count of its checkpoint; a diff left lazy is not counted (None).
        rows_read: dict[str, int | None] = {}
        for s in plan.sources:
            table = local.get(s.alias)
            if s.empty:
                diffs[s.alias], rows_read[s.alias] = self._diff_frame(s, None), 0
            elif table is not None:  # already in driver memory: no read job, no checkpoint
                diffs[s.alias] = self.spark.createDataFrame(table, DIFF_SCHEMA)
                rows_read[s.alias] = len(table)
            elif self.materialize_diffs:
                # Read each diff over HTTP exactly once: jobs use a diff several times (joins, lookups'
                # inputs), and every use would otherwise page through the server again.
                frame = self._diff_frame(s, cuts if s.alias == first else None).localCheckpoint(eager=True)
                diffs[s.alias], rows_read[s.alias] = frame, frame.count()
            else:
                diffs[s.alias] = self._diff_frame(s, cuts if s.alias == first else None)
                rows_read[s.alias] = None
        self.event("read", generation=plan.generation_id, rows_read=rows_read)
        result = self.fn(self.spark, diffs, self._lookup(pinned, cuts)).select("key", "value")
        return rows_read, self._write(plan, result)

    def _write(self, plan: RoundPlan, result: DataFrame) -> int:
        """Writes a round's result into its open generation from the executors; returns the row count.

        Each task puts its rows (:func:`~diffstore.spark.source.put_partition`) and answers one row, its
        count, which the driver sums: the count of what was written, from the one job that wrote it,
        with no Spark-side metrics (those need the JVM's handles, absent over Spark Connect). A failed
        or speculative attempt's answer is dropped by Spark, and its puts are harmless (the same keys
        again, in the same uncommitted generation). Not the data source's writer: its planning and its
        separate commit process cost most of a second, and the runner commits itself. Every put carries
        the round's lease: the generation refuses writes without the lease it was started under.
        """
        check_writable(result.schema)
        put = put_partition(
            self.url, self.codec, self.target, plan.generation_id, self.token, lease=plan.lease, tls=self.tls
        )
        return sum(int(row[0]) for row in result.mapInArrow(put, WRITTEN_SCHEMA).collect())

    def _run_small(
        self,
        plan: RoundPlan,
        local: Mapping[str, pa.Table | None],
        pinned: Mapping[str, Pinned],
        lookahead: Lookahead,
    ) -> tuple[dict[str, int | None], int | None]:
        """A round whose every diff was read on the driver (:mod:`diffstore.spark.small_rounds`).

        Its diffs are local relations (an empty diff too, from an empty Arrow table: Spark's optimizer
        then drops the joins with it), nothing is observed or checkpointed (the sizes are known), the
        sources' lookups run on the driver with ``getMany``, the target's in the result's own job, and
        the result is collected and written from here: the only Spark jobs are those of the sources'
        lookups' keys (none for keys Spark's optimizer finds empty) and of the result. The lookups read
        where ``pinned`` says; the sources' take the values ``lookahead`` fetched while the diffs were read.
        """
        empty = DIFF_ARROW.empty_table()
        tables = {s.alias: t if (t := local.get(s.alias)) is not None else empty for s in plan.sources}
        rows_read: dict[str, int | None] = {alias: len(table) for alias, table in tables.items()}
        self.event("read", generation=plan.generation_id, rows_read=rows_read)
        with session_conf(self.spark, self.small_round_conf):
            diffs = {alias: self.spark.createDataFrame(t, DIFF_SCHEMA) for alias, t in tables.items()}
            rows = sum(len(t) for t in tables.values())
            lookup = small_round_lookup(
                self.spark,
                driver_lookup(self.spark, self.handle, pinned, rows, lookahead),
                self._lookup(pinned, None),
                lambda: read_small_target(self.handle, pinned[TARGET]),
            )
            result = self.fn(self.spark, diffs, lookup).select("key", "value")
            return rows_read, write_small_result(self, plan, result)

    # -- rounds ---------------------------------------------------------------------------------------

    def _round_number(self, base: bytes) -> int:
        """The number of a round on top of the target's generation ``base``: one more than this runner's
        last round when that is ``base`` (no request), else one more than the ``round`` of ``base``'s
        commit metadata (another runner's, a restarted one's), else 1."""
        if self._last_round is not None and self._last_round[0] == base:
            return self._last_round[1] + 1
        previous = None
        if base:
            infos, _ = self.handle(self.target).history(limit=1)
            if infos and infos[0].generation_id == base:
                previous = infos[0].metadata
        return next_round_number(previous)

    def _wait_for_other(self, mine: bytes | None) -> None:
        """Waits (long poll, up to the lease) while another runner's generation is open on the target."""
        deadline = time.monotonic() + self.lease_seconds
        while True:
            current, next_open = self._state(self.target)
            if next_open is None or next_open == mine:
                return
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                return
            self.event("waiting", other=next_open)
            self._client.wait_for_change({self.target: current}, min(left_ms, self.poll_timeout_ms))

    def run_round(self) -> RoundStats | None:
        """Runs one round to its commit, retrying failures; ``None`` when the target has caught up.

        Raises:
            TransformError: the round failed ``max_attempts`` times (the target is left as it was).
        """
        started = time.monotonic()
        failures: list[str] = []
        attempts = conflicts = 0
        while True:
            attempts += 1
            planned = self._plan()
            if planned is None:
                return None
            round_, plan = planned
            g = plan.generation_id
            try:
                number = self._round_number(plan.base_generation_id)
                round_.start()
                self.event("started", generation=g, attempt=attempts, round=number)
                rows_read, rows_written = self._run_job(plan)
                self.event("written", generation=g, rows_read=rows_read, rows_written=rows_written)
                round_.commit(reader_updates(plan.reader_updates()), plan.metadata(self.job, number))
            except Exception as exc:  # noqa: BLE001 - every failure aborts the round; the cause decides the retry
                lost = not round_.abort() or isinstance(exc, Conflict)
                if isinstance(exc, LeaseLost) and self._token is not None:
                    self.event("failed", generation=g, error=describe_failure(exc), conflict=True)
                    raise  # another runner owns the target now: run() stands by
                failures.append(describe_failure(exc))
                self.event("failed", generation=g, error=failures[-1], conflict=lost)
                if lost:
                    conflicts += 1
                    if conflicts > _MAX_CONFLICTS:
                        raise TransformError(f"lost {conflicts} races in a row: {failures[-1]}") from exc
                    if self._token is None:  # with the lease, any other open generation is a dead one's
                        self._wait_for_other(None)
                    continue
                if len(failures) - conflicts >= self.max_attempts:
                    raise TransformError(f"round failed {self.max_attempts} times: {failures[-1]}") from exc
                continue
            stats = RoundStats(
                generation_id=g,
                ranges={s.alias: (s.from_generation_id, s.to_generation_id) for s in plan.sources},
                rows_read=rows_read,
                rows_written=rows_written,
                attempts=attempts,
                conflicts=conflicts,
                seconds=time.monotonic() - started,
                failures=failures,
                number=number,
            )
            self._last_round = (g, number)
            self.event("committed", stats=stats)
            return stats

    def run(
        self,
        watch: bool = False,
        should_stop: Callable[[], bool] | None = None,
        max_rounds: int | None = None,
    ) -> list[RoundStats]:
        """Runs rounds until every reader has caught up; with ``watch`` then waits for sources to move.

        Args:
            watch: keep going after catching up, woken by long polls on the sources.
            should_stop: checked between rounds and polls; ``True`` ends the run.
            max_rounds: stop after this many committed rounds.

        With ``lease_ttl_ms`` the runner stands by until it holds the target's lease (event ``standby``,
        then ``active``), runs rounds only while it holds it, and stands by again when it loses it
        (event ``lease_lost``).

        With ``watch`` a server that cannot be reached (a refused, reset or timed-out call, a 503
        ``overloaded``; or a round that failed for that reason) does not end the run: it is tried again
        after the ``outage`` policy's back-off, with one log line when the wait starts and one when the
        server is back, and a runner with a lease then stands by if its lease expired meanwhile.

        Returns:
            The stats of every committed round.
        """
        rounds: list[RoundStats] = []
        while not (should_stop and should_stop()):
            try:
                if self.lease is not None and not self._hold_lease(should_stop):
                    break
                try:
                    stats = self.run_round()
                except LeaseLost as exc:
                    self._lose_lease(str(exc), fenced=True)
                    continue
                self.outage_watch.succeeded()
                if stats is not None:
                    rounds.append(stats)
                    if max_rounds is not None and len(rounds) >= max_rounds:
                        break
                    continue
                self.event("caught_up", rounds=len(rounds))
                if not watch:
                    break
                self._wait_for_sources()
                self.outage_watch.succeeded()
            except DiffstoreError as exc:
                # a watcher outlives the server's (or the link's) absence: it tries again, and with a lease
                # finds out on return whether it still holds it (a one-off run fails at once)
                cause = exc.__cause__ if isinstance(exc, TransformError) else exc
                if not (watch and cause is not None and is_outage(cause)):
                    raise
                self._pause(self.outage_watch.failed(exc), should_stop)  # raises exc past the limit
        return rounds

    @staticmethod
    def _pause(seconds: float, should_stop: Callable[[], bool] | None) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not (should_stop and should_stop()):
            time.sleep(0.05)

    def preview(
        self,
        phantoms: Mapping[str, PhantomIdLike],
        *,
        ttl_seconds: int = DEFAULT_TTL_SECONDS,
        max_rows: int = DEFAULT_MAX_ROWS,
    ) -> dict[str, str]:
        """What one round would write if the sources' phantoms were committed, as a new target phantom.

        Commits nothing and moves no reader; see :mod:`diffstore.spark.preview` for exactly what the
        round's ``fn`` sees.

        Args:
            phantoms: alias → phantom id of that source (the ``phantomId`` map ``phantom/start`` answers,
                or bytes); sources not named are read as a round would read them now.
            ttl_seconds: how long the target's new phantom lives.
            max_rows: the most changes a source's diff may hold (the preview runs on the driver).

        Returns:
            The new phantom of the target, as the EncodedString map ``phantom/start`` answers: a
            ``query``/``get`` of the target with it as ``phantomId`` shows the target as it would be.

        Raises:
            InvalidRequest: an unknown alias or a phantom id that is not a live phantom of its source.
            PreviewTooLarge: a source's diff holds more than ``max_rows`` changes.
        """
        return run_preview(self, phantoms, ttl_seconds=ttl_seconds, max_rows=max_rows)

    def _hold_lease(self, should_stop: Callable[[], bool] | None) -> bool:
        """Stands by until the lease is held (True), or until ``should_stop`` (False)."""
        assert self.lease is not None
        if self._guard is None:
            self._guard_client = new_client(self.url, self.codec, self.token, self.tls)
            self._guard = LeaseGuard(self._guard_client.collection(self.target), self.lease)
        if self._token is not None:
            if self._guard.holds(self._token):
                return True
            self._lose_lease("not renewed in time")
        announced = False
        while not (should_stop and should_stop()):
            # the first wait lasts a ttl, so that a runner whose first acquire is merely slow (a free lease,
            # a loaded machine) does not announce a standby it never was
            token = self._guard.wait_active(
                timeout_s=self.lease.standby_poll_s if announced else self.lease.ttl_s
            )
            if token is not None:
                self._token = token
                self.event("active", version=token.version, owner=self.lease.owner)
                return True
            if not announced:
                announced = True
                self.event("standby", owner=self.lease.owner)
        return False

    def _lose_lease(self, reason: str, fenced: bool = False) -> None:
        if fenced and self._guard is not None:
            self._guard.report_lost(self._token)  # the store refused it: stand by now
        self._token = None
        self.event("lease_lost", reason=reason)

    def _wait_for_sources(self) -> None:
        """One long poll on every source at once: the first commit to any of them ends the wait, so a round
        starts as soon as a source moves (the polls that lose the race are cancelled)."""
        readers = self._readers()
        positions: dict[str, bytes] = {}
        for alias, collection in self.sources.items():
            current = self._state(collection)[0]
            if current != (readers[alias] or b""):
                return
            positions[collection] = current
        self._client.wait_for_change(positions, self.poll_timeout_ms)


__all__ = ["TARGET", "RoundStats", "Transform", "TransformError", "lookup_partition"]
