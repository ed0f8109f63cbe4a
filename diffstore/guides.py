"""Where a user reads diffstore's guides: help texts, messages and the OpenAPI page point here.

The wheel holds no ``docs/`` directory, so a path such as ``docs/backups.md`` means nothing to a pip user:
they get the URL of that guide in the project's repository instead, the ``Documentation`` URL of
``[project.urls]`` in pyproject.toml (tests/test_guides.py keeps the two equal and every guide named here
present in docs/).
"""

from __future__ import annotations

DOCS_URL = "https://github.com/diffstore/diffstore/blob/main/docs"


def guide(name: str) -> str:
    """The URL of the guide ``docs/NAME`` (``"backups.md"``, ``"protocol.md#refs"``)."""
    return f"{DOCS_URL}/{name}"
