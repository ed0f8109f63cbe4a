"""The one error hierarchy of diffstore.

Every failure a user can cause or observe is a :class:`DiffstoreError` whose ``code`` is the stable
string of SPEC §2. The engine raises them; the HTTP server maps them to statuses in exactly one place
(``diffstore.server.errors``); the client raises the same classes from an error response
(:func:`error_from_code`).

    DiffstoreError
    ├── BadRequest ................ 400
    │   ├── InvalidJson
    │   ├── InvalidRequest
    │   └── InvalidEncoding
    ├── Unauthorized .............. 401
    ├── Forbidden ................. 403 a token whose scope does not cover the route (``scope``: needed)
    ├── NotFound .................. 404
    │   ├── NoSuchRoute
    │   ├── NoSuchCollection
    │   ├── NoSuchReader
    │   ├── NoSuchCursor
    │   └── NoSuchGeneration
    ├── MethodNotAllowed .......... 405
    ├── Conflict .................. 409
    │   ├── CollectionExists
    │   ├── ReaderExists
    │   ├── OutdatedGeneration
    │   ├── GenerationMismatch
    │   ├── NotManual
    │   ├── NotAutomatic .......... (the command line) a write without a generation on a manual collection
    │   ├── BadVersion
    │   ├── LeaseLost ............. a lease (or a fencing token) that no longer holds
    │   ├── ReadOnlyReplica ....... a write sent to a read replica
    │   ├── NotReplica ............ a replica operation (promote) sent to a primary
    │   ├── ReplicaBehind ......... a promotion refused: collections not copied or behind (listed)
    │   └── Fenced ................ a write sent to a primary that stepped down (a higher term exists)
    ├── Gone ...................... 410
    │   ├── GenerationCollected
    │   └── CursorExpired
    ├── PayloadTooLarge ........... 413
    ├── Overloaded ................ 503 (with Retry-After)
    ├── NotReplicated ............. 503 a write committed here that too few replicas confirmed in time
    └── StorageError .............. (an I/O failure underneath; the server answers 500)
        ├── StorageFull ........... 507 (the map or the file system is full; the store stays readable)
        ├── CorruptRecord ......... 500 a stored row whose checksum fails (names the key, never the value)
        ├── NoLeader .............. (a client of several servers) none of them takes writes now
        └── LeaderChanged ......... (a client of several servers) a call cut short by a fail-over
"""

from __future__ import annotations

import base64
import contextlib
from typing import ClassVar

TEXT_FORM_PREFIX = "base64:"


class DiffstoreError(Exception):
    """Base of every diffstore error; ``code`` is the SPEC §2 error code."""

    code: ClassVar[str] = "internalError"

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason or self.code)
        self.reason = reason or self.code

    def details(self) -> dict[str, object]:
        """The fields an error answer carries besides ``error`` and ``reason`` (wire names)."""
        return {}

    def take_details(self, body: dict[str, object]) -> None:
        """Takes :meth:`details` back from an error answer's body (the client's side)."""


class BadRequest(DiffstoreError):
    code = "invalidRequest"


class InvalidJson(BadRequest):
    code = "invalidJson"


class InvalidRequest(BadRequest):
    code = "invalidRequest"


class InvalidEncoding(BadRequest):
    code = "invalidEncoding"


class Unauthorized(DiffstoreError):
    code = "unauthorized"


class Forbidden(DiffstoreError):
    """A known token whose scope does not cover the request (``scope``: the scope it needed, ``read`` |
    ``write`` | ``admin``). Nothing changed."""

    code = "forbidden"

    def __init__(self, reason: str = "", scope: str = "") -> None:
        super().__init__(reason)
        self.scope = scope

    def details(self) -> dict[str, object]:
        return {"scope": self.scope}

    def take_details(self, body: dict[str, object]) -> None:
        scope = body.get("scope")
        if isinstance(scope, str):
            self.scope = scope


class NotFound(DiffstoreError):
    code = "notFound"


class NoSuchRoute(NotFound):
    code = "noSuchRoute"


class NoSuchCollection(NotFound):
    code = "noSuchCollection"


class NoSuchReader(NotFound):
    code = "noSuchReader"


