"""The curated public surface: ``diffstore.__all__`` is sorted, complete for the engine, and importable."""

from __future__ import annotations

import diffstore
import diffstore.engine


def test_all_is_sorted_and_importable() -> None:
    assert diffstore.__all__ == sorted(diffstore.__all__)
    for name in diffstore.__all__:
        assert getattr(diffstore, name) is not None


def test_engine_names_are_re_exported_once() -> None:
    assert set(diffstore.engine.__all__) <= set(diffstore.__all__)
    for name in diffstore.engine.__all__:
        assert getattr(diffstore, name) is getattr(diffstore.engine, name)


def test_core_import_does_not_need_pyspark() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['pyspark'] = None; import diffstore, diffstore.client, diffstore.server;"
        " print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "ok", result.stderr
