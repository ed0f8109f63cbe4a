"""The soak's consumer of C, a process of its own: ``python consumer_proc.py URL VIEW_FILE``.

It keeps C's records in memory from C's windows (``diffstore.consumer``) and after each window writes
them, with the generation they stand for, to ``VIEW_FILE`` (atomically: a temporary file renamed). A
window replayed after a crash re-applies net changes, which is idempotent, so the file always equals C at
the generation it names. On start it reads the file back: the view it builds on.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path

from diffstore.client import Client
from diffstore.consumer import Consumer, WindowListener


class View(WindowListener):
    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: dict[bytes, bytes] = {}
        if path.exists():
            saved = json.loads(path.read_text())
            self.records = {base64.b64decode(k): base64.b64decode(v) for k, v in saved["records"].items()}

    def on_start_window(self, from_positions: object) -> None:
        pass

    def on_data_event(self, source: str, key: bytes, old: bytes | None, new: bytes | None) -> None:
        if new is None:
            self.records.pop(key, None)
        else:
            self.records[key] = new

    def on_end_window(self, to_positions: dict[str, bytes | None]) -> None:
        generation = to_positions["C"]
        body = {
            "generation": base64.b64encode(generation or b"").decode(),
            "records": {_text(k): _text(v) for k, v in self.records.items()},
        }
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(body))
        os.replace(temporary, self.path)

    def on_rollback(self, from_positions: object, error: object) -> None:
        pass  # the replayed window's net changes overwrite what this one applied


def _text(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def main() -> None:
    url, view_file = sys.argv[1], Path(sys.argv[2])
    with Client(url, timeout_s=60) as client:
        Consumer(client, ["C"], "soak-consumer", View(view_file)).run()


if __name__ == "__main__":
    main()
