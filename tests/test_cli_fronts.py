"""The command line loads only the invoked command's front: the table that says which front registers
which command must be complete and true, and a command parsed alone must parse as in the whole CLI."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest

from diffstore import cli


def _commands_of(module_name: str) -> list[str]:
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers(parser_class=cli._CommandParser)
    importlib.import_module(module_name).add_commands(subparsers)
    return list(subparsers.choices)


def test_every_command_is_mapped_to_the_front_that_registers_it() -> None:
    registered = {command: front for front in cli._FRONTS for command in _commands_of(front)}
    assert cli.COMMAND_FRONTS == registered


def _help(parser: argparse.ArgumentParser, command: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        parser.parse_args([command, "--help"])
    return capsys.readouterr().out


@pytest.mark.parametrize("command", sorted(cli.COMMAND_FRONTS))
def test_a_command_parses_the_same_alone_as_in_the_whole_cli(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _help(cli.build_parser([command]), command, capsys) == _help(cli.build_parser(), command, capsys)


def test_put_does_not_import_the_server_streams_or_spark_fronts() -> None:
    probe = (
        "import sys\n"
        "from diffstore.cli import build_parser\n"
        "build_parser(['put'])\n"
        "print(sorted(m for m in ('fastapi', 'grpc', 'pyspark', 'uvicorn') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_an_unknown_command_still_lists_every_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "diffstore.cli", "nosuchcommand"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "invalid choice: 'nosuchcommand'" in result.stderr
    for command in ("serve", "transform", "ingest", "log"):
        assert command in result.stderr


def test_version_loads_no_front() -> None:
    probe = (
        "import sys, contextlib, io\n"
        "from diffstore.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):\n"
        "    main(['--version'])\n"
        "print(out.getvalue().startswith('diffstore '), 'httpx' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "False"]
