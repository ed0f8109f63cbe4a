"""The console in a real headless Chromium (Debian's package) driven by playwright, over a real server.

``make test`` installs chromium when it is missing and it can (scripts/install_browser.sh); without it
these tests skip, loudly. A failing test saves a screenshot of its page in ``test-screenshots/`` (git
ignores it), and tests save screenshots of the views for a person to look at there too (``screenshot``).
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import Live, live_server

SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-screenshots"


def _chromium() -> str | None:
    given = os.environ.get("DIFFSTORE_CHROMIUM")
    if given:
        return given
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _skip_loudly(reason: str) -> None:
    message = f"!!! CONSOLE BROWSER TESTS SKIPPED: {reason}"
    warnings.warn(message, stacklevel=2)
    pytest.skip(message)


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    """A real server over a fresh store (see tests/server/conftest.py)."""
    with live_server(tmp_path / "data") as running:
        yield running


# module scope: playwright's sync API keeps an event loop running in this thread while it is started,
# and tests of other modules call asyncio.run
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    path = _chromium()
    if path is None:
        _skip_loudly("no chromium (run `make browser` as root, or set DIFFSTORE_CHROMIUM)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _skip_loudly("playwright is not installed (make install)")
    with sync_playwright() as playwright:
        # --no-sandbox: Chromium refuses to sandbox itself as root (CI and these machines run as root)
        launched = playwright.chromium.launch(executable_path=path, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[_FAILED] = report.failed


_FAILED = pytest.StashKey[bool]()


_SAVED: list[Path] = []


@pytest.fixture
def screenshot(page: Any, request: pytest.FixtureRequest) -> Callable[[str], Path]:
    """Saves the page as ``test-screenshots/<test>-<what>.png`` for a person to look at (the run's summary
    lists every file saved); returns the path."""

    def save(what: str) -> Path:
        SCREENSHOTS.mkdir(exist_ok=True)
        path = SCREENSHOTS / f"{request.node.name}-{what}.png"
        page.screenshot(path=str(path), full_page=True)
        _SAVED.append(path)
        print(f"screenshot: {path}")
        return path

    return save


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _SAVED:
        terminalreporter.write_line(f"console screenshots to look at ({len(_SAVED)}), in {SCREENSHOTS}:")
        for path in _SAVED:
            terminalreporter.write_line(f"  {path.name}")


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    try:
        yield opened
        assert not errors, errors  # an uncaught exception in the console fails the test
    finally:
        if request.node.stash.get(_FAILED, False) or errors:
            SCREENSHOTS.mkdir(exist_ok=True)
            path = SCREENSHOTS / f"{request.node.name}.png"
            opened.screenshot(path=str(path), full_page=True)
            print(f"screenshot of the failed page: {path}")
        context.close()
