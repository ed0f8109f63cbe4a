"""The operator console in a headless Chromium: every view over a real server, live updates, the token."""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

from diffstore import shell
from diffstore.server import ServerConfig
from tests.server.conftest import Live, es, live_server

LIVE_DEADLINE_MS = 2000  # the bound for a commit to show on an open page


def commit(live: Live, name: str, generation: str, items: dict[str, str | bytes | None]) -> None:
    live.ok("POST", f"/collections/{name}/generation/start", {"generationId": es(generation)})
    if items:
        wire = [{"key": es(k), "value": None if v is None else es(v)} for k, v in items.items()]
        live.ok("POST", f"/collections/{name}/putMany", {"generationId": es(generation), "items": wire})
    live.ok("POST", f"/collections/{name}/generation/commit", {"generationId": es(generation)})


def rows(page: Any, selector: str) -> list[list[str]]:
    return page.eval_on_selector_all(
        selector, "rows => rows.map(r => Array.from(r.cells, c => c.innerText.trim()))"
    )  # type: ignore[no-any-return]


def test_collections_list_shows_collections_made_over_http(live: Live, page: Any) -> None:
    live.ok("POST", "/collections/", {"collectionName": "orders", "isManual": True})
    live.ok("POST", "/collections/", {"collectionName": "users", "isManual": False})
    live.ok("POST", "/collections/", {"collectionName": "totals", "isManual": True})
    commit(live, "orders", "g1", {"o1": "10"})
    live.ok(
        "POST",
        "/collections/totals/readers/",
        {"readerName": "from_orders", "collectionName": "orders", "generationId": None},
    )
    page.goto(f"{live.url}/ui/")
    page.wait_for_selector("#collections tbody tr[data-name='users']")
    table = {row[0]: row for row in rows(page, "#collections tbody tr")}
    assert list(table) == ["orders", "totals", "users"]
    # the generation's cell: its id, then its commit time (tests/console/test_console_history.py)
    assert table["orders"][1] == "manual" and table["orders"][2].split()[0] == "g1"
    # ids in the command line's one text form (diffstore.shell), which every command accepts back
    assert table["users"][1] == "auto" and table["users"][3] == "base64:AAAAAAAAAAE="
    assert shell.parse(table["users"][3]) == (1).to_bytes(8, "big")
    assert "from_orders ← orders" in table["totals"][4] and "lag 1" in table["totals"][4]
    page.fill("#filter", "tot")
    assert page.locator("#collections tbody tr:visible").count() == 1


def test_diff_view_shows_a_diff_with_values_between(live: Live, page: Any) -> None:
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    commit(live, "m", "g1", {"a": "1", "b": "2", "bin": b"\x00\xff"})
    commit(live, "m", "g2", {"a": "5"})
    commit(live, "m", "g3", {"a": "9", "b": None, "c": "3", "bin": b"\x01\xfe"})
    page.goto(f"{live.url}/ui/#/diff/m?from=g1&to=g3")
    page.wait_for_selector("#diff tbody tr.changed")
    shown = {row[1]: row[2:4] for row in rows(page, "#diff tbody tr")}  # row[0]: the +/−/~ marker
    assert shown == {
        "a": ["1", "9"],
        "b": ["2", "null"],
        "bin": [shell.show(b"\x00\xff"), shell.show(b"\x01\xfe")],  # text when printable, else base64:
        "c": ["null", "3"],
    }
    assert page.locator("#diff tbody tr.removed").count() == 1 and page.locator("tr.added").count() == 1
    page.locator("#diff tbody tr", has_text="a").first.locator("button.between").click()
    page.wait_for_selector("tr.between-values")
    assert "5" in page.inner_text("tr.between-values")
    assert "up to g3" in page.inner_text("#range")


