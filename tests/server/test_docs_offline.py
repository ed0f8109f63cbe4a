"""``/docs`` and ``/redoc`` load every script and style from the server itself (they work offline)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from diffstore.server import ServerConfig

from .conftest import Live, live_server

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


def test_with_a_token_the_docs_open_and_the_data_does_not(tmp_path: Path) -> None:
    """The console's "API docs" link carries no token: it opened a raw 401."""
    with live_server(tmp_path / "data", config=ServerConfig(token="s3cret")) as live:
        anonymous = httpx.Client(base_url=live.url)
        with anonymous:
            for path in ("/docs", "/redoc", "/openapi.json", "/docs-assets/swagger-ui-bundle.js"):
                assert anonymous.get(path).status_code == 200, path
            schema = anonymous.get("/openapi.json").json()
            assert schema["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
            for path in ("/collections/", "/metrics", "/overview", "/docs/../collections/"):
                assert anonymous.get(path).status_code == 401, path
        assert live.http.get("/collections/").status_code == 200
