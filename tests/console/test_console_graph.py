"""The pipeline graph in headless Chromium over a real server: on a pipeline of many collections with long
names, the browser's own boxes of every label and node are computed and no two intersect; self-readers are
drawn; the loading and empty states."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.server.conftest import Live

# every label box and node box of the drawn graph, as the browser lays them out
BOXES = """() => {
  const box = (e) => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const boxes = (g, what) => ({what, box: box(g.querySelector('rect')), text: box(g.querySelector('text'))});
  const out = [];
  for (const g of document.querySelectorAll('#graph g.node')) out.push(boxes(g, 'node ' + g.dataset.node));
  for (const g of document.querySelectorAll('#graph g.edge-label')) {
    out.push(boxes(g, 'label ' + g.dataset.reader));
  }
  return out;
}"""


def _hit(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _inside(inner: list[float], outer: list[float]) -> bool:
    return (
        outer[0] <= inner[0] and inner[2] <= outer[2] + 0.5 and outer[1] <= inner[1] and inner[3] <= outer[3]
    )


def _reader(live: Live, owner: str, name: str, target: str | None) -> None:
    body: dict[str, Any] = {"readerName": name}
    if target is not None:
        body["collectionName"] = target
    live.ok("POST", f"/collections/{owner}/readers/", body)


def _big_pipeline(live: Live) -> list[str]:
    """Three streams, 24 collections with long names in fan-in, fan-out and long chains, a self-reader."""
    long = "_with_customer_profile_region_and_currency_conversion_v2"
    raw = [f"raw_orders_{region}{long}" for region in ("eu_west", "us_east", "ap_south")]
    enriched = [f"enriched_{i}{long}" for i in range(6)]
    totals = [f"totals_by_{what}" for what in ("day", "week", "month", "customer", "product", "region")]
    reports = [f"report_{i}_for_the_finance_team_and_auditors" for i in range(6)]
    final = ["dashboard", "alerts", "archive"]
    names = raw + enriched + totals + reports + final
    for name in names:
        live.ok("POST", "/collections/", {"collectionName": name, "isManual": True})
    for i, name in enumerate(raw):
        _reader(
            live,
            name,
            f"hstream/orders_subscription_{i}/shard_0",
            f"hstream://orders-{i}-events-from-cluster",
        )
    for i, name in enumerate(enriched):  # fan-in from two raw collections each
        _reader(live, name, f"from_{raw[i % 3]}", raw[i % 3])
        _reader(live, name, f"from_{raw[(i + 1) % 3]}", raw[(i + 1) % 3])
    for i, name in enumerate(totals):  # fan-out from enriched 0 and 1
        _reader(live, name, "from_enriched_first", enriched[i % 2])
    for i, name in enumerate(reports):
        _reader(live, name, "totals_reader_with_a_rather_long_name", totals[i])
        _reader(live, name, "skips_two_levels", enriched[(i + 2) % 6])  # an edge across columns
    for name in final:
        for report in reports[:3]:
            _reader(live, name, f"from_{report}", report)
    _reader(live, "archive", "raw_direct", raw[0])  # from the first column to the last
    _reader(live, "dashboard", "keep", None)  # a self-reader (its target is the collection itself)
    live.ok("POST", "/collections/", {"collectionName": "alone", "isManual": True})
    return names


def test_labels_never_overlap_on_a_big_pipeline(
    live: Live, page: Any, screenshot: Callable[[str], Path]
) -> None:
    names = _big_pipeline(live)
    page.goto(f"{live.url}/ui/#/graph")
    page.wait_for_selector("#graph svg")
    boxes = page.evaluate(BOXES)
    assert sorted(b["what"][5:] for b in boxes if b["what"].startswith("node ")) == sorted(
        names + [f"hstream://orders-{i}-events-from-cluster" for i in range(3)]
    )
    assert len([b for b in boxes if b["what"].startswith("label ")]) == 3 + 12 + 6 + 12 + 9 + 2
    clashes = [
        (a["what"], b["what"])
        for i, a in enumerate(boxes)
        for b in boxes[i + 1 :]
        if _hit(a["box"], b["box"]) or _hit(a["text"], b["text"])
    ]
    assert clashes == []
    # every text fits in its own box (the boxes are measured, not guessed)
    assert [b["what"] for b in boxes if not _inside(b["text"], b["box"])] == []
    # the self-reader is drawn as a loop with its label
    assert page.locator("#graph path.edge.self[data-reader='keep']").count() == 1
    assert page.locator("#graph g.edge-label.self[data-reader='keep']").count() == 1
    # a long name is cut in the box and whole on hover
    title = page.eval_on_selector(f"#graph g.node[data-node='{names[0]}'] title", "t => t.textContent")
    assert title == names[0]
    assert "alone" in page.inner_text("#isolated")
    # the whole graph in one picture: a window as wide as the drawing
    size = page.eval_on_selector("#graph svg", "s => [s.width.baseVal.value, s.height.baseVal.value]")
    page.set_viewport_size({"width": int(size[0]) + 80, "height": int(size[1]) + 300})
    screenshot("pipeline")


def test_loading_and_empty_states(live: Live, page: Any) -> None:
    held: list[Any] = []
    # the first overview waits until the loading state is seen
    page.route("**/overview", lambda route: held.append(route))
    page.goto(f"{live.url}/ui/#/graph")
    page.wait_for_selector("#graph .loading")
    assert page.get_attribute("#graph", "aria-busy") == "true"
    assert len(held) == 1
    held[0].continue_()
    page.unroute("**/overview")
    page.wait_for_selector("#graph .empty")
    assert "No collections yet" in page.inner_text("#graph")
    assert page.get_attribute("#graph", "aria-busy") == "false"
    # the page follows the store: a collection, then a reader
    page.wait_for_function("document.getElementById('live-status')?.innerText.includes('live')")
    live.ok("POST", "/collections/", {"collectionName": "A", "isManual": True})
    page.wait_for_function("document.getElementById('graph')?.innerText.includes('No readers yet')")
    live.ok("POST", "/collections/", {"collectionName": "B", "isManual": True})
    _reader(live, "B", "from_a", "A")
    page.wait_for_selector("#graph svg path.edge[data-reader='from_a']", state="attached")


def test_the_graph_and_the_diff_filter_work_from_the_keyboard(live: Live, page: Any) -> None:
    for name in ("A", "B"):
        live.ok("POST", "/collections/", {"collectionName": name, "isManual": True})
    _reader(live, "B", "from_a", "A")
    page.goto(f"{live.url}/ui/#/graph")
    page.wait_for_selector("#graph svg g.node[data-node='B']")
    for _ in range(40):  # Tab through the page to B's box, then Enter opens it
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.getAttribute('aria-label')") == "browse B":
            break
    else:
        raise AssertionError("B's box in the graph is not reachable with Tab")
    page.keyboard.press("Enter")
    page.wait_for_function("location.hash === '#/browse/B'")
    page.goto(f"{live.url}/ui/#/diff/A")
    page.wait_for_selector("#kind")
    page.focus("#kind")
    page.keyboard.press("ArrowDown")  # every change -> inserted only
    page.wait_for_function("location.hash.includes('kind=inserted')")


def test_a_view_left_as_its_answer_arrives_does_not_write_its_address_back(live: Live, page: Any) -> None:
    """The race behind a flaky keyboard test: the browse view's answer arrived after the address had moved
    to ``#/diff/A`` but before that hashchange was handled, and the browse view wrote ``#/browse/B`` back
    over it (so the diff view never came). Held here: the answer is let go while the address names another
    view and no hashchange has been handled yet."""
    for name in ("A", "B"):
        live.ok("POST", "/collections/", {"collectionName": name, "isManual": True})
    held: list[Any] = []
    page.route("**/collections/B", lambda route: held.append(route))
    page.goto(f"{live.url}/ui/#/browse/B")
    for _ in range(300):  # up to 30 s for the request to reach the route (handled while Playwright waits)
        if held:
            break
        page.wait_for_timeout(100)
    assert len(held) == 1, "the browse view's request for B was not seen"
    page.evaluate("history.replaceState(null, '', '#/diff/A')")  # moved on; its hashchange still to come
    held[0].continue_()
    page.unroute("**/collections/B")
    page.wait_for_selector("#browse-form")  # the browse view went on with its answer...
    assert page.evaluate("location.hash") == "#/diff/A"  # ...without writing its address back
    page.evaluate("window.dispatchEvent(new HashChangeEvent('hashchange'))")
    page.wait_for_selector("#kind")
    assert page.evaluate("location.hash").startswith("#/diff/A")
