"""Refs (`@current`, `@open`, `~N`, `@reader:NAME`, an ISO time) wherever the console takes a generation,
resolved by the server's GET /collections/{c}/refs; a bad ref is an error on the page. Headless Chromium over
a real server whose clock the test sets."""

from __future__ import annotations

import datetime
from typing import Any
from urllib.parse import quote

import pytest

from tests.console.test_console_browser import commit
from tests.console.test_console_history import HOUR_MS, Clock, clock, live  # noqa: F401 (fixtures)
from tests.server.conftest import Live, es

__all__ = ["clock", "live"]


def _codes(page: Any, selector: str) -> list[str]:
    return page.eval_on_selector_all(f"{selector} code", "cs => cs.map(c => c.innerText)")  # type: ignore[no-any-return]


def _store(live: Live, clock: Clock) -> str:
    """m: g1 three hours ago, g2 and g3 now, g4 open; out's reader r of m at g1. Returns an ISO time
    between g1 and g2."""
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    clock.behind_ms = 3 * HOUR_MS
    commit(live, "m", "g1", {"a": "1"})
    clock.behind_ms = 0
    commit(live, "m", "g2", {"a": "2"})
    commit(live, "m", "g3", {"a": "3", "b": "3"})
    live.ok("POST", "/collections/m/generation/start", {"generationId": es("g4")})
    live.ok(
        "POST", "/collections/m/put", {"item": {"key": es("c"), "value": es("4")}, "generationId": es("g4")}
    )
    live.ok("POST", "/collections/", {"collectionName": "out", "isManual": True})
    live.ok(
        "POST",
        "/collections/out/readers/",
        {"readerName": "r", "collectionName": "m", "generationId": es("g1")},
    )
    hour_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)
    return "@" + hour_ago.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_refs_in_every_view(live: Live, clock: Clock, page: Any) -> None:
    an_hour_ago = _store(live, clock)
    page.goto(f"{live.url}/ui/#/browse/m?g=~1")
    page.wait_for_selector("#asof code")
    assert _codes(page, "#asof") == ["g2"]
    page.fill("#generation", "@reader:r")
    page.click("#browse-form button[type=submit]")
    page.wait_for_function("document.querySelector('#asof code')?.innerText === 'g1'")
    page.fill("#generation", an_hour_ago)  # the newest generation committed by then
    page.click("#browse-form button[type=submit]")
    page.wait_for_function("document.querySelector('#records tbody tr td + td')?.innerText === '1'")
    assert _codes(page, "#asof") == ["g1"]
    page.fill("#generation", "@open")
    page.click("#browse-form button[type=submit]")
    page.wait_for_function("document.querySelectorAll('#records tbody tr').length === 3")
    assert _codes(page, "#asof") == ["g4"]

    page.goto(f"{live.url}/ui/#/diff/m?from=@reader:out/r&to=@current")
    page.wait_for_function("document.querySelectorAll('#range code').length === 2")
    assert _codes(page, "#range") == ["g1", "g3"]
    assert sorted(page.eval_on_selector_all("#diff td.key", "ks => ks.map(k => k.innerText)")) == ["a", "b"]

    page.goto(f"{live.url}/ui/#/lineage/m?g=~2")
    page.wait_for_function("document.getElementById('lineage-of')?.innerText.includes('g1')")
    page.goto(f"{live.url}/ui/#/history/m?before=@current")
    page.wait_for_selector("#history tbody tr[data-generation='g2']")
    assert page.locator("#history tbody tr[data-generation='g3']").count() == 0


@pytest.mark.parametrize(
    ("address", "code"),
    [
        ("browse/m?g=@reader:nosuch", "noSuchReader"),
        ("diff/m?from=~99", "noSuchGeneration"),
        ("lineage/m?g=@2026-13-01T00:00:00Z", "invalidRequest"),  # no such month
        ("history/m?before=@nonsense", "invalidRequest"),
        ("browse/out?g=@open", "noSuchGeneration"),  # out has no open generation
    ],
)
def test_a_bad_ref_is_an_error_on_the_page(
    live: Live, clock: Clock, page: Any, address: str, code: str
) -> None:
    _store(live, clock)
    page.goto(f"{live.url}/ui/#/{quote(address, safe='/?=&@:')}")
    page.wait_for_selector("#problem:not([hidden])")
    assert code in page.inner_text("#problem")
    for table in ("#records", "#diff", "#history"):
        assert page.locator(f"{table} tbody tr").count() == 0