class NoSuchCursor(NotFound):
    code = "noSuchCursor"


class NoSuchGeneration(NotFound):
    """A generation id that is not one of the collection's committed generations."""

    code = "noSuchGeneration"


class MethodNotAllowed(DiffstoreError):
    code = "methodNotAllowed"


class Conflict(DiffstoreError):
    code = "conflict"


class CollectionExists(Conflict):
    code = "collectionExists"


class ReaderExists(Conflict):
    code = "readerExists"


class OutdatedGeneration(Conflict):
    code = "outdatedGeneration"


class GenerationMismatch(Conflict):
    code = "generationMismatch"


class NotManual(Conflict):
    code = "notManual"


class NotAutomatic(Conflict):
    """A write without a generation on a manual collection, which only its writer's generations take (the
    command line's refusal; over HTTP such a put answers ``generationMismatch``, as in diffbelt)."""

    code = "notAutomatic"


class BadVersion(Conflict):
    code = "badVersion"


class LeaseLost(Conflict):
    """The lease is held by another owner, or the fencing token no longer holds it (moved or expired).

    Nothing was changed by the request that raised it.
    """

    code = "leaseLost"


class ReadOnlyReplica(Conflict):
    """The server is a read replica (``serve --replica-of``, or a member of a fail-over cluster that is not
    its leader): it refuses every write; nothing changed. ``leader``: the URL to send writes to, if known."""

    code = "readOnlyReplica"

    def __init__(self, reason: str = "", leader: str | None = None) -> None:
        super().__init__(reason)
        self.leader = leader

    def details(self) -> dict[str, object]:
        return {} if self.leader is None else {"leader": self.leader}

    def take_details(self, body: dict[str, object]) -> None:
        leader = body.get("leader")
        if isinstance(leader, str):
            self.leader = leader


class NotReplica(Conflict):
    """A replica-only operation (promote, the replica's status) asked of a server that is not a replica."""

    code = "notReplica"


class ReplicaBehind(Conflict):
    """A promotion refused (nothing changed): collections of the primary the replica has not copied, or
    is behind on while the primary still answers. ``collections`` lists them as the wire does:
    ``{collectionName, state, lagGenerations}``."""

    code = "replicaBehind"

    def __init__(self, reason: str = "", collections: list[dict[str, object]] | None = None) -> None:
        super().__init__(reason)
        self.collections = collections or []

    def details(self) -> dict[str, object]:
        return {"collections": self.collections}

    def take_details(self, body: dict[str, object]) -> None:
        found = body.get("collections")
        if isinstance(found, list):
            self.collections = [item for item in found if isinstance(item, dict)]


class Fenced(Conflict):
    """A write refused because the store stepped down: a primary with a higher replication ``term``
    exists (``primary``: its URL, when the store was told). Nothing changed."""

    code = "fenced"

    def __init__(self, reason: str = "", term: int = 0, primary: str | None = None) -> None:
        super().__init__(reason)
        self.term = term
        self.primary = primary

    def details(self) -> dict[str, object]:
        found: dict[str, object] = {"term": self.term}
        if self.primary is not None:
            found["primary"] = self.primary
        return found

    def take_details(self, body: dict[str, object]) -> None:
        term, primary = body.get("term"), body.get("primary")
        if isinstance(term, int):
            self.term = term
        if isinstance(primary, str):
            self.primary = primary


class Gone(DiffstoreError):
    code = "gone"


class GenerationCollected(Gone):
    code = "generationCollected"


class CursorExpired(Gone):
    code = "cursorExpired"


class PayloadTooLarge(DiffstoreError):
    code = "payloadTooLarge"

    def __init__(self, reason: str = "", bytes_max: int = 0) -> None:
        super().__init__(reason)
        self.bytes_max = bytes_max


class Overloaded(DiffstoreError):
    """The server's budget of request bodies in flight is spent; the same request may succeed later."""

    code = "overloaded"
    retry_after_s: ClassVar[int] = 1


