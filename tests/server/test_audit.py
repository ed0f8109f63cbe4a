"""The audit trail: admin actions and writes outside a generation's data logged on one line each (token
name, remote address, action, collection, outcome) and counted in /metrics; secrets nowhere."""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from diffstore.engine.readers import HOLD_PREFIX
from diffstore.engine.types import StoreConfig
from diffstore.server import ServerConfig
from diffstore.server.audit import outcome_of
from tests.helpers import ManualClock
from tests.server.conftest import Live, live_server

SECRETS = {
    "viewer": "viewer-SECRET-aaaa1111",
    "etl": "etl-SECRET-bbbb2222",
    "ops": "ops-SECRET-cccc3333",
}
OLD_TOKEN = "old-SECRET-dddd4444"
LINE = re.compile(r"audit (.*)")


def h(name: str) -> dict[str, str]:
    secret = OLD_TOKEN if name == "token" else SECRETS[name]
    return {"authorization": f"Bearer {secret}"}


@pytest.fixture
def audited(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> Iterator[tuple[Live, ManualClock]]:
    path = tmp_path / "tokens"
    path.write_text(
        f"viewer {SECRETS['viewer']} read\netl {SECRETS['etl']} write orders*\nops {SECRETS['ops']} admin\n"
    )
    clock = ManualClock(5_000_000)
    config = ServerConfig(token=OLD_TOKEN, token_file=str(path), access_log=True)
    caplog.set_level(logging.DEBUG)
    with live_server(tmp_path / "data", config, StoreConfig(clock_ms=clock, commit_delay_ms=10)) as live:
        caplog.set_level(logging.INFO, "uvicorn.access")  # live_server starts uvicorn at warning
        yield live, clock


def audit_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, str]]:
    lines = []
    for record in caplog.records:
        if record.name == "diffstore.audit":
            match = LINE.fullmatch(record.getMessage())
            assert match is not None, record.getMessage()
            lines.append(dict(pair.split("=", 1) for pair in shlex.split(match.group(1))))
    return lines


def test_admin_actions_and_hand_writes_are_logged_and_counted(
    audited: tuple[Live, ManualClock], caplog: pytest.LogCaptureFixture
) -> None:
    live, clock = audited
    call = live.call
    assert (
        call(
            "POST", "/collections/", {"collectionName": "orders", "isManual": True}, headers=h("ops")
        ).status_code
        == 200
    )
    assert (
        call(
            "POST", "/collections/", {"collectionName": "orders", "isManual": True}, headers=h("token")
        ).status_code
        == 409
    )
    assert (
        call(
            "POST",
            "/collections/orders/generation/start",
            {"generationId": {"value": "g1"}},
            headers=h("etl"),
        ).status_code
        == 200
    )
    put = {"item": {"key": {"value": "k"}, "value": {"value": "v"}}, "generationId": {"value": "g1"}}
    assert call("POST", "/collections/orders/put", put, headers=h("etl")).status_code == 200
    assert (
        call(
            "POST",
            "/collections/orders/generation/commit",
            {"generationId": {"value": "g1"}},
            headers=h("etl"),
        ).status_code
        == 200
    )
    assert (
        call("POST", "/collections/orders/get", {"key": {"value": "k"}}, headers=h("viewer")).status_code
        == 200
    )
    reader = {"readerName": "r", "generationId": None}
    assert call("POST", "/collections/orders/readers/", reader, headers=h("etl")).status_code == 200
    assert (
        call(
            "PUT", "/collections/orders/readers/r", {"generationId": {"value": "g1"}}, headers=h("etl")
        ).status_code
        == 200
    )
    assert call("DELETE", "/collections/orders/readers/r", headers=h("etl")).status_code == 200
    hold = {"readerName": HOLD_PREFIX + "replica-1", "generationId": None}  # replication, not a hand
    assert call("POST", "/collections/orders/readers/", hold, headers=h("etl")).status_code == 200
    lease = "/collections/orders/leases/owner"
    assert (
        call("POST", f"{lease}/acquire", {"owner": "a", "ttlMs": 1000}, headers=h("etl")).status_code == 200
    )
    assert (
        call("POST", f"{lease}/acquire", {"owner": "a", "ttlMs": 1000}, headers=h("etl")).status_code == 200
    )
    assert (
        call("POST", f"{lease}/acquire", {"owner": "b", "ttlMs": 1000}, headers=h("etl")).status_code == 409
    )
    clock.now_ms += 5_000  # a's lease expires: b takes it over
    assert (
        call("POST", f"{lease}/acquire", {"owner": "b", "ttlMs": 1000}, headers=h("etl")).status_code == 200
    )
    revert = {"toGenerationId": {"value": ""}}
    assert (
        call("POST", "/collections/orders/revert", revert, headers=h("ops")).status_code == 409
    )  # manual: no gen
    assert (
        call("PUT", "/collections/orders/retention", {"keepGenerations": 3}, headers=h("ops")).status_code
        == 200
    )
    assert call("POST", "/collections/orders/put", put, headers=h("viewer")).status_code == 403
    assert call("DELETE", "/collections/orders", headers={"authorization": "Bearer guess"}).status_code == 401
    assert call("POST", "/replica/promote", {}, headers=h("ops")).status_code == 409
    assert (
        call(
            "POST", "/replica/stepDown", {"term": 3, "primary": "http://127.0.0.1:9"}, headers=h("ops")
        ).status_code
        == 200
    )
    assert call("POST", "/replica/stepUp", {"term": 3}, headers=h("ops")).status_code == 200
    assert call("GET", "/backup", headers=h("ops")).status_code == 200
    assert call("DELETE", "/collections/orders", headers=h("ops")).status_code == 200

    lines = audit_lines(caplog)
    seen = [
        (line["action"], line["token"], line["collection"], line["outcome"], line["status"]) for line in lines
    ]
    assert seen == [
        ("createCollection", "ops", "orders", "ok", "200"),
        ("createCollection", "token", "orders", "collectionExists", "409"),
        ("createReader", "etl", "orders", "ok", "200"),
        ("moveReader", "etl", "orders", "ok", "200"),
        ("deleteReader", "etl", "orders", "ok", "200"),
        ("leaseTakeover", "etl", "orders", "leaseLost", "409"),
        ("leaseTakeover", "etl", "orders", "ok", "200"),
        ("revert", "ops", "orders", "generationMismatch", "409"),
        ("setRetention", "ops", "orders", "ok", "200"),
        ("denied", "viewer", "orders", "forbidden", "403"),
        ("deleteCollection", "-", "orders", "unauthorized", "401"),
        ("promote", "ops", "-", "notReplica", "409"),
        ("stepDown", "ops", "-", "ok", "200"),
        ("stepUp", "ops", "-", "ok", "200"),
        ("backup", "ops", "-", "ok", "200"),
        ("deleteCollection", "ops", "orders", "ok", "200"),
    ]
    assert all(re.fullmatch(r"127\.0\.0\.1:\d+", line["remote"]) for line in lines)
    assert lines[9]["route"] == "POST /collections/{c}/put"

    metrics = live.call("GET", "/metrics", headers=h("viewer")).text
    assert 'diffstore_audit_total{action="deleteCollection",outcome="ok",token="ops"} 1.0' in metrics
    assert 'diffstore_audit_total{action="deleteCollection",outcome="unauthorized",token="-"} 1.0' in metrics
    assert 'diffstore_audit_total{action="leaseTakeover",outcome="leaseLost",token="etl"} 1.0' in metrics
    assert 'diffstore_audit_total{action="denied",outcome="forbidden",token="viewer"} 1.0' in metrics


