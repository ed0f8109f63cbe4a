"""Help texts, messages and the OpenAPI page point a user to guides they can open: a pip install has no
docs/ directory, so they cite the guides' URL (diffstore/guides.py), which is the Documentation URL of
pyproject.toml, and every guide they name exists in docs/."""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path

import pytest

from diffstore import cli
from diffstore.guides import DOCS_URL, guide

REPO = Path(__file__).resolve().parent.parent
# a docs/ path that is not the end of the guides' URL
BARE_DOCS_PATH = re.compile(r"(?<!/main/)\bdocs/[\w.-]+")
CITED = re.compile(re.escape(DOCS_URL) + r"/([\w-]+(?:\.[\w-]+)*)")  # a sentence's full stop is not the URL's


def test_the_guides_url_is_the_documentation_url_of_the_project() -> None:
    with (REPO / "pyproject.toml").open("rb") as f:
        urls = tomllib.load(f)["project"]["urls"]
    assert urls["Documentation"] == DOCS_URL
    assert DOCS_URL.startswith(urls["Repository"] + "/")
    assert guide("backups.md") == f"{DOCS_URL}/backups.md"


def every_help() -> dict[str, str]:
    """Each command's and sub-command's --help text, unwrapped (a wide terminal), by command."""
    texts: dict[str, str] = {}

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        texts[name] = parser.format_help()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    walk(sub, f"{name} {sub_name}")

    walk(cli.build_parser(), "diffstore")
    return texts


def test_no_help_cites_a_docs_path_and_the_guides_it_cites_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # no wrapping: a URL is whole on its line
    cited: set[str] = set()
    for command, text in every_help().items():
        assert BARE_DOCS_PATH.findall(text) == [], command
        cited |= set(CITED.findall(text))
    assert {"protocol.md", "backups.md", "replicas.md", "streams.md"} <= cited
    assert [name for name in sorted(cited) if not (REPO / "docs" / name).is_file()] == []


def test_the_guides_named_in_the_package_exist() -> None:
    """Every guide("NAME") of the source (help, messages, OpenAPI) names a file of docs/."""
    named = {
        match
        for path in (REPO / "diffstore").rglob("*.py")
        for match in re.findall(r"""guide\(\s*["']([\w.-]+?)(?:#[\w-]*)?["']\s*\)""", path.read_text())
    }
    assert len(named) >= 8
    assert [name for name in sorted(named) if not (REPO / "docs" / name).is_file()] == []


def test_the_api_page_cites_no_docs_path(tmp_path: Path) -> None:
    """The OpenAPI document behind /docs (the server's own page for its users)."""
    import orjson

    from diffstore import Store
    from diffstore.server import ServerConfig, create_app

    with Store.open(tmp_path / "data") as store:
        text = orjson.dumps(create_app(store, ServerConfig()).openapi()).decode()
    assert BARE_DOCS_PATH.findall(text) == []
    assert f"{DOCS_URL}/protocol.md" in text
