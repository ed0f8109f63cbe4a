"""The console given collection names that cannot travel in a URL path ("." and ".."): a clear message,
never a JavaScript error. A real server, a real headless Chromium."""

from __future__ import annotations

from typing import Any

import pytest

from tests.server.conftest import Live


@pytest.mark.parametrize("view", ["browse", "diff", "lineage"])
@pytest.mark.parametrize("name", ["..", ".", "%2E%2E"])
def test_a_dot_name_in_the_address_says_so(live: Live, page: Any, view: str, name: str) -> None:
    live.ok("POST", "/collections/", {"collectionName": "m", "isManual": True})
    page.goto(f"{live.url}/ui/#/{view}/{name}")
    page.wait_for_selector("main .error")
    text = page.inner_text("main .error")
    assert "TypeError" not in text and "Cannot read" not in text and "null" not in text, text
    assert "not a collection name" in text, text
