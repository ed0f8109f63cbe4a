"""The systemd units of docs/operations.md (issue 54, item 1): one per long-running command, each restarted on
failure, each running a command whose flags exist (``diffstore CMD --help`` lists them)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "operations.md"
LONG_RUNNING = {("serve",), ("streams", "serve"), ("ingest",), ("transform",), ("watch",)}


def units() -> list[dict[str, list[str]]]:
    """Each ``ini`` block of the page as {key: [values]} (sections flattened: the keys do not repeat)."""
    found = []
    for block in re.findall(r"^```ini\n(.*?)^```", PAGE.read_text(), flags=re.S | re.M):
        unit: dict[str, list[str]] = {}
        for line in block.splitlines():
            if "=" in line and not line.startswith(("#", "[")):
                key, value = line.split("=", 1)
                unit.setdefault(key.strip(), []).append(value.strip())
        found.append(unit)
    return found


def help_text(command: tuple[str, ...]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "diffstore.cli", *command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_long_running_command_has_a_unit_restarted_on_failure_with_flags_that_exist() -> None:
    seen = set()
    for unit in units():
        assert unit["Restart"] == ["on-failure"], unit
        assert unit["WantedBy"] == ["multi-user.target"], unit
        (exec_start,) = unit["ExecStart"]
        words = shlex.split(exec_start)
        if not words[0].endswith("/diffstore"):
            continue  # the consumer's unit runs the user's program
        command = tuple(words[1:3]) if words[1] == "streams" else (words[1],)
        seen.add(command)
        flags = [w.split("=", 1)[0] for w in words if w.startswith("--")]
        listed = help_text(command)
        assert all(re.search(rf"(^|\s){re.escape(f)}\b", listed) for f in flags), (command, flags)
    assert seen == LONG_RUNNING
