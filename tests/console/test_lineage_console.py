"""The console's Lineage view in headless Chromium over a real server: the tree, following commits, links."""

from __future__ import annotations

from typing import Any

from diffstore import shell
from tests.server.conftest import Live, es

STREAM = "hstream://events"
SHARD = "hstream/sub/0"
P1 = (1).to_bytes(8, "big") + bytes(4)
P2 = (2).to_bytes(8, "big") + bytes(4)
DEADLINE_MS = 20_000  # a bound on hanging, not a timing assertion


def commit(live: Live, name: str, generation: str, updates: list[tuple[str, bytes]]) -> None:
    live.ok("POST", f"/collections/{name}/generation/start", {"generationId": es(generation)})
    body = {
        "generationId": es(generation),
        "updateReaders": [{"readerName": r, "generationId": es(g)} for r, g in updates],
    }
    live.ok("POST", f"/collections/{name}/generation/commit", body)


def _pipeline(live: Live) -> None:
    for name in ("A", "C"):
        live.ok("POST", "/collections/", {"collectionName": name, "isManual": True})
    live.ok("POST", "/collections/A/readers/", {"readerName": SHARD, "collectionName": STREAM})
    live.ok("POST", "/collections/A/readers/", {"readerName": "keep"})
    live.ok("POST", "/collections/C/readers/", {"readerName": "from_a", "collectionName": "A"})
    commit(live, "A", "a1", [(SHARD, P1)])
    commit(live, "A", "a2", [(SHARD, P2)])
    commit(live, "C", "c1", [("from_a", b"a1")])


def test_lineage_view_shows_the_tree_and_follows_commits(live: Live, page: Any) -> None:
    _pipeline(live)
    page.goto(f"{live.url}/ui/#/collections")
    page.wait_for_selector("#collections tr[data-name='C']")
    page.click("#collections tr[data-name='C'] a[href='#/lineage/C']")
    page.wait_for_selector("#lineage li.source[data-reader='from_a'] li.source")  # default depth 3
    top = page.inner_text("#lineage li.source[data-reader='from_a']")
    assert "from_a ← A: none → a1" in top
    nested = page.inner_text(f"#lineage li.source[data-reader='{SHARD}']")
    assert f"{STREAM}: none → {shell.show(P1)}" in nested
    assert "c1" in page.inner_text("#lineage-of")

    # the current generation's lineage follows the commits
    page.wait_for_function("document.getElementById('live-status')?.innerText.includes('live')")
    commit(live, "C", "c2", [("from_a", b"a2")])
    page.wait_for_function(
        "document.getElementById('lineage-of')?.innerText.includes('c2')", timeout=DEADLINE_MS
    )
    span = "#lineage li.source[data-reader='from_a'] > .span code"
    assert page.eval_on_selector_all(span, "cs => cs.map(c => c.innerText)") == ["a1", "a2"]
    assert f"{shell.show(P1)} → {shell.show(P2)}" in page.inner_text(
        f"#lineage li.source[data-reader='{SHARD}']"
    )
    assert "c2" in page.inner_text("#banner")

    # an earlier generation on request, at depth 1
    page.fill("#generation", "c1")
    page.select_option("#depth", "1")
    page.click("#lineage-form button[type=submit]")
    page.wait_for_function("document.getElementById('lineage-of')?.innerText.includes('c1')")
    assert page.locator(f"#lineage li.source[data-reader='{SHARD}']").count() == 0
    assert "g=c1" in page.url and "depth=1" in page.url

    # a source links to its own lineage at the generation the reader moved to
    page.click("#lineage li.source[data-reader='from_a'] a")
    page.wait_for_function("location.hash.startsWith('#/lineage/A')")
    page.wait_for_function("document.getElementById('lineage-of')?.innerText.includes('a1')")
    assert f"{SHARD} ← {STREAM}: none → {shell.show(P1)}" in page.inner_text("#lineage")


def test_lineage_view_says_when_a_commit_moved_nothing_or_is_collected(live: Live, page: Any) -> None:
    _pipeline(live)
    page.goto(f"{live.url}/ui/#/lineage/A?g=&depth=2")
    page.wait_for_selector(f"#lineage li.source[data-reader='{SHARD}']")
    live.ok("POST", "/collections/", {"collectionName": "empty", "isManual": True})
    commit(live, "empty", "e1", [])
    page.goto(f"{live.url}/ui/#/lineage/empty")
    page.wait_for_function("document.getElementById('lineage')?.innerText.includes('moved no reader')")
    # C's reader of A moves past a1: a1 is below A's minimum once 'keep' goes, so its lineage is collected
    live.ok("DELETE", "/collections/A/readers/keep")
    commit(live, "C", "c2", [("from_a", b"a2")])
    page.goto(f"{live.url}/ui/#/lineage/A?g=a1")
    page.wait_for_selector("#error:not([hidden])")
    assert "generationCollected" in page.inner_text("#error")