def test_secrets_appear_in_no_log_url_metric_or_answer(
    audited: tuple[Live, ManualClock], caplog: pytest.LogCaptureFixture
) -> None:
    """A run of requests of every kind -- accepted, refused, with a wrong or a truncated secret -- then a
    grep of everything the server said and logged for every secret."""
    live, _ = audited
    answers: list[httpx.Response] = []
    secrets = [*SECRETS.values(), OLD_TOKEN]
    for name in (*SECRETS, "token"):
        for method, path, body in (
            ("POST", "/collections/", {"collectionName": f"orders-{name}", "isManual": False}),
            (
                "POST",
                f"/collections/orders-{name}/put",
                {"item": {"key": {"value": "k"}, "value": {"value": "v"}}},
            ),
            ("GET", "/collections/", None),
            ("DELETE", f"/collections/orders-{name}", None),
            ("GET", "/no/route", None),
        ):
            answers.append(live.call(method, path, body, headers=h(name)))
    for secret in secrets:
        for given in (secret[:-1], secret + "x", secret.upper()):
            answers.append(live.call("GET", "/collections/", headers={"authorization": f"Bearer {given}"}))
    answers.append(live.call("GET", "/metrics", headers=h("ops")))
    assert {answer.status_code for answer in answers} >= {200, 401, 403, 404}
    said = "\n".join(
        f"{answer.request.url} {answer.headers} {answer.text}" for answer in answers
    ) + "\n".join(f"{r.name} {r.getMessage()}" for r in caplog.records)
    assert "audit action=" in said and "GET /collections/" in said  # the audit trail and the access log
    for secret in secrets:
        for part in (secret, secret[:-1], secret.upper()):
            assert part not in said, part


@pytest.mark.parametrize(
    ("status", "body", "outcome"),
    [(200, b"", "ok"), (409, b'{"error":"leaseLost","reason":"x"}', "leaseLost"), (500, b"<html>", "500")],
)
def test_the_outcome_of_an_answer(status: int, body: bytes, outcome: str) -> None:
    assert outcome_of(status, body) == outcome


def test_without_tokens_admin_actions_are_still_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "diffstore.audit")
    with live_server(tmp_path / "data") as live:
        live.ok("POST", "/collections/", {"collectionName": "x", "isManual": True})
        live.ok("DELETE", "/collections/x")
    assert [(line["action"], line["token"]) for line in audit_lines(caplog)] == [
        ("createCollection", "-"),
        ("deleteCollection", "-"),
    ]
