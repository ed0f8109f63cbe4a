"""Values that cross the engine's public API: configuration, records, diff items, pages, readers."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, Self

from diffstore.errors import InvalidRequest


class _Unset(enum.Enum):
    UNSET = "UNSET"


UNSET = _Unset.UNSET
"""Marks "no compare-and-set" in reader updates (``None`` means "expect the reader to be null")."""

Expected = bytes | None | _Unset

PutItem = tuple[bytes, bytes | None] | tuple[bytes, bytes | None, bool]
"""What ``put_many`` writes: ``(key, value)`` or ``(key, value, if_not_present)``; ``None`` deletes."""


def wall_clock_ms() -> int:
    """Unix time in milliseconds: what lease expiries mean (processes on one machine share it)."""
    return time.time_ns() // 1_000_000


MIN_MAP_SIZE = 1 << 20
"""The smallest ``StoreConfig.map_size`` (1 MiB: a few hundred pages)."""


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Everything a :class:`~diffstore.Store` can be tuned with; passed down, never global.

    Attributes:
        map_size: upper bound of the LMDB file in bytes (an address-space reservation, not an allocation:
            the file grows with the data). A write that would pass it fails with
            :class:`~diffstore.errors.StorageFull` and changes nothing; reads and smaller writes or deletes
            keep working. It can be raised by reopening the store with a larger value (a value below the
            size already used is raised to that size). At least 1 MiB.
        commit_delay_ms: a non-manual collection commits its open generation this long after its first write.
        max_generation_records: ... or as soon as the open generation holds this many writes.
        gc_interval_ms: how often the background worker looks for garbage (collected generations,
            expired phantoms, deleted collections).
        gc_batch: how many index entries one background step handles in one write transaction.
        max_diff_generations: a diff page covers at most this many generations; larger ranges answer a
            lower ``to_generation_id`` (clients repeat from it).
        default_page_limit / max_page_limit: page sizes of query and diff pages.
        background: run the background worker thread (auto-commit, GC, purges). Tests may switch it off
            and call :meth:`Store.run_background_once` instead.
        sync: flush every write transaction to disk before it returns (the default). With ``False`` a
            commit survives a crash of the process (``kill -9``: the OS still holds the pages) but an OS
            crash or power loss may lose the last commits or damage the store — the durability of
            RocksDB's default, and several times faster for small commits on a large collection (fsync of
            scattered B-tree pages dominates them). The background worker then flushes every
            ``sync_interval_ms``, and closing the store flushes. Either way a full disk refuses the write
            with :class:`~diffstore.errors.StorageFull` and the store stays readable (unsynced stores do
            not write through LMDB's memory map, where a full disk would be a SIGBUS).
        read_yield_ms: how long a read waits at most while another thread's write transaction is changing
            pages (0: never). py-lmdb gives up the GIL around every LMDB call, so a writer racing a busy
            reader for the GIL would crawl; see :mod:`diffstore.engine.priority`.
        clock_ms: the wall clock that lease expiries are read against, in Unix milliseconds (default
            :func:`wall_clock_ms`). Every process that opens one directory must share it, so only tests
            replace it (to move time by hand).
        default_retention: the retention policy a collection created without one gets (None: none; see
            :class:`RetentionPolicy`). It is copied into the collection at its creation, so every process
            that opens the directory later honours it whatever its own default.
    """

    map_size: int = 1 << 40
    commit_delay_ms: int = 50
    max_generation_records: int = 100_000
    gc_interval_ms: int = 200
    gc_batch: int = 2_000
    max_diff_generations: int = 1_000
    default_page_limit: int = 200
    max_page_limit: int = 10_000
    background: bool = True
    sync: bool = True
    read_yield_ms: float = 50.0
    sync_interval_ms: int = 1_000
    clock_ms: Callable[[], int] | None = field(default=None, compare=False)
    default_retention: RetentionPolicy | None = None

    def now_ms(self) -> int:
        """The current time of :attr:`clock_ms` (Unix milliseconds)."""
        return wall_clock_ms() if self.clock_ms is None else self.clock_ms()

    def __post_init__(self) -> None:
        if not MIN_MAP_SIZE <= self.map_size < 1 << 63:
            raise InvalidRequest(f"map_size must be within {MIN_MAP_SIZE}..2^63-1 bytes")
        if self.commit_delay_ms < 0 or self.max_generation_records < 1:
            raise InvalidRequest("commit_delay_ms must be >= 0 and max_generation_records >= 1")
        if self.gc_batch < 1 or self.max_diff_generations < 1:
            raise InvalidRequest("gc_batch and max_diff_generations must be >= 1")
        if self.sync_interval_ms < 1:
            raise InvalidRequest("sync_interval_ms must be >= 1")
        if not 1 <= self.default_page_limit <= self.max_page_limit:
            raise InvalidRequest("default_page_limit must be within 1..max_page_limit")


