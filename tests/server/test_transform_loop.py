"""The diffbelt A+B→C transform loop of SPEC §6, played over raw HTTP with httpx (no diffstore client).

C[key] = A[key] + "|" + B[key] (missing sides as ""); a key absent from both is absent from C. The worker
crashes once mid-iteration (its open generation is dropped by the next start's ``abortOutdated``), and a
rival worker's commit makes one commit fail with ``badVersion`` (the worker aborts and retries).
"""

from __future__ import annotations

import threading
from typing import Any

import httpx

from .conftest import Live, es, unes


class Crash(Exception):
    pass


class Worker:
    def __init__(self, http: httpx.Client) -> None:
        self.http = http
        self.iterations = 0
        self.aborts = 0

    def call(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        response = self.http.request(method, path, json=body, **kwargs)
        if response.status_code != 200:
            raise httpx.HTTPStatusError(response.text, request=response.request, response=response)
        return response.json()

    def readers(self) -> dict[str, bytes | None]:
        items = self.call("GET", "/collections/C/readers/")["items"]
        return {r["readerName"]: unes(r["generationId"]) for r in items}

    def current(self, name: str) -> bytes:
        return unes(self.call("GET", f"/collections/{name}")["generationId"])  # type: ignore[return-value]

    def diff_keys(self, source: str, reader: str) -> tuple[bytes, bytes, set[bytes]]:
        body = {"fromReader": {"readerName": reader, "collectionName": "C"}, "limit": 3}
        page = self.call("POST", f"/collections/{source}/diff/", body)
        start, end = unes(page["fromGenerationId"]), unes(page["toGenerationId"])
        keys = {unes(item["key"]) for item in page["items"]}
        while "cursorId" in page:
            page = self.call("GET", f"/collections/{source}/diff/{page['cursorId']}")
            keys |= {unes(item["key"]) for item in page["items"]}
        return start, end, keys  # type: ignore[return-value]

    def value(self, source: str, key: bytes, generation: bytes) -> bytes | None:
        item = self.call(
            "POST", f"/collections/{source}/get", {"key": es(key), "generationId": es(generation)}
        )["item"]
        return None if item is None else unes(item["value"])

    def iterate(self, crash_before_commit: bool = False, before_commit: Any = None) -> bool:
        """One iteration; returns False when there was nothing to do."""
        state = self.call("GET", "/collections/C")
        base = unes(state.get("nextGenerationId") or state["generationId"]) or b"\0" * 8
        g = (int.from_bytes(base, "big") + 1).to_bytes(8, "big")
        readers = self.readers()
        self.call("POST", "/collections/C/generation/start", {"generationId": es(g), "abortOutdated": True})
        try:
            a_from, g_a, a_keys = self.diff_keys("A", "from_a")
            b_from, g_b, b_keys = self.diff_keys("B", "from_b")
            if a_from == g_a and b_from == g_b:
                self.call("POST", "/collections/C/generation/abort", {"generationId": es(g)})
                return False
            items = []
            for key in sorted(a_keys | b_keys):
                a, b = self.value("A", key, g_a), self.value("B", key, g_b)
                value = None if a is None and b is None else (a or b"") + b"|" + (b or b"")
                items.append({"key": es(key), "value": None if value is None else es(value)})
            self.call("POST", "/collections/C/putMany", {"items": items, "generationId": es(g)})
            if crash_before_commit:
                raise Crash()
            if before_commit is not None:
                before_commit()
            update = [
                {
                    "readerName": "from_a",
                    "generationId": es(g_a),
                    "expectedGenerationId": _es_opt(readers["from_a"]),
                },
                {
                    "readerName": "from_b",
                    "generationId": es(g_b),
                    "expectedGenerationId": _es_opt(readers["from_b"]),
                },
            ]
            self.call(
                "POST", "/collections/C/generation/commit", {"generationId": es(g), "updateReaders": update}
            )
            self.iterations += 1
            return True
        except httpx.HTTPStatusError as exc:
            assert exc.response.json()["error"] == "badVersion", exc.response.text
            self.aborts += 1
            self.call("POST", "/collections/C/generation/abort", {"generationId": es(g)})
            return True

    def run_until_caught_up(self) -> None:
        while self.iterate():
            pass
        readers = self.readers()
        assert (readers["from_a"], readers["from_b"]) == (self.current("A"), self.current("B"))


def _es_opt(value: bytes | None) -> dict[str, str] | None:
    return None if value is None else es(value)


def write(live: Live, name: str, generation: str, items: dict[str, str | None]) -> None:
    live.ok("POST", f"/collections/{name}/generation/start", {"generationId": es(generation)})
    body = [{"key": es(k), "value": None if v is None else es(v)} for k, v in items.items()]
    live.ok("POST", f"/collections/{name}/putMany", {"items": body, "generationId": es(generation)})
    live.ok("POST", f"/collections/{name}/generation/commit", {"generationId": es(generation)})


def contents(live: Live, name: str) -> dict[bytes, bytes]:
    page = live.ok("POST", f"/collections/{name}/query/", {"limit": 2})
    found = {unes(i["key"]): unes(i["value"]) for i in page["items"]}
    while "cursorId" in page:
        page = live.ok("GET", f"/collections/{name}/query/{page['cursorId']}")
        found |= {unes(i["key"]): unes(i["value"]) for i in page["items"]}
    return found  # type: ignore[return-value]


def expected(live: Live) -> dict[bytes, bytes]:
    a, b = contents(live, "A"), contents(live, "B")
    return {k: a.get(k, b"") + b"|" + b.get(k, b"") for k in a.keys() | b.keys()}


def test_transform_loop(live: Live) -> None:
    for name in ("A", "B", "C"):
        live.ok("POST", "/collections/", {"collectionName": name, "isManual": True})
    live.ok(
        "POST",
        "/collections/C/readers/",
        {"readerName": "from_a", "collectionName": "A", "generationId": None},
    )
    live.ok(
        "POST",
        "/collections/C/readers/",
        {"readerName": "from_b", "collectionName": "B", "generationId": None},
    )
    write(live, "A", "1", {"k1": "a1", "k2": "a2", "k3": "a3", "k4": "a4"})
    write(live, "B", "1", {"k2": "b2", "k5": "b5"})
    worker = Worker(live.http)

    # a crash after putMany: the open generation is dropped by the next iteration's abortOutdated
    try:
        worker.iterate(crash_before_commit=True)
        raise AssertionError("the worker should have crashed")
    except Crash:
        pass
    assert unes(live.ok("GET", "/collections/C")["nextGenerationId"]) == b"\0" * 7 + b"\1"
    worker.run_until_caught_up()
    assert contents(live, "C") == expected(live)

    write(live, "A", "2", {"k1": None, "k6": "a6"})
    write(live, "B", "2", {"k5": None, "k1": "b1"})

    # a rival rewinds a reader first: this worker's commit fails with badVersion, it aborts and retries
    def rival() -> None:
        with httpx.Client(base_url=live.url) as other:
            rewind = {"generationId": None, "expectedGenerationId": es("1")}
            assert other.put("/collections/C/readers/from_a", json=rewind).status_code == 200

    worker.iterate(before_commit=rival)
    assert worker.aborts == 1
    assert live.ok("GET", "/collections/C").get("nextGenerationId") is None
    worker.run_until_caught_up()
    assert contents(live, "C") == expected(live)

    # caught up: wait (long poll) for A or B to move, then catch up again
    current_a = live.ok("GET", "/collections/A")["generationId"]["value"]
    moved = threading.Thread(target=write, args=(live, "A", "3", {"k7": "a7"}))
    poll = live.ok(
        "GET", "/collections/A/generationId/stream", params={"generationId": current_a, "timeoutMs": 0}
    )
    assert poll["generationId"]["value"] == current_a  # nothing yet
    moved.start()
    poll = live.ok(
        "GET", "/collections/A/generationId/stream", params={"generationId": current_a, "timeoutMs": 60_000}
    )
    moved.join()
    assert poll["generationId"]["value"] == "3"
    worker.run_until_caught_up()
    assert contents(live, "C") == expected(live)
    assert contents(live, "C")[b"k7"] == b"a7|"
    assert worker.iterations >= 3
