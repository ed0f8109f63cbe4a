"""Every secret option of every command can come from a file or the environment (issue 51 item 3): a walk
over the whole ``diffstore`` command line, so that a command added later with a ``--…-token`` or
``--…-password`` of its own and no other way to give it fails here."""

from __future__ import annotations

import argparse
import re

from diffstore import cli

SECRET = re.compile(r"token|password|passphrase|secret", re.IGNORECASE)
FILE_FORMS = ("-file", "-from-file")
# the servers' files of several tokens with their scopes (no secret on the command line at all), and how
# often that file is looked at
FILES_OF_TOKENS = frozenset(("--token-file", "--token-poll-s"))


def commands() -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        found[prefix or "diffstore"] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{prefix} {name}".strip())

    walk(cli.build_parser(), "")
    return found


def secret_options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {
        option: action
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--") and SECRET.search(option)
    }


def test_every_secret_option_has_a_file_and_an_environment_form() -> None:
    missing: list[str] = []
    seen = 0
    for name, parser in commands().items():
        options = {o for action in parser._actions for o in action.option_strings}
        for option, action in secret_options(parser).items():
            if option.endswith(FILE_FORMS) or option in FILES_OF_TOKENS:
                continue  # the file form itself
            seen += 1
            if not any(option + suffix in options for suffix in FILE_FORMS):
                missing.append(f"diffstore {name} {option}: no {option}-file / {option}-from-file")
            if not re.search(r"\bDIFFSTORE_[A-Z_]+", action.help or ""):
                missing.append(f"diffstore {name} {option}: its help names no DIFFSTORE_ variable")
    assert seen >= 10  # the walk found the commands (serve, the clients, ingest, transform, ...)
    assert missing == []


def test_the_walk_sees_the_fronts_of_issue_51() -> None:
    found = commands()
    for name in ("serve", "ingest", "transform", "backup", "promote", "get"):
        assert "--token" in secret_options(found[name]), name
    assert "--tls-key-password" in secret_options(found["serve"])