def test_diff_from_a_reader(live: Live, page: Any) -> None:
    live.ok("POST", "/collections/", {"collectionName": "src", "isManual": True})
    live.ok("POST", "/collections/", {"collectionName": "dst", "isManual": True})
    commit(live, "src", "g1", {"x": "1"})
    live.ok(
        "POST",
        "/collections/dst/readers/",
        {"readerName": "r", "collectionName": "src", "generationId": es("g1")},
    )
    commit(live, "src", "g2", {"y": "2"})
    page.goto(f"{live.url}/ui/#/collections")
    page.click("#collections tr[data-name='dst'] a:text('diff')")
    page.wait_for_selector("#diff tbody tr.added")
    assert [row[:4] for row in rows(page, "#diff tbody tr")] == [["+\ninserted", "y", "null", "2"]]
    assert page.eval_on_selector_all("#range code", "cs => cs.map(c => c.innerText)") == ["g1", "g2"]


def test_diff_of_many_items_is_paged(live: Live, page: Any) -> None:
    live.ok("POST", "/collections/", {"collectionName": "big", "isManual": True})
    commit(live, "big", "g1", {f"k{i:05d}": f"v{i}" for i in range(12_000)})
    page.goto(f"{live.url}/ui/#/diff/big")
    page.wait_for_selector("#diff tbody tr.added")
    assert page.locator("#diff tbody tr").count() == 200
    page.click("#next")
    page.wait_for_function("document.querySelector('#diff tbody tr td.key')?.innerText === 'k00200'")
    assert page.locator("#diff tbody tr").count() == 200
    assert "page 2" in page.inner_text("#page")
    page.click("#prev")
    page.wait_for_function("document.querySelector('#diff tbody tr td.key')?.innerText === 'k00000'")


def test_browse_pages_jumps_and_shows_phantoms(live: Live, page: Any) -> None:
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    commit(live, "m", "g1", {f"k{i:03d}": f"old{i}" for i in range(150)})
    commit(live, "m", "g2", {"k000": "new0"})
    page.goto(f"{live.url}/ui/#/browse/m")
    page.wait_for_selector("#records tbody tr")
    assert rows(page, "#records tbody tr")[0] == ["k000", "new0"]
    assert page.locator("#records tbody tr").count() == 100
    page.click("#next")
    page.wait_for_function("document.querySelector('#records tbody tr td')?.innerText === 'k100'")
    assert page.locator("#records tbody tr").count() == 50
    # as of an older generation
    page.fill("#generation", "g1")
    page.click("#browse-form button[type=submit]")
    page.wait_for_function("document.querySelector('#records tbody tr td + td')?.innerText === 'old0'")
    # jump to a key (getKeysAround): the key is highlighted after the keys before it
    page.fill("#generation", "")
    page.fill("#jump", "k120")
    page.click("#browse-form button[type=submit]")
    page.wait_for_selector("#records tr.found")
    assert page.inner_text("#records tr.found td") == "k120"
    assert rows(page, "#records tbody tr")[0][0] == "k115"
    # phantoms: records written under a phantom id show only when browsing with it
    phantom = live.ok("POST", "/collections/m/phantom/start", {})["phantomId"]
    live.ok(
        "POST",
        "/collections/m/put",
        {"item": {"key": es("k000"), "value": es("ghost")}, "generationId": es("g2"), "phantomId": phantom},
    )
    page.fill("#jump", "")
    page.fill("#phantom", shell.show(es_bytes(phantom)))  # typed as the command line prints it
    page.fill("#generation", "g2")
    page.click("#browse-form button[type=submit]")
    page.wait_for_function("document.querySelector('#records tbody tr td + td')?.innerText === 'ghost'")


def es_bytes(es_value: dict[str, str]) -> bytes:
    if es_value.get("encoding") == "base64":
        return base64.b64decode(es_value["value"])
    return es_value["value"].encode()


def test_pipeline_graph_draws_readers(live: Live, page: Any) -> None:
    for name in ("A", "B", "C"):
        live.ok("POST", "/collections/", {"collectionName": name, "isManual": True})
    live.ok("POST", "/collections/", {"collectionName": "alone", "isManual": True})
    live.ok("POST", "/collections/C/readers/", {"readerName": "from_a", "collectionName": "A"})
    live.ok("POST", "/collections/C/readers/", {"readerName": "from_b", "collectionName": "B"})
    live.ok("POST", "/collections/A/readers/", {"readerName": "pos", "collectionName": "hstream://events"})
    page.goto(f"{live.url}/ui/#/graph")
    page.wait_for_selector("#graph svg")
    nodes = page.eval_on_selector_all("#graph g.node", "ns => ns.map(n => n.dataset.node)")
    assert sorted(nodes) == ["A", "B", "C", "hstream://events"]
    assert page.locator("#graph path.edge").count() == 3
    assert page.locator("#graph g.node.stream").count() == 1
    # A,B -> C: C is drawn to the right of both
    x = {
        n: page.eval_on_selector(f"#graph g.node[data-node='{n}']", "n => n.getBBox && n.getCTM().e")
        for n in nodes
    }
    assert x["C"] > x["A"] > x["hstream://events"] and x["C"] > x["B"]
    assert "alone" in page.inner_text("#isolated")


