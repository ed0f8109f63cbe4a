"""The console's first page on a store of 1,000 collections: the API calls it makes, and a headless browser.

    .venv/bin/python benchmarks/console_first_page.py [--collections 1000] [--rounds 7]

A store of N collections (a third of them auto-committing, every tenth with two readers following others,
each collection with a few committed generations) behind a real ``diffstore serve`` (uvicorn, in this
process's thread). Each round measures:

- api: the calls the first page makes, one after the other as the page does: ``/ui/``, ``app.css``,
  ``graph.js``, ``app.js``, ``/overview`` (every collection, reader and lag), and the first
  ``/overview/changes``;
- browser: headless Chromium (when installed) opening ``/ui/``: from the navigation's start to the mark the
  page sets once its first screen of rows is drawn (the rest of the N rows follow in the next task; the
  run waits for all N before the next round); and to the commit times of that first screen's generations
  filled in (one ``/generations?limit=1`` call per id on screen, after the rows are drawn);
- baseline: ``GET /collections/`` (the plain SPEC list of names), the cheapest call that lists them.

Printed: medians over the rounds and the ratio of each to the baseline. The issue's bound is 300 ms for the
first page. The machine is shared with other jobs, so figures move between runs.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _harness import machine, server_thread  # noqa: E402

from diffstore.engine.store import Store  # noqa: E402
from diffstore.engine.types import StoreConfig  # noqa: E402
from diffstore.server import ServerConfig, create_app  # noqa: E402
from diffstore.server.serving import GracefulServer  # noqa: E402

FIRST_PAGE_CALLS = ("/ui/", "/ui/app.css", "/ui/graph.js", "/ui/app.js", "/overview", "/overview/changes")
# every commit time of a generation id on the first screen is filled in
TIMES_ON_SCREEN = """Array.from(document.querySelectorAll('#collections time.when')).filter(t => {
  const r = t.parentElement.getBoundingClientRect(); return r.top < innerHeight && r.bottom > 0;
}).every(t => t.dataset.filled !== undefined)"""


def fill(store: Store, count: int) -> None:
    for i in range(count):
        name = f"collection-{i:04d}"
        manual = i % 3 != 0
        collection = store.create_collection(name, manual=manual)
        if manual:
            for g in range(3):
                gen = b"g%02d" % g
                collection.start_generation(gen)
                collection.put_many([(b"k%d" % k, b"v%d" % g) for k in range(5)], generation_id=gen)
                collection.commit_generation(gen)
        else:
            collection.put_many([(b"k", b"v")])
    for i in range(0, count, 10):
        owner = store.collection(f"collection-{i:04d}")
        owner.create_reader("from_next", f"collection-{(i + 1) % count:04d}", None)
        owner.create_reader("from_far", f"collection-{(i + 2) % count:04d}", None)


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def browser_first_page(url: str, count: int, rounds: int) -> tuple[list[float], list[float]] | None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("browser: no chromium installed (make browser): skipped")
        return None
    from playwright.sync_api import sync_playwright

    samples: list[float] = []
    timed: list[float] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            for _ in range(rounds + 1):  # the first one warms the browser up and is left out
                context = browser.new_context()
                page = context.new_page()
                page.goto(f"{url}/ui/")
                rows = "document.querySelectorAll('#collections tbody tr').length"
                page.wait_for_function(f"{rows} === {count}")
                page.wait_for_function("performance.getEntriesByName('diffstore:collections-drawn').length")
                marks = page.evaluate(
                    "[performance.getEntriesByName('diffstore:collections-drawn')[0].startTime,"
                    " performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd,"
                    " performance.getEntriesByType('navigation')[0].responseEnd]"
                )
                page.wait_for_function(TIMES_ON_SCREEN)
                times = page.evaluate(  # the page marks every time it fills in
                    "Math.max(...performance.getEntriesByName('diffstore:time-filled').map(e => e.startTime))"
                )
                drawn, loaded, html = marks
                print(
                    f"  drawn at {drawn:.0f} ms, DOMContentLoaded {loaded:.0f} ms, html at {html:.0f} ms,"
                    f" first screen's commit times at {times:.0f} ms"
                )
                samples.append(marks[0] / 1000)
                timed.append(times / 1000)
                context.close()
        finally:
            browser.close()
    return samples[1:], timed[1:]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--collections", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(machine())
    directory = Path(tempfile.mkdtemp(prefix="diffstore-console-bench-"))
    store = Store.open(directory, StoreConfig(commit_delay_ms=10))
    try:
        started = time.perf_counter()
        fill(store, args.collections)
        print(f"store: {args.collections} collections filled in {time.perf_counter() - started:.1f}s")
        config = ServerConfig()
        app = create_app(store, config)

        def make_server(port: int) -> GracefulServer:
            return GracefulServer(app, config, log_level="warning", log_config=None)

        with server_thread(make_server) as served:
            url = served.url
            with httpx.Client(base_url=url, timeout=30) as http:
                api: list[float] = []
                baseline: list[float] = []
                for _ in range(args.rounds + 1):
                    t0 = time.perf_counter()
                    for path in FIRST_PAGE_CALLS:
                        response = http.get(path)
                        assert response.status_code == 200, (path, response.status_code)
                    t1 = time.perf_counter()
                    assert len(http.get("/collections/").json()["items"]) == args.collections
                    t2 = time.perf_counter()
                    api.append(t1 - t0)
                    baseline.append(t2 - t1)
                api, baseline = api[1:], baseline[1:]
                overview_bytes = len(http.get("/overview").content)
            base = median_ms(baseline)
            print(f"baseline GET /collections/: {base:.1f} ms (median of {args.rounds})")
            print(
                f"api calls of the first page ({', '.join(FIRST_PAGE_CALLS)}): {median_ms(api):.1f} ms"
                f" = {median_ms(api) / base:.1f}x baseline; /overview is {overview_bytes / 1024:.0f} KiB"
            )
            measured = browser_first_page(url, args.collections, args.rounds)
            if measured is not None:
                browser, timed = measured
                print(
                    "browser: navigation start to the first screen of rows drawn:"
                    f" {median_ms(browser):.1f} ms"
                    f" = {median_ms(browser) / base:.1f}x baseline (bound: 300 ms)"
                )
                print(
                    "browser: navigation start to the first screen's commit times filled in:"
                    f" {median_ms(timed):.1f} ms = {median_ms(timed) / base:.1f}x baseline"
                )
    finally:
        store.close()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