MAX_KEEP_MS = (1 << 53) - 1
"""The longest ``keepMs`` (what a JSON number holds exactly: about 285,000 years)."""
MAX_KEEP_GENERATIONS = (1 << 53) - 1


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """How much history a collection keeps beyond what its readers need (SPEC §9 "Retention").

    GC never collects a generation the policy keeps: one committed within the last ``keep_ms`` ms (and the
    one that was current when that window began, so a read "as of" any instant of the window works), or
    one of the ``keep_generations`` newest committed generations (the current one counts). With both set,
    a generation either keeps is kept. Neither set: the policy keeps nothing (readers alone decide).
    """

    keep_ms: int | None = None
    keep_generations: int | None = None

    def __post_init__(self) -> None:
        for name, value, most in (
            ("keepMs", self.keep_ms, MAX_KEEP_MS),
            ("keepGenerations", self.keep_generations, MAX_KEEP_GENERATIONS),
        ):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
                raise InvalidRequest(f"retention {name} must be an integer within 1..{most}, not {value!r}")

    @property
    def empty(self) -> bool:
        """Whether the policy keeps nothing (no field set)."""
        return self.keep_ms is None and self.keep_generations is None


@dataclass(frozen=True, slots=True)
class CollectionInfo:
    name: str
    manual: bool


class Record(NamedTuple):
    """A visible record: ``value`` is never a tombstone here (absent keys are not records).

    Records and diff items are named tuples rather than frozen dataclasses: they are built once per
    item on the hottest paths, where a frozen dataclass's ``__init__`` costs three times as much.
    """

    key: bytes
    value: bytes
    generation_id: bytes


@dataclass(frozen=True, slots=True)
class GetResult:
    """What a point read found: ``generation_id`` is the record's generation, else the read's generation."""

    generation_id: bytes
    record: Record | None


MAX_GET_MANY_KEYS = 10_000
"""The most keys one ``getMany`` reads (a bound on one read transaction and one answer)."""


@dataclass(frozen=True, slots=True)
class GetManyResult:
    """What a multi-key read found: ``records[i]`` for the i-th key asked (``None``: absent), all read at
    ``generation_id``."""

    generation_id: bytes
    records: list[Record | None]


class DiffItem(NamedTuple):
    """One changed key; ``None`` values mean absent (or tombstone)."""

    key: bytes
    from_value: bytes | None
    to_value: bytes | None
    intermediate: tuple[bytes | None, ...] = ()


@dataclass(frozen=True, slots=True)
class QueryPage:
    generation_id: bytes
    items: list[Record]
    cursor: str | None


@dataclass(frozen=True, slots=True)
class DiffPage:
    from_generation_id: bytes
    to_generation_id: bytes
    items: list[DiffItem]
    cursor: str | None


@dataclass(frozen=True, slots=True)
class PhantomChanges:
    """A page of what a phantom changes for reads at ``generation_id``: each item's ``from_value`` is the
    value without the phantom, ``to_value`` with it. ``next_key``: where the next page starts (None: the
    last page)."""

    generation_id: bytes
    items: list[DiffItem]
    next_key: bytes | None


@dataclass(frozen=True, slots=True)
class KeysAround:
    generation_id: bytes
    left: list[bytes]
    right: list[bytes]
    has_more_on_the_left: bool
    has_more_on_the_right: bool
    found_key: bool


@dataclass(frozen=True, slots=True)
class PutResult:
    generation_id: bytes
    was_put: bool = True
    skipped: bool = False
    records: int = field(default=0, compare=False)  # records written into the generation (for metrics)


@dataclass(frozen=True, slots=True)
class Reader:
    """A stored reader: its target (a collection name or any other target such as ``hstream://s``)."""

    name: str
    collection: str
    generation_id: bytes | None


@dataclass(frozen=True, slots=True)
class FromReader:
    """Names a reader whose generation is a diff's start; ``collection`` is where it is stored."""

    name: str
    collection: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DiffSpec:
    """What a diff asks for (SPEC §3): its start, its end, its key range and its page size.

    ``from_generation_id`` ``None`` means "not given" (with no reader either: from the beginning);
    ``b""`` is the beginning named. ``from_as_of_ms``/``to_as_of_ms`` (SPEC §8) name an end by the
    instant it was current, in place of a generation id. ``limit`` ``None`` is the store's default.
    """

    from_generation_id: bytes | None = None
    from_reader: FromReader | None = None
    to_generation_id: bytes | None = None
    include_intermediate: bool = False
    from_key: bytes | None = None
    to_key: bytes | None = None
    limit: int | None = None
    from_as_of_ms: int | None = None
    to_as_of_ms: int | None = None

    @classmethod
    def of(
        cls,
        *,
        from_generation_id: bytes | None = None,
        from_reader: str | FromReader | None = None,
        to_generation_id: bytes | None = None,
        include_intermediate: bool = False,
        from_key: bytes | None = None,
        to_key: bytes | None = None,
        limit: int | None = None,
    ) -> Self:
        """The arguments of ``Collection.diff_page`` (a reader may be named by its name alone)."""
        if isinstance(from_reader, str):
            from_reader = FromReader(from_reader)
        return cls(
            from_generation_id=from_generation_id,
            from_reader=from_reader,
            to_generation_id=to_generation_id,
            include_intermediate=include_intermediate,
            from_key=from_key,
            to_key=to_key,
            limit=limit,
        )


