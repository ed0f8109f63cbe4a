"""The console's diff in headless Chromium over a real server: totals of the whole range, +/−/~ markers and a
legend, the filter by kind, and the field-level highlight of JSON values."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.console.test_console_browser import commit
from tests.server.conftest import Live

PEAR_1 = {"name": "pear", "price": 4.5, "tags": ["fruit"], "origin": {"country": "FR", "farm": "Les Vergers"}}
PEAR_2 = {"name": "pear", "price": 4.9, "tags": ["fruit", "green"], "origin": {"country": "FR"}}


def _shop(live: Live) -> None:
    live.ok("POST", "/collections/", {"collectionName": "shop", "isManual": True})
    commit(
        live,
        "shop",
        "g1",
        {
            "pear": json.dumps(PEAR_1),
            "fig": json.dumps({"price": 2}),
            "note": "plain text",
            "old": "gone soon",
        },
    )
    commit(
        live,
        "shop",
        "g2",
        {
            "pear": json.dumps(PEAR_2),
            "fig": json.dumps({"price": 2, "stock": 10}),
            "note": "plain text, edited",
            "old": None,
            "new1": "1",
            "new2": json.dumps({"price": 1}),
        },
    )


def _marks(page: Any) -> dict[str, str]:
    return dict(
        page.eval_on_selector_all(
            "#diff tbody tr[data-kind]",
            "rows => rows.map(r => [r.querySelector('td.key').innerText, r.dataset.kind])",
        )
    )


def test_diff_totals_markers_legend_and_json_fields(
    live: Live, page: Any, screenshot: Callable[[str], Path]
) -> None:
    _shop(live)
    page.goto(f"{live.url}/ui/#/diff/shop?from=g1&to=g2")
    page.wait_for_selector("#diff tbody tr.changed")
    page.wait_for_function("document.getElementById('totals')?.innerText.includes('counting') === false")
    totals = page.eval_on_selector_all(
        "#totals .total", "ts => Object.fromEntries(ts.map(t => [t.dataset.kind, t.innerText]))"
    )
    assert totals == {"inserted": "+ 2 inserted", "updated": "~ 3 updated", "deleted": "− 1 deleted"}
    assert "6 keys" in page.inner_text("#totals")
    # each row says its kind in a glyph and a word (not colour alone), and the legend says what each means
    assert _marks(page) == {
        "fig": "updated",
        "new1": "inserted",
        "new2": "inserted",
        "note": "updated",
        "old": "deleted",
        "pear": "updated",
    }
    mark = page.eval_on_selector_all(
        "#diff tbody tr[data-kind] td.mark", "cs => cs.map(c => [c.textContent, c.title])"
    )
    assert {tuple(m) for m in mark} == {
        ("+inserted", "inserted"),
        ("~updated", "updated"),
        ("−deleted", "deleted"),
    }
    legend = page.inner_text("#legend")
    assert "+ inserted" in legend and "− deleted" in legend and "~ updated" in legend

    # JSON: the fields that changed are marked on both sides and listed; the others are not
    pear = "#diff tbody tr[data-key='pear']"
    to_marks = page.eval_on_selector_all(
        f"{pear} td.to mark.field", "ms => ms.map(m => [m.dataset.path, m.className, m.innerText])"
    )
    assert to_marks == [
        ["price", "field changed", '"price": 4.9'],
        ["tags[1]", "field added", '"green"'],
    ]
    from_marks = page.eval_on_selector_all(
        f"{pear} td.from mark.field", "ms => ms.map(m => [m.dataset.path, m.className, m.innerText])"
    )
    assert from_marks == [
        ["price", "field changed", '"price": 4.5'],
        ["origin.farm", "field removed", '"farm": "Les Vergers"'],
    ]
    listed = page.eval_on_selector_all(f"{pear} ul.fields li", "ls => ls.map(l => l.innerText)")
    assert listed == [
        "~ price changed: 4.5 → 4.9",
        '+ tags[1] added: "green"',
        '− origin.farm removed: "Les Vergers"',
    ]
    fig = page.inner_text("#diff tbody tr[data-key='fig'] ul.fields")
    assert fig == "+ stock added: 10"
    # a value that is not a JSON object is shown whole, without a field list
    assert page.locator("#diff tbody tr[data-key='note'] ul.fields").count() == 0
    screenshot("diff")

    # the filter by kind: the other rows of the page are hidden, the address keeps it
    page.select_option("#kind", "deleted")
    assert list(
        page.eval_on_selector_all(
            "#diff tbody tr[data-kind]:not([hidden]) td.key", "ks => ks.map(k => k.innerText)"
        )
    ) == ["old"]
    assert "kind=deleted" in page.url and "1 of 6 deleted" in page.inner_text("#range")
    page.goto(f"{live.url}/ui/#/diff/shop?from=g1&to=g2&kind=inserted")
    page.reload()
    page.wait_for_selector("#diff tbody tr.changed", state="attached")
    shown = page.eval_on_selector_all(
        "#diff tbody tr[data-kind]:not([hidden]) td.key", "ks => ks.map(k => k.innerText)"
    )
    assert shown == ["new1", "new2"]
    # every field of the view has a label a screen reader announces
    assert page.evaluate(
        "Array.from(document.querySelectorAll('main input, main select')).every(e => e.labels.length > 0)"
    )


def test_totals_count_the_whole_range_not_the_page(live: Live, page: Any) -> None:
    live.ok("POST", "/collections/", {"collectionName": "big", "isManual": True})
    commit(live, "big", "g1", {f"k{i:05d}": "v" for i in range(2_500)})
    commit(live, "big", "g2", {**{f"k{i:05d}": None for i in range(300)}, "k00300": "w", "z": "new"})
    page.goto(f"{live.url}/ui/#/diff/big?from=g1")
    page.wait_for_selector("#diff tbody tr.removed")  # the first page: deletions only
    page.wait_for_function("document.getElementById('totals')?.innerText.includes('counting') === false")
    assert page.locator("#diff tbody tr").count() == 200  # one page
    text = page.inner_text("#totals")
    assert "+ 1 inserted" in text and "~ 1 updated" in text and "− 300 deleted" in text and "302 keys" in text
    # the filter on a page without that kind says so, and that the next page may have some
    page.select_option("#kind", "inserted")
    assert "No inserted key on this page: the next page may have some" in page.inner_text("#none-of-kind")
    page.click("#next")
    page.wait_for_selector("#diff tbody tr[data-key='z']:not([hidden])")
    assert page.locator("#none-of-kind").count() == 0


def test_a_lineage_span_links_to_its_diff(live: Live, page: Any) -> None:
    for name in ("A", "C"):
        live.ok("POST", "/collections/", {"collectionName": name, "isManual": True})
    live.ok("POST", "/collections/C/readers/", {"readerName": "from_a", "collectionName": "A"})
    commit(live, "A", "a1", {"x": "1"})
    commit(live, "A", "a2", {"x": "2", "y": "3"})
    live.ok("POST", "/collections/C/generation/start", {"generationId": {"value": "c1"}})
    live.ok(
        "POST",
        "/collections/C/generation/commit",
        {
            "generationId": {"value": "c1"},
            "updateReaders": [{"readerName": "from_a", "generationId": {"value": "a2"}}],
        },
    )
    page.goto(f"{live.url}/ui/#/lineage/C")
    page.wait_for_selector("#lineage li.source[data-reader='from_a'] a.span-diff")
    page.click("#lineage li.source[data-reader='from_a'] a.span-diff")
    page.wait_for_selector("#diff tbody tr.added")
    assert "to=a2" in page.url and "from=a" not in page.url  # the reader moved from nothing to a2
    assert sorted(page.eval_on_selector_all("#diff td.key", "ks => ks.map(k => k.innerText)")) == ["x", "y"]
