"""``/docs`` and ``/redoc`` load every script and style from the server itself (they work offline)."""

from __future__ import annotations

import re

from .conftest import Live

_ASSET = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']|url\s*:\s*['"]([^'"]+)['"]""")


def test_docs_pages_use_only_local_assets(live: Live) -> None:
    for page in ("/docs", "/redoc"):
        response = live.http.get(page)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/html")
        urls = [a or b for a, b in _ASSET.findall(response.text)]
        assert urls, page
        assert all(url.startswith("/") for url in urls), (page, urls)
        for url in urls:
            asset = live.http.get(url)
            assert asset.status_code == 200, url
            assert len(asset.content) > 100 or url.endswith(".json"), url
    assert "SwaggerUIBundle" in live.http.get("/docs-assets/swagger-ui-bundle.js").text
    assert live.http.get("/docs-assets/../app.py").status_code == 404
    assert live.http.get("/docs-assets/nothing.js").status_code == 404


def test_openapi_documents_the_console_routes(live: Live) -> None:
    paths = live.http.get("/openapi.json").json()["paths"]
    assert "/overview" in paths
    assert "/collections/{c}/generations" in paths