@dataclass(frozen=True, slots=True)
class ReaderUpdate:
    """A reader update carried by a commit; ``expected`` (unless UNSET) is a compare-and-set."""

    name: str
    generation_id: bytes | None
    expected: Expected = field(default=UNSET)


ReaderUpdateLike = ReaderUpdate | tuple[str, bytes | None]
"""What a commit's ``update_readers`` takes: a :class:`ReaderUpdate` or a ``(name, generation_id)`` pair."""


MAX_LINEAGE_DEPTH = 10
"""The deepest lineage walk (``Collection.lineage(depth=...)``): 1 is the generation's own moves."""


@dataclass(frozen=True, slots=True)
class LineageSource:
    """One reader moved by a commit (or, nested, by the commits of a span of the source's generations).

    ``target`` is the reader's target; ``collection_name`` is the same name when it was a collection at the
    time of the commit, else None (a stream target such as ``hstream://s``). ``from_generation_id`` and
    ``to_generation_id`` are the reader's positions before and after (None: null, "from the beginning").
    ``sources`` is the lineage of the target's generations in (from, to], merged per reader (None: not
    walked -- the depth was reached or the target is not a collection). ``incomplete``: part of that
    span's history is gone (garbage-collected generations of the target, or the target was deleted).
    """

    reader_name: str
    target: str
    collection_name: str | None
    from_generation_id: bytes | None
    to_generation_id: bytes | None
    sources: tuple[LineageSource, ...] | None = None
    incomplete: bool = False


@dataclass(frozen=True, slots=True)
class Lineage:
    """The readers the commit of ``generation_id`` moved (empty: it moved none), by reader name."""

    generation_id: bytes
    sources: tuple[LineageSource, ...]


