"""The curated public surface: ``diffstore.__all__`` is sorted, complete for the engine, and importable."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import diffstore
import diffstore.collection
import diffstore.engine


def test_all_is_sorted_and_importable() -> None:
    assert diffstore.__all__ == sorted(diffstore.__all__)
    for name in diffstore.__all__:
        assert getattr(diffstore, name) is not None


def test_engine_names_are_re_exported_once() -> None:
    assert set(diffstore.engine.__all__) <= set(diffstore.__all__)
    for name in set(diffstore.engine.__all__) - {"Collection"}:
        assert getattr(diffstore, name) is getattr(diffstore.engine, name)
    # diffstore.Collection is the Protocol that the engine's (and the client's) handle implements
    assert diffstore.Collection is diffstore.collection.Collection


def _class_definitions() -> dict[str, list[str]]:
    """Class name -> the modules of ``diffstore/`` defining it (generated protobuf code aside)."""
    package = Path(diffstore.__file__).parent
    found: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        if "_proto" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(path.relative_to(package).as_posix())
    return found


def test_every_class_name_is_defined_once() -> None:
    """One name, one meaning: ``Collection`` alone is a Protocol with its two implementations."""
    twice = {name: where for name, where in _class_definitions().items() if len(where) > 1}
    assert twice == {"Collection": ["client/_sync.py", "collection.py", "engine/collection.py"]}


def test_the_client_imports_neither_lmdb_nor_the_engine() -> None:
    code = (
        "import sys; import diffstore, diffstore.client;"
        " print(sorted(m for m in sys.modules if m == 'lmdb' or m.startswith('diffstore.engine.')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "['diffstore.engine.types']", result.stderr


def test_core_import_does_not_need_pyspark() -> None:
    code = (
        "import sys; sys.modules['pyspark'] = None; import diffstore, diffstore.client, diffstore.server;"
        " print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "ok", result.stderr
