"""The README's embedded example runs as written and prints what its comments promise."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_engine_example_runs(tmp_path: Path) -> None:
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert block is not None
    result = subprocess.run(
        [sys.executable, "-c", block.group(1)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "Record(key=b'apple', value=b'red', generation_id=b'0001')",
        "b'apple' b'red' None",
    ]