MAX_LEASE_TTL_MS = 86_400_000
"""The longest lease (a day): a longer one is a lock that nobody can take over."""
MAX_LEASE_VERSION = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class LeaseToken:
    """A fencing token: the name of a lease and the version its holder got from acquire.

    ``generation/start`` and ``/commit`` carrying it are refused (``leaseLost``) unless that version still
    holds the lease, unexpired.
    """

    name: str
    version: int


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease of a collection as stored (see :mod:`diffstore.engine.leases`).

    Attributes:
        name: the lease's name (one collection may hold several).
        owner: who holds it; ``None`` once released.
        version: increases at every acquire (never reused, release included): the fencing token.
        expires_at_ms: Unix milliseconds (the store's clock) after which it holds no more; 0 once released.
    """

    name: str
    owner: str | None
    version: int
    expires_at_ms: int

    @property
    def token(self) -> LeaseToken:
        return LeaseToken(self.name, self.version)

    def held_at(self, now_ms: int) -> bool:
        """Whether someone holds it at ``now_ms``."""
        return self.owner is not None and now_ms < self.expires_at_ms


@dataclass(frozen=True, slots=True)
class GenerationInfo:
    """A committed generation as the history shows it (SPEC §8); None: committed before the store recorded
    commit times (so unknown). ``collected``: below the readable floor, so reads, diffs and lineage there
    answer 410 (the generation stays listed)."""

    generation_id: bytes
    committed_at_ms: int | None = None
    changed_keys: int | None = None
    metadata: dict[str, str] | None = None
    collected: bool = False


@dataclass(frozen=True, slots=True)
class GenerationDigest:
    """The digest of a collection's live records at a committed generation (SPEC §9 Integrity; see
    ``engine/digests.py``); ``records``/``digest`` None: unknown (committed by a store older than digests)."""

    generation_id: bytes
    records: int | None
    digest: bytes | None

    @property
    def hex(self) -> str | None:
        return None if self.digest is None else self.digest.hex()


@dataclass(frozen=True, slots=True)
class ResolvedRef:
    """What a ref (``@current``, ``~2``, ``@reader:r``, ...; see ``engine/refs.py``) names: a generation, and
    when it was committed (None: not committed, e.g. ``@open``, or before commit times were recorded)."""

    generation_id: bytes
    committed_at_ms: int | None = None


@dataclass(frozen=True, slots=True)
class RevertResult:
    """What a revert wrote (SPEC §8): the generation it wrote into, and how many keys it changed there."""

    generation_id: bytes
    changed_keys: int


@dataclass(frozen=True, slots=True)
class ReplicaGeneration:
    """One generation of a primary, as a replica applies it (``Store.apply_replica_generation``).

    Attributes:
        collection: the collection's name (the same on both sides).
        manual: whether it is manual on the primary (used when the apply creates it).
        previous: the replica's current generation this applies on top of (its stored position), or
            None: the apply creates the collection (a first copy, ``records`` then hold every record
            visible at ``generation_id``).
        generation_id: the primary's generation id, kept as it is.
        records: what the primary's generation wrote, ``(key, value)``; ``None`` is a tombstone.
        readers: the readers of this collection that the primary's commit moved (its lineage), at their
            new positions; a missing one is created. They become this generation's lineage here too.
        floor: reads below ``generation_id`` answer ``generationCollected`` (a first copy taken after the
            primary had history: the replica does not hold what came before).
        before: a first copy's readers where they stood before ``generation_id`` was committed (placed
            before ``readers`` move, so that its lineage names where they moved from).
        lag_generations, unapplied_since_ms: how far behind the replica still is after this one (stored
            in the same transaction, for ``/replica`` and the metrics).

        committed_at_ms, metadata: the primary's commit time and metadata (SPEC §8), kept as they are
            (None time: not told, the replica's clock stands in).
        recorded: False when the primary has no commit row for it (its initial generation, or one
            committed before commit times existed): the replica writes none either, so both histories
            list it with unknown time, count and metadata.
        following_since_ms: when set, the collection's follower state becomes ``following`` since then,
            in the same transaction (a first copy: one durable write less per collection).
    """

    collection: str
    manual: bool
    previous: bytes | None
    generation_id: bytes
    records: list[tuple[bytes, bytes | None]]
    readers: tuple[Reader, ...] = ()
    floor: bool = False
    before: tuple[Reader, ...] = ()
    lag_generations: int = 0
    unapplied_since_ms: int | None = None
    committed_at_ms: int | None = None
    metadata: dict[str, str] | None = None
    recorded: bool = True
    following_since_ms: int | None = None


@dataclass(frozen=True, slots=True)
class GenerationRecords:
    """A page of the records a committed generation wrote (``Collection.generation_records``).

    ``next_key``: where the next page starts (None: no more). On the first page (no ``from_key``) also:
    ``previous``, the committed generation before it (None: it is the first); ``moves``, the readers its
    commit moved, at their new positions; ``readers``, the collection's readers now; ``info``, its commit
    time, changed keys and metadata (SPEC §8: what a replica keeps; None from a server older than them).
    """

    records: list[tuple[bytes, bytes | None]]
    next_key: bytes | None
    previous: bytes | None = None
    moves: tuple[Reader, ...] = ()
    readers: tuple[Reader, ...] = ()
    info: GenerationInfo | None = None


@dataclass(frozen=True, slots=True)
class ReplicaLag:
    """How far one collection of a replica is behind its primary, and what its follower is doing.

    ``state`` is ``copying`` (no copy yet, or taking one again), ``following`` or ``stalled`` (then
    ``reason`` says why, in one line); ``state_since_ms`` is when it entered that state (None: not told).
    """

    collection: str
    generations: int
    unapplied_since_ms: int | None
    state: str = "following"
    reason: str | None = None
    state_since_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Fencing:
    """Why a store refuses writes with 409 ``fenced``: it stepped down at ``term`` (told by a new primary,
    ``primary``/``replica_id`` when known, or by a client that carried a higher term) at ``at_ms``."""

    term: int
    primary: str | None
    replica_id: str | None
    at_ms: int


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """Whether a store follows a primary: ``primary`` None is a store that never did.

    ``promoted_at_ms`` set: it did, and was promoted to a primary then (it accepts writes).
    ``replica_id`` names the readers it holds on the primary; ``applied`` counts the primary generations
    it applied, ever. ``term`` is the store's replication term (any store; promotion raises it) and
    ``fenced`` says why a store that stepped down refuses writes, ``step_downs`` how many times it
    stepped down, ever; ``address`` is the URL a promoted store was promoted under.
    """

    primary: str | None = None
    replica_id: str | None = None
    promoted_at_ms: int | None = None
    applied: int = 0
    lags: tuple[ReplicaLag, ...] = ()
    term: int = 0
    fenced: Fencing | None = None
    address: str | None = None
    step_downs: int = 0

    @property
    def role(self) -> str:
        """``replica`` (following), ``fenced`` (stepped down) or ``primary``."""
        if self.following:
            return "replica"
        return "fenced" if self.fenced is not None else "primary"

    @property
    def following(self) -> bool:
        """A replica that refuses writes (a primary, or a promoted replica, does not)."""
        return self.primary is not None and self.promoted_at_ms is None