def _wait_live(page: Any, condition: str, what: str) -> float:
    started = time.monotonic()
    try:
        page.wait_for_function(condition, timeout=LIVE_DEADLINE_MS)
    except Exception as exc:
        raise AssertionError(f"the open page did not show {what} within {LIVE_DEADLINE_MS} ms") from exc
    return time.monotonic() - started


def test_a_commit_updates_open_pages(live: Live, page: Any) -> None:
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    commit(live, "m", "g1", {"a": "1"})
    page.goto(f"{live.url}/ui/")
    page.wait_for_selector("#collections tr[data-name='m']")
    page.wait_for_function("document.getElementById('live-status')?.innerText.includes('live')")
    commit(live, "m", "g2", {"a": "2"})
    _wait_live(
        page,
        "document.querySelector(\"#collections tr[data-name='m'] td.generation code\")?.innerText === 'g2'",
        "the new generation in the collections list",
    )
    page.goto(f"{live.url}/ui/#/browse/m")
    page.wait_for_function("document.querySelector('#records tbody tr td + td')?.innerText === '2'")
    commit(live, "m", "g3", {"a": "3", "b": "new"})
    _wait_live(
        page, "document.querySelectorAll('#records tbody tr').length === 2", "the new record in Browse"
    )
    assert "g3" in page.inner_text("#banner")
    page.goto(f"{live.url}/ui/#/diff/m?from=g1")
    page.wait_for_selector("#diff tbody tr")
    commit(live, "m", "g4", {"c": "4"})
    _wait_live(
        page,
        "Array.from(document.querySelectorAll('#diff tbody tr td.key')).some(td => td.innerText === 'c')",
        "the new key in the diff",
    )
    assert "up to g4" in page.inner_text("#range")


def test_auto_commits_update_the_browse_page(live: Live, page: Any) -> None:
    live.ok("POST", "/collections/", {"collectionName": "auto", "isManual": False})
    page.goto(f"{live.url}/ui/#/browse/auto")
    page.wait_for_selector("#records tbody tr")
    page.wait_for_function("document.getElementById('live-status')?.innerText.includes('live')")
    live.ok("POST", "/collections/auto/put", {"item": {"key": es("k"), "value": es("v")}})
    _wait_live(
        page, "document.querySelector('#records tbody tr td')?.innerText === 'k'", "the auto-committed put"
    )


def test_the_token_prompt(tmp_path: Path, browser: Any, page: Any) -> None:
    with live_server(tmp_path / "data", ServerConfig(token="s3cret")) as live:
        live.ok("POST", "/collections/", {"collectionName": "guarded", "isManual": True})
        page.goto(f"{live.url}/ui/")
        page.wait_for_selector("#token-dialog[open]")
        page.fill("#token-input", "wrong")
        page.click("#token-submit")
        page.wait_for_selector("#token-error:not([hidden])")  # refused: asked again, saying so
        page.fill("#token-input", "s3cret")
        page.click("#token-submit")
        page.wait_for_selector("#collections tr[data-name='guarded']")
        # asked once: the tab keeps it (sessionStorage) across a reload
        page.reload()
        page.wait_for_selector("#collections tr[data-name='guarded']")
        assert not page.is_visible("#token-dialog")
        # a link may carry it in the fragment; the address loses it at once
        context = browser.new_context()
        try:
            fresh = context.new_page()
            fresh.goto(f"{live.url}/ui/#token=s3cret")
            fresh.wait_for_selector("#collections tr[data-name='guarded']")
            assert "s3cret" not in fresh.url
            assert not fresh.is_visible("#token-dialog")
        finally:
            context.close()
