"""A backup carries its proof (engine/manifest.py): every backup writes MANIFEST.json with its files' SHA-256
and the store's digests; ``check`` verifies it before anything else; ``backup --verify`` re-reads what it
wrote; tampering with the manifest or with the data file is reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from diffstore import Store, StoreConfig
from diffstore.engine import backup, check, manifest, storage
from tests.engine.test_digests import lived_in

DEADLINE_S = 120.0


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "diffstore", *argv],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        env=os.environ,
    )


def backed_up(tmp_path: Path) -> Path:
    source, out = tmp_path / "store", tmp_path / "backup"
    with Store.open(source, StoreConfig(background=False)) as store:
        lived_in(store)
        store.create_collection("empty")
    backup.backup_directory(source, out)
    return out


def test_a_backup_holds_a_manifest_that_check_verifies(tmp_path: Path) -> None:
    out = backed_up(tmp_path)
    written = json.loads((out / manifest.MANIFEST_FILE).read_text())
    assert [f["name"] for f in written["files"]] == [storage.DATA_FILE]
    assert written["files"][0]["sha256"] == manifest.sha256_of(out / storage.DATA_FILE)
    assert [(d["collection"], d["generationId"], d["records"]) for d in written["digests"]] == [
        ("A", "06", 15),
        ("empty", '""', 0),
    ]
    with Store.open(tmp_path / "store", StoreConfig(background=False)) as store:
        assert written["digests"][0]["digest"] == store.collection("A").digest().hex
    report = check.check_directory(out)
    assert report.ok and report.notes == [], (report.problems, report.notes)


def test_check_reports_a_tampered_manifest_first(tmp_path: Path) -> None:
    out = backed_up(tmp_path)
    where = out / manifest.MANIFEST_FILE
    written = json.loads(where.read_text())
    written["digests"][0]["digest"] = "0" * 32
    where.write_text(json.dumps(written))
    problems = [str(p) for p in check.check_directory(out).problems]
    assert len(problems) == 1 and problems[0].startswith("manifest: 'A': the digest at 06 is 15 records")
    written["files"][0]["sha256"] = "f" * 64
    where.write_text(json.dumps(written))
    problems = [str(p) for p in check.check_directory(out).problems]
    assert problems == ["manifest: data.mdb: its SHA-256 is not the one in MANIFEST.json"]
    where.write_text("{not json")
    problems = [str(p) for p in check.check_directory(out).problems]
    assert len(problems) == 1 and problems[0].startswith("manifest: MANIFEST.json does not parse")


def test_check_reports_a_tampered_data_file(tmp_path: Path) -> None:
    out = backed_up(tmp_path)
    data = out / storage.DATA_FILE
    raw = bytearray(data.read_bytes())
    at = raw.find(b"v6-7")  # a stored value of generation 06
    assert at > 0
    raw[at + 1] ^= 0x01
    data.write_bytes(bytes(raw))
    problems = [str(p) for p in check.check_directory(out).problems]
    assert problems[0] == "manifest: data.mdb: its SHA-256 is not the one in MANIFEST.json"
    assert any(p.startswith("digests: 'A': the digest of generation 06") for p in problems[1:]), problems


def test_a_served_backup_no_longer_answers_to_its_manifest(tmp_path: Path) -> None:
    out = backed_up(tmp_path)
    with Store.open(out, StoreConfig(background=False)) as store:  # a restore that serves and writes
        store.collection("A").write_generation(b"07", [(b"new", b"v")])
    report = check.check_directory(out)
    assert report.ok and "no longer applies" in report.notes[0], report.notes


def test_backup_verify_rereads_what_it_wrote(tmp_path: Path) -> None:
    source = tmp_path / "store"
    with Store.open(source, StoreConfig(background=False)) as store:
        lived_in(store)
    done = cli("backup", "--data", str(source), "--verify", str(tmp_path / "b"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"verified {tmp_path / 'b'}: every file and digest is the one written" in done.stdout
    assert (tmp_path / "b" / manifest.MANIFEST_FILE).is_file()
    done = cli("check", "--data", str(tmp_path / "b"))
    assert done.returncode == 0 and "every invariant holds" in done.stdout, done.stdout + done.stderr
