"""The console's commit times and History view in headless Chromium over a real server whose clock the test
sets (so a commit happened "3 h ago"), and unknown generations in the address: an error on the page."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from diffstore.engine.types import StoreConfig, wall_clock_ms
from tests.console.test_console_browser import commit
from tests.server.conftest import Live, es, live_server

HOUR_MS = 3_600_000
MINUTE_MS = 60_000


class Clock:
    """The server's clock, set back by ``behind_ms`` (commits are stamped that long ago)."""

    def __init__(self) -> None:
        self.behind_ms = 0

    def __call__(self) -> int:
        return wall_clock_ms() - self.behind_ms


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def live(tmp_path: Path, clock: Clock) -> Iterator[Live]:
    with live_server(
        tmp_path / "data", store_config=StoreConfig(commit_delay_ms=20, clock_ms=clock)
    ) as running:
        yield running


def _log(live: Live, clock: Clock) -> dict[str, Any]:
    """m: g1 three hours ago (two keys), g2 three minutes ago (one key, with metadata), g3 now."""
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    clock.behind_ms = 3 * HOUR_MS
    commit(live, "m", "g1", {"a": "1", "b": "2"})
    clock.behind_ms = 3 * MINUTE_MS
    live.ok("POST", "/collections/m/generation/start", {"generationId": es("g2")})
    live.ok(
        "POST", "/collections/m/put", {"item": {"key": es("a"), "value": es("5")}, "generationId": es("g2")}
    )
    live.ok(
        "POST",
        "/collections/m/generation/commit",
        {"generationId": es("g2"), "metadata": {"job": "nightly", "round": "7"}},
    )
    clock.behind_ms = 0
    commit(live, "m", "g3", {"c": "3"})
    return {
        item["generationId"]["value"]: item for item in live.ok("GET", "/collections/m/generations")["items"]
    }


def _cells(page: Any) -> list[list[str]]:
    return page.eval_on_selector_all(  # type: ignore[no-any-return]
        "#history tbody tr:not(.origin)",
        "rows => rows.map(r => Array.from(r.cells, c => c.innerText.trim()))",
    )


def test_history_lists_commits_with_times_and_links(
    live: Live, clock: Clock, page: Any, screenshot: Callable[[str], Path]
) -> None:
    known = _log(live, clock)
    page.goto(f"{live.url}/ui/#/history/m")
    page.wait_for_selector("#history tbody tr[data-generation='g1']")
    cells = _cells(page)
    assert [row[0] for row in cells] == ["g3", "g2", "g1"]  # newest first
    assert "started at" in page.inner_text("#history tr.origin")  # then the empty generation ""
    assert [row[2] for row in cells] == ["1", "1", "2"]  # changed keys
    assert "3 min ago" in cells[1][1] and "3 h ago" in cells[2][1]
    assert "job=nightly" in cells[1][3] and "round=7" in cells[1][3] and cells[0][3] == ""
    # the local time shown is the browser's rendering of the commit's own instant
    g1 = page.locator("#history tr[data-generation='g1'] time")
    ms = known["g1"]["committedAtMs"]
    assert g1.get_attribute("datetime") == page.evaluate(f"new Date({ms}).toISOString()")
    assert page.evaluate(f"new Date({ms}).toLocaleTimeString()") in g1.inner_text()
    assert "g1" in (g1.get_attribute("title") or "")
    screenshot("history")

    # a commit's diff: against the generation before it
    page.click("#history tr[data-generation='g2'] a.to-diff")
    page.wait_for_selector("#diff tbody tr.changed")
    assert "from=g1" in page.url and "to=g2" in page.url
    assert page.locator("#diff tbody tr").count() == 1
    assert page.eval_on_selector_all("#range code", "cs => cs.map(c => c.innerText)") == ["g1", "g2"]
    # the range's ids carry their commit times
    page.wait_for_function("document.querySelectorAll('#range time.when[data-ms]').length === 2")
    assert "3 h ago" in page.inner_text("#range") and "3 min ago" in page.inner_text("#range")

    page.go_back()
    page.wait_for_selector("#history tr[data-generation='g1']")
    page.click("#history tr[data-generation='g1'] a.to-lineage")
    page.wait_for_function("document.getElementById('lineage-of')?.innerText.includes('g1')")
    assert "g=g1" in page.url


