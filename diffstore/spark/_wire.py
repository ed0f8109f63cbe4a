"""The slice of the HTTP API (SPEC §3) that Spark drivers and executors need, on plain httpx.

Why not ``diffstore.client``: executors only need a dozen calls, the hot ones (diff and query pages,
putMany) must move bytes without per-item objects, and the module must be importable on a Spark worker
with nothing but httpx and msgpack. Bodies go as msgpack by default (SPEC §2, beyond diffbelt): keys and
values travel as raw ``bin`` instead of base64 JSON strings. ``codec="json"`` speaks diffbelt's JSON.

Error answers are turned into the one hierarchy of :mod:`diffstore.errors` (``BadVersion`` ...), so the
transform runner can tell a lost compare-and-set from a broken job.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import msgpack
import orjson

from diffstore.errors import DiffstoreError, error_from_code

Items = list[tuple[bytes, bytes | None]]
DiffRows = list[tuple[bytes, bytes | None, bytes | None]]

_MSGPACK = "application/msgpack"
_JSON = "application/json"


@dataclass(frozen=True, slots=True)
class CollectionState:
    """What ``GET /collections/{c}`` says: committed generation and the open one (if any)."""

    manual: bool
    generation_id: bytes
    next_generation_id: bytes | None


@dataclass(frozen=True, slots=True)
class ReaderState:
    name: str
    collection: str | None
    generation_id: bytes | None


@dataclass(frozen=True, slots=True)
class QueryResult:
    generation_id: bytes
    items: Items
    cursor: str | None


@dataclass(frozen=True, slots=True)
class DiffResult:
    from_generation_id: bytes
    to_generation_id: bytes
    items: DiffRows
    cursor: str | None


class WireClient:
    """A blocking HTTP client for one diffstore server; cheap to build, close it (or use ``with``).

    Args:
        url: the server's base URL, e.g. ``http://127.0.0.1:8080``.
        codec: ``"msgpack"`` (binary, fast) or ``"json"``.
        timeout: seconds per request (long polls add their own wait on top).
    """

    def __init__(self, url: str, codec: str = "msgpack", timeout: float = 120.0) -> None:
        if codec not in ("msgpack", "json"):
            raise ValueError(f"unknown codec {codec!r}")
        self._binary = codec == "msgpack"
        self._timeout = timeout
        self._http = httpx.Client(base_url=url.rstrip("/"), timeout=timeout)

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- encoding -------------------------------------------------------------------------------------

    def _es(self, data: bytes | None) -> Any:
        if data is None or self._binary:
            return data
        return {"value": base64.b64encode(data).decode("ascii"), "encoding": "base64"}

    def _un_es(self, data: Any) -> bytes | None:
        if data is None or isinstance(data, bytes):
            return data
        if isinstance(data, str):
            return data.encode()
        if data.get("encoding") == "base64":
            return base64.b64decode(data["value"])
        return str(data["value"]).encode()

    def _un_es_required(self, data: Any) -> bytes:
        value = self._un_es(data)
        if value is None:
            raise DiffstoreError("the server sent null where a generation id was expected")
        return value

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None, **kw: Any) -> Any:
        headers = {"Accept": _MSGPACK if self._binary else _JSON}
        content: bytes | None = None
        if body is not None:
            content = msgpack.packb(body, use_bin_type=True) if self._binary else orjson.dumps(body)
            headers["Content-Type"] = _MSGPACK if self._binary else _JSON
        response = self._http.request(method, path, content=content, headers=headers, **kw)
        raw = response.content
        is_msgpack = response.headers.get("content-type", "").startswith(_MSGPACK)
        try:
            answer = msgpack.unpackb(raw, raw=False) if is_msgpack else orjson.loads(raw) if raw else {}
        except (ValueError, msgpack.UnpackException) as exc:
            raise DiffstoreError(f"{method} {path}: HTTP {response.status_code}, unreadable body") from exc
        if response.status_code >= 400:
            code = answer.get("error", "") if isinstance(answer, dict) else ""
            reason = answer.get("reason", "") if isinstance(answer, dict) else ""
            raise error_from_code(code, f"{method} {path}: {reason or response.status_code}")
        return answer

    @staticmethod
    def _c(collection: str) -> str:
        return "/collections/" + quote(collection, safe="")

    # -- collections and generations ------------------------------------------------------------------

    def collection_names(self) -> list[str]:
        """Names of every collection, sorted."""
        return [item["name"] for item in self._call("GET", "/collections/")["items"]]

    def create_collection(self, name: str, manual: bool) -> bytes:
        """Creates a collection; returns its first generation id (``CollectionExists`` if present)."""
        answer = self._call("POST", "/collections/", {"collectionName": name, "isManual": manual})
        return self._un_es_required(answer["generationId"])

    def delete_collection(self, name: str) -> None:
        self._call("DELETE", self._c(name))

    def state(self, collection: str) -> CollectionState:
        """Current and next generation of a collection."""
        answer = self._call("GET", self._c(collection))
        return CollectionState(
            manual=bool(answer.get("isManual")),
            generation_id=self._un_es_required(answer["generationId"]),
            next_generation_id=self._un_es(answer.get("nextGenerationId")),
        )

    def wait_generation(self, collection: str, known: bytes, timeout_ms: int) -> bytes:
        """Long-polls until the current generation differs from ``known`` (or the timeout); returns it."""
        params = {
            "generationId": base64.b64encode(known).decode("ascii"),
            "generationIdEncoding": "base64",
            "timeoutMs": str(timeout_ms),
        }
        answer = self._call(
            "GET",
            self._c(collection) + "/generationId/stream",
            params=params,
            timeout=self._timeout + timeout_ms / 1000,
        )
        return self._un_es_required(answer["generationId"])

    def start_generation(self, collection: str, generation_id: bytes, abort_outdated: bool = False) -> None:
        body = {"generationId": self._es(generation_id), "abortOutdated": abort_outdated}
        self._call("POST", self._c(collection) + "/generation/start", body)

    def commit_generation(
        self, collection: str, generation_id: bytes, update_readers: Sequence[dict[str, Any]] = ()
    ) -> None:
        """Commits; ``update_readers`` entries are ``{"readerName", "generationId", "expectedGenerationId"?}``
        with bytes/None values (``expectedGenerationId`` absent means no compare-and-set)."""
        updates = []
        for entry in update_readers:
            wire = {"readerName": entry["readerName"], "generationId": self._es(entry["generationId"])}
            if "expectedGenerationId" in entry:
                wire["expectedGenerationId"] = self._es(entry["expectedGenerationId"])
            updates.append(wire)
        body = {"generationId": self._es(generation_id), "updateReaders": updates}
        self._call("POST", self._c(collection) + "/generation/commit", body)

    def abort_generation(self, collection: str, generation_id: bytes) -> None:
        self._call(
            "POST", self._c(collection) + "/generation/abort", {"generationId": self._es(generation_id)}
        )

    # -- readers --------------------------------------------------------------------------------------

    def readers(self, collection: str) -> list[ReaderState]:
        answer = self._call("GET", self._c(collection) + "/readers/")
        return [
            ReaderState(item["readerName"], item.get("collectionName"), self._un_es(item.get("generationId")))
            for item in answer["items"]
        ]

    def create_reader(
        self, collection: str, name: str, target: str | None, generation_id: bytes | None = None
    ) -> None:
        body: dict[str, Any] = {"readerName": name, "generationId": self._es(generation_id)}
        if target is not None:
            body["collectionName"] = target
        self._call("POST", self._c(collection) + "/readers/", body)

    # -- data -----------------------------------------------------------------------------------------

    def put_many(
        self, collection: str, items: Iterable[tuple[bytes, bytes | None]], generation_id: bytes
    ) -> None:
        """Writes records (``None`` = tombstone) into ``generation_id`` in one request."""
        wire_items = [{"key": self._es(k), "value": self._es(v)} for k, v in items]
        body = {"items": wire_items, "generationId": self._es(generation_id)}
        self._call("POST", self._c(collection) + "/putMany", body)

    def get(self, collection: str, key: bytes, generation_id: bytes | None = None) -> bytes | None:
        """The visible value of ``key`` (``None`` when absent)."""
        body: dict[str, Any] = {"key": self._es(key)}
        if generation_id is not None:
            body["generationId"] = self._es(generation_id)
        item = self._call("POST", self._c(collection) + "/get", body).get("item")
        return None if item is None else self._un_es(item.get("value"))

    def query_page(
        self,
        collection: str,
        generation_id: bytes | None = None,
        from_key: bytes | None = None,
        to_key: bytes | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> QueryResult:
        """One page of a snapshot read; pass the previous page's ``cursor`` to continue."""
        if cursor is not None:
            answer = self._call("GET", self._c(collection) + "/query/" + quote(cursor, safe=""))
        else:
            body: dict[str, Any] = {}
            for name, value in (("generationId", generation_id), ("fromKey", from_key), ("toKey", to_key)):
                if value is not None:
                    body[name] = self._es(value)
            if limit is not None:
                body["limit"] = limit
            answer = self._call("POST", self._c(collection) + "/query/", body)
        un = self._un_es
        items = [(un(item["key"]) or b"", un(item.get("value"))) for item in answer["items"]]
        return QueryResult(self._un_es_required(answer["generationId"]), items, answer.get("cursorId"))

    def diff_page(
        self,
        collection: str,
        from_generation_id: bytes | None,
        to_generation_id: bytes | None = None,
        from_key: bytes | None = None,
        to_key: bytes | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> DiffResult:
        """One page of a diff from ``from_generation_id`` (None: the beginning) to ``to_generation_id``."""
        if cursor is not None:
            answer = self._call("GET", self._c(collection) + "/diff/" + quote(cursor, safe=""))
        else:
            body: dict[str, Any] = {"fromGenerationId": self._es(from_generation_id)}
            for name, value in (
                ("toGenerationId", to_generation_id),
                ("fromKey", from_key),
                ("toKey", to_key),
            ):
                if value is not None:
                    body[name] = self._es(value)
            if limit is not None:
                body["limit"] = limit
            answer = self._call("POST", self._c(collection) + "/diff/", body)
        un = self._un_es
        rows = [
            (un(item["key"]) or b"", un(item.get("fromValue")), un(item.get("toValue")))
            for item in answer["items"]
        ]
        return DiffResult(
            self._un_es_required(answer["fromGenerationId"]),
            self._un_es_required(answer["toGenerationId"]),
            rows,
            answer.get("cursorId"),
        )

    def splits(self, collection: str, count: int, generation_id: bytes | None = None) -> list[bytes]:
        """Up to ``count - 1`` ascending keys cutting the collection into near-equal ranges."""
        params = {"count": str(count)}
        if generation_id is not None:
            params["generationId"] = base64.b64encode(generation_id).decode("ascii")
            params["generationIdEncoding"] = "base64"
        answer = self._call("GET", self._c(collection) + "/splits", params=params)
        return [self._un_es_required(key) for key in answer["keys"]]
