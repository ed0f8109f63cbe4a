"""Pydantic models that only document the wire shapes in ``/openapi.json``; no request goes through them.

Routes parse bodies with orjson/msgpack and :mod:`diffstore.wire_requests` (pydantic validation of
10k-item bodies is many times slower); these models keep the published schema equal to what the
routes accept and answer. Field names are the wire's camelCase names.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from diffstore.guides import guide


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


_AS_OF = "read as of this instant (Unix ms): the newest generation committed at or before it, instead of "


def _as_of(instead_of: str) -> Any:
    """A field of Unix milliseconds read as "the newest generation committed at or before" (SPEC §8)."""
    return Field(None, ge=0, description=_AS_OF + f"{instead_of} (none by then: 404 noSuchGeneration)")


class ES(BaseModel):
    """EncodedString: ``value`` is UTF-8 text, or base64 (standard alphabet, padded) with ``encoding``."""

    value: str
    encoding: Literal["utf8", "base64"] | None = None


class KeyValue(BaseModel):
    key: ES
    value: ES


class Error(BaseModel):
    error: str
    reason: str
    bytesMax: int | None = None


class Empty(BaseModel):
    pass


class Health(BaseModel):
    ok: bool
    degraded: bool | None = Field(None, description="true while automatic commits are failing (see reason)")
    reason: str | None = None


class GenerationIdResponse(BaseModel):
    generationId: ES


class CollectionEntry(BaseModel):
    name: str
    isManual: bool


class CollectionList(BaseModel):
    items: list[CollectionEntry]


class Retention(_Model):
    """A retention policy: GC keeps the generations committed in the last ``keepMs`` ms (and the one current
    when that window began) and the ``keepGenerations`` newest ones; ``{}``: none."""

    keepMs: int | None = Field(None, ge=1)
    keepGenerations: int | None = Field(None, ge=1)


class CreateCollection(_Model):
    collectionName: str = Field(min_length=1)
    isManual: bool
    initialGenerationId: ES | None = None
    retention: Retention | None = Field(None, description="absent: the server's default policy; {}: none")


class CollectionStateResponse(BaseModel):
    isManual: bool
    generationId: ES | None = None
    nextGenerationId: ES | None = None
    retention: Retention | None = Field(None, description="absent: no retention policy")


class RetentionResponse(BaseModel):
    retention: Retention


class GetItem(_Model):
    key: ES
    generationId: ES | None = None
    phantomId: ES | None = None
    asOfMs: int | None = _as_of("generationId")


class GetResponse(BaseModel):
    generationId: ES
    item: KeyValue | None


class GetMany(_Model):
    """(beyond SPEC) up to 10,000 keys, read at one generation."""

    keys: list[ES] = Field(max_length=10_000)
    generationId: ES | None = None
    phantomId: ES | None = None
    asOfMs: int | None = _as_of("generationId")


class GetManyItem(BaseModel):
    key: ES
    value: ES
    generationId: ES = Field(description="the generation that wrote this value")


class GetManyResponse(BaseModel):
    generationId: ES = Field(description="the generation every item was read at")
    items: list[GetManyItem | None] = Field(description="one per key asked, in order; null: absent")


class GetKeysAround(_Model):
    key: ES
    requireKeyExistance: bool
    limit: int = Field(ge=1, le=1000)
    generationId: ES | None = None
    phantomId: ES | None = None
    asOfMs: int | None = _as_of("generationId")


class KeysAroundResponse(BaseModel):
    generationId: ES
    left: list[ES]
    right: list[ES]
    hasMoreOnTheLeft: bool
    hasMoreOnTheRight: bool
    foundKey: bool


class PutItem(_Model):
    key: ES
    value: ES | None = Field(description="null writes a tombstone; the field must be present")
    ifNotPresent: bool | None = None


class LeaseTokenBody(_Model):
    """A fencing token: refused with 409 ``leaseLost`` unless this version still holds the lease
    (and, on a write, commit or abort, is the lease the open generation was started under)."""

    name: str
    version: int = Field(ge=1)


class _WriteOptions(_Model):
    generationId: ES | None = None
    phantomId: ES | None = None
    skipUnchanged: bool | None = None
    producerId: str | None = None
    seqNo: int | None = Field(default=None, ge=1)
    lease: LeaseTokenBody | None = Field(
        default=None, description="required when the open generation was started under a lease"
    )


class PutOne(_WriteOptions):
    item: PutItem


class PutMany(_WriteOptions):
    items: list[PutItem]


class PutResponse(BaseModel):
    generationId: ES
    wasPut: bool | None = None
    skipped: bool | None = None


class ReaderEntry(BaseModel):
    readerName: str
    collectionName: str | None = None
    generationId: ES | None


class ReaderList(BaseModel):
    items: list[ReaderEntry]


class CreateReader(_Model):
    readerName: str
    collectionName: str | None = None
    generationId: ES | None = None


class UpdateReader(_Model):
    generationId: ES | None = None
    expectedGenerationId: ES | None = None


class StartGeneration(_Model):
    generationId: ES
    abortOutdated: bool | None = None
    lease: LeaseTokenBody | None = None


class CommitReaderUpdate(_Model):
    readerName: str
    generationId: ES | None
    expectedGenerationId: ES | None = None


class CommitGeneration(_Model):
    generationId: ES
    updateReaders: list[CommitReaderUpdate] | None = None
    metadata: dict[str, str] | None = Field(
        None, description="kept with the generation, listed by GET /collections/{c}/generations (<= 4 KiB)"
    )
    lease: LeaseTokenBody | None = None


class Revert(_Model):
    """Revert to ``toGenerationId`` (a committed generation): the changes are written into the open
    generation, which a manual collection's revert must name (``generationId``); a non-manual one's go into
    its next generation."""

    toGenerationId: ES
    generationId: ES | None = None
    lease: LeaseTokenBody | None = Field(
        default=None, description="required when the open generation was started under a lease"
    )


class RevertResponse(BaseModel):
    generationId: ES = Field(description="the generation the changes were written into")
    changedKeys: int = Field(description="how many keys the revert changed there (0: already equal)")


class AcquireLease(_Model):
    owner: str
    ttlMs: int = Field(ge=1, le=86_400_000)


class RenewLease(_Model):
    owner: str
    version: int = Field(ge=1)
    ttlMs: int | None = Field(default=None, ge=1, le=86_400_000, description="default: the acquire's ttl")


class ReleaseLease(_Model):
    owner: str
    version: int = Field(ge=1)


class LeaseResponse(BaseModel):
    owner: str | None = Field(description="null once released")
    version: int = Field(description="the fencing token: grows at every acquire, never reused")
    expiresAtMs: int = Field(description="Unix milliseconds of the server's clock (0 once released)")


class LeaseEntry(LeaseResponse):
    name: str


class LeaseList(BaseModel):
    items: list[LeaseEntry]


class AbortGeneration(_Model):
    generationId: ES
    lease: LeaseTokenBody | None = None


class StartPhantom(_Model):
    ttlSeconds: int | None = Field(default=None, ge=1)


class PhantomResponse(BaseModel):
    phantomId: ES


class PhantomChangesQuery(_Model):
    phantomId: ES
    generationId: ES | None = None
    fromKey: ES | None = None
    toKey: ES | None = None
    limit: int | None = Field(default=None, ge=1, le=10_000)


class PhantomChange(BaseModel):
    key: ES
    fromValue: ES | None
    toValue: ES | None


class PhantomChangesResponse(BaseModel):
    generationId: ES
    items: list[PhantomChange]
    nextKey: ES | None = None


class StartQuery(_Model):
    generationId: ES | None = None
    phantomId: ES | None = None
    asOfMs: int | None = _as_of("generationId")
    fromKey: ES | None = None
    toKey: ES | None = None
    limit: int | None = Field(default=None, ge=1, le=10_000)


class QueryResponse(BaseModel):
    generationId: ES
    items: list[KeyValue]
    cursorId: str | None = None


class DiffFromReader(_Model):
    readerName: str
    collectionName: str | None = None


class StartDiff(_Model):
    fromGenerationId: ES | None = None
    fromReader: DiffFromReader | None = None
    fromAsOfMs: int | None = _as_of("fromGenerationId")
    toGenerationId: ES | None = None
    toAsOfMs: int | None = _as_of("toGenerationId")
    omitIntermediateValues: bool | None = None
    fromKey: ES | None = None
    toKey: ES | None = None
    limit: int | None = Field(default=None, ge=1, le=10_000)


class DiffEntry(BaseModel):
    key: ES
    fromValue: ES | None
    intermediateValues: list[ES | None]
    toValue: ES | None


class DiffResponse(BaseModel):
    fromGenerationId: ES
    toGenerationId: ES
    items: list[DiffEntry]
    cursorId: str | None = None


class Column(BaseModel):
    """Rows of the columns form: ``data[offsets[i]:offsets[i+1]]`` (offsets: little-endian int64s)."""

    offsets: bytes
    data: bytes
    present: bytes | None = Field(default=None, description="a byte per row, 0 where it is absent")


class QueryColumnsResponse(BaseModel):
    """A query page in the columns form (``Accept: application/vnd.diffstore.columns+msgpack``)."""

    generationId: bytes
    count: int
    keys: Column
    values: Column
    cursorId: str | None = None


class DiffColumnsResponse(BaseModel):
    """A diff page in the columns form (no intermediate values)."""

    fromGenerationId: bytes
    toGenerationId: bytes
    count: int
    keys: Column
    fromValues: Column
    toValues: Column
    cursorId: str | None = None


class GetManyColumnsResponse(BaseModel):
    """A getMany answer in the columns form: row i answers the i-th key asked (absent: no record)."""

    generationId: bytes
    count: int
    values: Column
    generationIds: Column


class ProducerResponse(BaseModel):
    lastSeqNo: int


class SplitsResponse(BaseModel):
    keys: list[ES]


class OverviewReader(BaseModel):
    readerName: str
    target: str
    targetIsCollection: bool
    generationId: ES | None
    lagGenerations: int | None = Field(
        description="committed generations of the target after the reader's (null: not a collection)"
    )


class OverviewCollection(BaseModel):
    name: str
    isManual: bool
    generationId: ES
    nextGenerationId: ES | None
    readers: list[OverviewReader]


class ReplicaCollection(BaseModel):
    collectionName: str
    lagGenerations: int
    lagSeconds: float
    state: Literal["copying", "following", "stalled"] = Field(
        description="copying (no copy yet, or taking one again), following, or stalled (see reason)"
    )
    reason: str | None = Field(None, description="why it is stalled (only when stalled)")
    sinceMs: int | None = Field(None, description="when it entered this state (ms since the epoch)")


class ReplicaResponse(BaseModel):
    primary: str
    term: int = Field(description="the replication term (promotion raises it)")
    collections: list[ReplicaCollection]


class FencedBy(BaseModel):
    primary: str | None = Field(description="the new primary's URL, when it said")
    replicaId: str | None
    term: int
    atMs: int


class SynchronousReplica(BaseModel):
    replicaId: str
    collections: int = Field(description="collections it holds a hold in")
    behind: int = Field(description="of those, how many its hold is below the current generation in")
    lastMovedMs: int | None = Field(description="when this server last saw it move a hold (ms, epoch)")
    inSync: bool = Field(description="it confirms writes now: caught up, or moved a hold within the timeout")


class SynchronousStatus(BaseModel):
    required: int = Field(description="replicas a write waits for")
    timeoutS: float = Field(description="how long before 503 notReplicated (0: for ever)")
    replicas: list[SynchronousReplica]


class ReplicationResponse(BaseModel):
    role: str = Field(description="primary | replica | fenced (stepped down: writes answer 409 fenced)")
    term: int
    primary: str | None = Field(description="a replica: its primary; fenced: the primary it stepped down for")
    replicaId: str | None = None
    fencedBy: FencedBy | None = None
    promotedFrom: str | None = Field(None, description="a promoted replica: its old primary")
    promotedAtMs: int | None = None
    synchronous: SynchronousStatus | None = Field(
        None, description="serve --synchronous N: the replicas writes wait for (absent when off)"
    )


class HaLeader(BaseModel):
    member: str | None = Field(description="the leader's member name (null: a plain replica's primary)")
    url: str


class HaResponse(BaseModel):
    cluster: str | None = Field(description="the fail-over cluster (null: the server is no member)")
    member: str | None
    role: str = Field(description="leader | replica | candidate | fenced (only the leader accepts writes)")
    leader: HaLeader | None = Field(description="where writes go, when known")
    term: int
    failovers: int | None = Field(None, description="times this member took the lead from another")
    discardedGenerations: int | None = Field(
        None, description="generations of its own this member discarded on rejoining (never replicated)"
    )


class PromoteRequest(BaseModel):
    force: bool = Field(False, description="promote even when collections are not copied or behind")
    waitMs: int = Field(10_000, description="how long to wait for the replica to catch up (0..300000)")


class PromoteCollection(BaseModel):
    collectionName: str
    state: str = Field(description="copying (not copied yet) | following")
    lagGenerations: int


class StepDownRequest(BaseModel):
    term: int = Field(description="the new primary's term: above this server's")
    primary: str = Field(description="the new primary's URL")
    replicaId: str | None = None


class StepUpRequest(BaseModel):
    term: int
    replicaId: str | None = None


class Overview(BaseModel):
    collections: list[OverviewCollection]
    storeSizeBytes: int = Field(description="bytes of the data file up to its highest page in use")
    storeFileBytes: int = Field(description="the data file's size on disk")
    storeFreePages: int = Field(description="pages holding no data: what diffstore compact gives back")
    storePageBytes: int = Field(description="the size of one page")
    replica: ReplicaResponse | None = Field(
        None, description=f"on a read replica: its primary and lag ([replicas]({guide('replicas.md')}))"
    )
    ha: HaResponse | None = Field(
        None, description=f"on a fail-over member: its role and leader ([failover]({guide('failover.md')}))"
    )


class GenerationEntry(BaseModel):
    generationId: ES
    committedAtMs: int | None = Field(description="server clock, Unix ms; null: committed by an older store")
    changedKeys: int | None = Field(description="distinct keys the generation wrote; null: unknown")
    metadata: dict[str, str] | None = Field(description="the manual commit's metadata, if any")
    collected: bool = Field(
        False, description="true: collected by GC (reads, diffs and lineage there answer 410); absent: false"
    )


class GenerationList(BaseModel):
    items: list[GenerationEntry]
    nextBefore: ES | None = Field(None, description="present when older ones remain: the next page's before")


class RefAnswer(BaseModel):
    generationId: ES = Field(description="the generation the ref names")
    committedAtMs: int | None = Field(
        description="its commit time, server clock, Unix ms; null: not committed (@open) or by an older store"
    )


class OverviewVersion(BaseModel):
    version: str


class LineageQuery(_Model):
    generationId: ES
    depth: int | None = Field(
        default=None, ge=1, le=10, description="1 (default): the generation's own moves; more: walk back"
    )


class LineageEntry(BaseModel):
    readerName: str
    collectionName: str | None = Field(description="the source collection (null: the target is not one)")
    target: str | None = Field(None, description="the reader's target when it is not a collection")
    fromGenerationId: ES | None
    toGenerationId: ES | None
    sources: list[LineageEntry] | None = Field(
        None, description="the source's moves over (from, to], merged per reader (absent: not walked)"
    )
    incomplete: bool | None = Field(None, description="true: part of that span's history was collected")


class LineageResponse(BaseModel):
    generationId: ES
    sources: list[LineageEntry]


class GenerationRecordsQuery(_Model):
    generationId: ES
    fromKey: ES | None = None
    hold: str | None = Field(None, description="a reader the collection must hold (else 404 noSuchReader)")
    limit: int | None = Field(default=None, ge=1, le=10_000, description="default 1,000")
    visible: bool = Field(
        False,
        description="every record visible at the generation instead, in key order (a replica's first copy;"
        " with hold: answered down to what the holds keep)",
    )
    pairs: bool = Field(
        False,
        description="items as [key, value] pairs instead of {key, value} objects (a tombstone's value: null);"
        " the cheapest form to encode and decode, what a replica's first copy asks for",
    )


class GenerationRecord(BaseModel):
    key: ES
    value: ES | None


class ReplicatedReader(BaseModel):
    readerName: str
    target: str
    generationId: ES | None


class GenerationRecordsResponse(BaseModel):
    items: list[GenerationRecord] | list[tuple[ES, ES | None]] = Field(
        description="{key, value} objects, or [key, value] pairs when the request asked for pairs"
    )
    previousGenerationId: ES | None = Field(None, description="first page: the committed generation before")
    moves: list[ReplicatedReader] | None = Field(None, description="first page: the readers its commit moved")
    readers: list[ReplicatedReader] | None = Field(None, description="first page: the collection's readers")
    committedAtMs: int | None = Field(None, description="first page: its commit time (Unix ms)")
    changedKeys: int | None = Field(None, description="first page: the keys it wrote")
    metadata: dict[str, str] | None = Field(None, description="first page: its commit's metadata")
    nextKey: ES | None = Field(None, description="present when more records remain: the next page's fromKey")


class PromoteResponse(BaseModel):
    promoted: bool
    term: int
    primaryReachable: bool = Field(description="false: the old primary did not answer (it was not fenced)")
    steppedDown: bool = Field(description="the old primary was told to step down, and did")
    holdsDeleted: int | None = None
    unfenced: bool | None = Field(None, description="a stepped-down primary made a primary again (force)")
    collections: list[PromoteCollection]