def test_history_pages_back_and_follows_commits(live: Live, clock: Clock, page: Any) -> None:
    _log(live, clock)
    page.goto(f"{live.url}/ui/#/history/m?limit=20")
    page.wait_for_selector("#history tbody tr[data-generation='g1']")
    page.select_option("#limit", "20")
    # a page of two needs the third to link the second's diff: g2's diff starts at g1 on a page of two
    page.evaluate("document.getElementById('limit').innerHTML += '<option>2</option>'")
    page.select_option("#limit", "2")
    page.click("#history-form button[type=submit]")
    page.wait_for_function("document.querySelectorAll('#history tbody tr').length === 2")
    assert [row[0] for row in _cells(page)] == ["g3", "g2"]
    assert "from=g1" in (page.get_attribute("#history tr[data-generation='g2'] a.to-diff", "href") or "")
    page.click("#older")
    page.wait_for_function("document.querySelector('#history tbody tr')?.dataset.generation === 'g1'")
    assert "the oldest" in page.inner_text("#page") and page.is_disabled("#older")
    # the oldest commit's diff starts at the beginning
    assert "from=&" in (page.get_attribute("#history tr[data-generation='g1'] a.to-diff", "href") or "")
    page.click("#newer")
    page.wait_for_function("document.querySelector('#history tbody tr')?.dataset.generation === 'g3'")
    # the newest page follows commits
    page.wait_for_function("document.getElementById('live-status')?.innerText.includes('live')")
    commit(live, "m", "g4", {"d": "4"})
    page.wait_for_function("document.querySelector('#history tbody tr')?.dataset.generation === 'g4'")
    assert "g4" in page.inner_text("#banner")


def test_generation_ids_show_their_commit_time(
    live: Live, clock: Clock, page: Any, screenshot: Callable[[str], Path]
) -> None:
    _log(live, clock)
    live.ok("POST", "/collections/", {"collectionName": "out", "isManual": True})
    live.ok(
        "POST",
        "/collections/out/readers/",
        {"readerName": "r", "collectionName": "m", "generationId": es("g1")},
    )
    page.goto(f"{live.url}/ui/")
    when = "#collections tr[data-name='m'] td.generation time.when[data-ms]"
    page.wait_for_selector(when)
    assert page.inner_text("#collections tr[data-name='m'] td.generation code") == "g3"
    assert "generation g3" in (page.get_attribute(when, "title") or "")  # the id and full time on hover
    # a reader's generation with the time that generation of its target was committed
    reader = "#collections tr[data-name='out'] .reader time.when[data-ms]"
    page.wait_for_selector(reader)
    assert "3 h ago" in page.inner_text(reader)
    # out's generation is the empty one it started at
    page.wait_for_selector("#collections tr[data-name='out'] td.generation time.when[data-filled]")
    assert page.inner_text("#collections tr[data-name='out'] td.generation time") == "the start"
    screenshot("collections")
    page.goto(f"{live.url}/ui/#/browse/m?g=g2")
    page.wait_for_selector("#asof time.when[data-ms]")
    assert "3 min ago" in page.inner_text("#asof")


@pytest.mark.parametrize(
    "address",
    [
        "browse/m?g=g15",  # between g1 and g2: the API reads it as g1; the console refuses it
        "browse/m?g=nosuchgen",  # above the current one: 404 from the API
        "diff/m?from=g15",
        "diff/m?from=g1&to=g25",
        "lineage/m?g=g15",
        "history/m?before=g15",
    ],
)
def test_an_unknown_generation_in_the_address_is_an_error_on_the_page(
    live: Live, clock: Clock, page: Any, address: str
) -> None:
    _log(live, clock)
    page.goto(f"{live.url}/ui/#/{address}")
    page.wait_for_selector("#problem:not([hidden])")
    assert "no generation" in page.inner_text("#problem") or "noSuchGeneration" in page.inner_text("#problem")
    for table in ("#records", "#diff", "#history"):  # no rows of another generation under the error
        assert page.locator(f"{table} tbody tr").count() == 0
    assert page.locator("#lineage li").count() == 0