class NotReplicated(DiffstoreError):
    """``serve --synchronous N``: a write committed on the primary (durable, visible there) that fewer than
    ``required`` replicas confirmed applying within the synchronous timeout; a fail-over may lose it. Do
    not send it again (it is committed): read it back, or wait for the replicas (``GET /replication``)."""

    code = "notReplicated"

    def __init__(
        self, reason: str = "", generation_id: bytes | None = None, replicated: int = 0, required: int = 0
    ) -> None:
        super().__init__(reason)
        self.generation_id = generation_id
        self.replicated = replicated
        self.required = required

    def details(self) -> dict[str, object]:
        found: dict[str, object] = {"replicated": self.replicated, "required": self.required}
        if self.generation_id is not None:
            found["generationId"] = self.generation_id  # bytes: the server writes it as an EncodedString
        return found

    def take_details(self, body: dict[str, object]) -> None:
        for name in ("replicated", "required"):
            value = body.get(name)
            if isinstance(value, int):
                setattr(self, name, value)
        found = body.get("generationId")
        if isinstance(found, bytes):
            self.generation_id = found
        elif isinstance(found, dict) and isinstance(found.get("value"), str):
            text = found["value"]
            if found.get("encoding") == "base64":
                with contextlib.suppress(ValueError):
                    self.generation_id = base64.b64decode(text, validate=True)
            else:
                self.generation_id = text.encode("utf-8")


class StorageError(DiffstoreError):
    """The storage underneath failed (disk full, corrupt file); not the caller's fault."""

    code = "storageError"


class StorageFull(StorageError):
    """The store's map (``StoreConfig.map_size``) or its file system is full.

    The write that hit it changed nothing; reads keep working, and smaller writes, deletes or the same
    write after space was freed (or the map size raised) succeed.
    """

    code = "storageFull"


class CorruptRecord(StorageError):
    """A read met a stored record whose checksum does not match its bytes: the storage underneath changed
    it (a flipped bit, a damaged backup). The reason names the collection, the key and the generation,
    never the damaged value; ``diffstore check`` lists every such row."""

    code = "corruptRecord"


class NoLeader(StorageError):
    """(a client given several servers) None of them takes writes now -- a fail-over under way, or every
    one unreachable -- for as long as the client waits for one. Nothing was written; the same call may
    succeed later (``retryable``: long-running commands wait it out as an outage)."""

    code = "noLeader"
    retryable: ClassVar[bool] = True


class LeaderChanged(StorageError):
    """(a client given several servers) A call cut short by a fail-over that the client could not finish
    on the new leader: the new leader refused its resend (it never saw the generation the call wrote into:
    replicas copy committed generations only). Nothing of it is visible on the new leader; a pipeline
    redoes its round from the positions stored there (``retryable``: long-running commands treat it as
    an outage)."""

    code = "leaderChanged"
    retryable: ClassVar[bool] = True


def text_form(data: bytes | None) -> str:
    """How a message names bytes (a key, a generation id): the text form every command prints and accepts.

    Printable UTF-8 as it is, any other bytes as ``base64:`` and their base64 (and so printable text that
    begins with ``base64:``, ``@`` or ``~``, which would read as a ref); the empty generation id as ``""``,
    none as ``none``. Never a Python ``b'...'`` repr: a message reaches shell users and HTTP clients, who
    read neither.
    """
    if data is None:
        return "none"
    if not data:
        return '""'
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        return TEXT_FORM_PREFIX + base64.b64encode(data).decode("ascii")
    # text beginning with "@" or "~" reads as a ref (``@current``, ``~1``: diffstore.engine.refs)
    if text.isprintable() and not text.startswith((TEXT_FORM_PREFIX, "@", "~")):
        return text
    return TEXT_FORM_PREFIX + base64.b64encode(data).decode("ascii")


def _leaf_classes() -> dict[str, type[DiffstoreError]]:
    found: dict[str, type[DiffstoreError]] = {}
    pending: list[type[DiffstoreError]] = [DiffstoreError]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        found.setdefault(cls.code, cls)
        if not cls.__subclasses__():
            found[cls.code] = cls
    return found


ERROR_CLASSES_BY_CODE: dict[str, type[DiffstoreError]] = _leaf_classes()


def error_from_code(code: str, reason: str = "") -> DiffstoreError:
    """Builds the exception for an error code received over the wire (unknown codes give the base)."""
    return ERROR_CLASSES_BY_CODE.get(code, DiffstoreError)(reason)
