"""Issue 48 §2 in the console (headless Chromium over a real server): collected generations in History offer
nothing that answers 410; a live diff from ``@current`` keeps the generation it named when the view opened;
a failing view replaces the previous one and old errors go; the empty Collections view says what to do;
generation boxes show a whole base64 id; the ``between`` button is explained."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

from tests.console.test_console_browser import commit, rows
from tests.server.conftest import Live, es

DEADLINE_MS = 30_000  # generous: the machine is loaded (the bound of a commit showing is another test's)


def test_history_marks_collected_generations_and_links_nothing_there(live: Live, page: Any) -> None:
    live.ok(
        "POST",
        "/collections/",
        {"collectionName": "m", "isManual": True, "retention": {"keepGenerations": 2}},
    )
    for number in range(1, 5):
        commit(live, "m", f"g{number}", {"k": str(number)})
    live.ok("POST", "/collections/m/readers/", {"readerName": "r", "generationId": es("g4")})
    page.goto(f"{live.url}/ui/#/history/m")
    page.wait_for_selector("#history tbody tr[data-generation='g1']")
    collected = page.eval_on_selector_all(
        "#history tbody tr.collected", "rows => rows.map(r => r.dataset.generation)"
    )
    assert collected == ["g2", "g1", ""]
    for generation in ("g1", "g2"):
        row = page.locator(f"#history tbody tr[data-generation='{generation}']")
        assert "collected" in row.inner_text()
        assert row.locator("a").count() == 0  # no diff, no lineage: both would answer 410
    kept = page.locator("#history tbody tr[data-generation='g4']")
    assert kept.locator("a.to-diff").count() == 1 and kept.locator("a.to-lineage").count() == 1
    # g3's diff would start at g2, which is collected: none offered
    g3 = page.locator("#history tbody tr[data-generation='g3']")
    assert g3.locator("a.to-diff").count() == 0 and g3.locator("a.to-lineage").count() == 1
    # every link the page offers answers (none is a 410): asked of the API as the views would ask it
    for href in page.eval_on_selector_all(
        "#history tbody a", "links => links.map(a => a.getAttribute('href'))"
    ):
        view, query = href.removeprefix("#/").split("?")
        params = dict(parse_qsl(query, keep_blank_values=True))
        if view == "diff/m":
            body = {"fromGenerationId": es(params["from"]), "toGenerationId": es(params["to"])}
            live.ok("POST", "/collections/m/diff/", body)
        else:
            assert view == "lineage/m"
            live.ok("POST", "/collections/m/lineage", {"generationId": es(params["g"])})


def test_a_live_diff_from_current_keeps_the_generation_it_named(live: Live, page: Any) -> None:
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    commit(live, "m", "g1", {"a": "1"})
    page.goto(f"{live.url}/ui/#/diff/m?from=%40current")
    page.wait_for_selector("#diff tbody tr")
    assert "no changes" in page.inner_text("#diff tbody")
    page.wait_for_function("document.getElementById('live-status')?.innerText.includes('live')")
    commit(live, "m", "g2", {"a": "2", "b": "new"})
    page.wait_for_function(
        "Array.from(document.querySelectorAll('#diff tbody tr td.key')).some(td => td.innerText === 'b')",
        timeout=DEADLINE_MS,
    )
    shown = page.inner_text("#range")
    assert shown.startswith("Changes after g1") and "up to g2" in shown
    commit(live, "m", "g3", {"c": "3"})
    page.wait_for_function(
        "Array.from(document.querySelectorAll('#diff tbody tr td.key')).some(td => td.innerText === 'c')",
        timeout=DEADLINE_MS,
    )
    assert {row[1] for row in rows(page, "#diff tbody tr")} == {"a", "b", "c"}
    assert page.input_value("#from") == "@current"  # the box still says what the user typed


def test_a_failing_view_replaces_the_previous_one_and_old_errors_go(live: Live, page: Any) -> None:
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    commit(live, "m", "g1", {"a": "1"})
    page.goto(f"{live.url}/ui/#/browse/m")
    page.wait_for_selector("#records tbody tr")
    page.goto(f"{live.url}/ui/#/history/nope")  # no such collection: the view fails
    page.wait_for_selector("main p.error")
    assert page.locator("#records").count() == 0  # Browse of m is gone, not left under the error
    assert "nope" in page.inner_text("main")
    assert page.locator("#error").is_visible()
    page.goto(f"{live.url}/ui/#/browse/m")  # the next view: the old error toast goes with the old view
    page.wait_for_selector("#records tbody tr")
    assert not page.locator("#error").is_visible()


def test_the_empty_collections_view_says_how_to_make_one(live: Live, page: Any) -> None:
    page.goto(f"{live.url}/ui/")
    page.wait_for_selector("#collections tbody tr.empty")
    text = page.inner_text("#collections tbody")
    assert "No collections yet" in text and "diffstore collections create" in text


def test_generation_boxes_show_a_whole_base64_id_and_between_is_explained(live: Live, page: Any) -> None:
    live.ok("POST", "/collections/", {"collectionName": "auto", "isManual": False})
    live.ok("POST", "/collections/auto/put", {"item": {"key": es("k"), "value": es("v")}})
    page.goto(f"{live.url}/ui/#/diff/auto?from=base64%3AAAAAAAAAAAE%3D&to=base64%3AAAAAAAAAAAE%3D")
    page.wait_for_selector("#diff tbody tr")
    for box in ("#from", "#to"):
        assert page.input_value(box) == "base64:AAAAAAAAAAE="
        assert page.eval_on_selector(box, "input => input.scrollWidth <= input.clientWidth"), box
    help_text = page.inner_text("#between-help")
    assert "between" in help_text and "strictly between From and To" in help_text
