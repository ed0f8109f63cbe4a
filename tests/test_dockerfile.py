"""The Dockerfile without Docker: its layers are ordered for the build cache, and its build steps, replayed
in a venv standing for the base image's Python, install the package so that its own check passes (the
compiled accelerator is the installed package's: the copied source tree must not shadow it).

The replay reads the Dockerfile itself: WORKDIR and COPY (honouring .dockerignore) into a directory that
stands for the image's file system, ENV, and each RUN's commands, every absolute path under that
directory. It leaves out what needs root and Debian and changes no Python file (apt-get, useradd, chown),
and fails on any command or instruction it does not know, so that a new step is looked at here.
scripts/docker_smoke.sh builds and runs the real image where Docker is available.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEADLINE_S = 900.0  # an upper bound per command, not a measure: pip builds under load
REPLAYED = {"python", "pip", "cd", "rm", "mkdir"}
LEFT_OUT = {"apt-get", "useradd", "chown"}  # root and Debian only; they change no Python file
NOT_BUILD_STEPS = {"ARG", "FROM", "USER", "VOLUME", "EXPOSE", "STOPSIGNAL", "HEALTHCHECK", "CMD"}


def dockerfile_instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (KEYWORD, arguments), continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n(\s*#.*\n)*", " ", (REPO / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_the_image_installs_its_dependencies_before_it_copies_the_source(tmp_path: Path) -> None:
    """So that a change to the source reuses the (slow) dependency layer of the image."""
    steps = dockerfile_instructions()
    copies = [i for i, (keyword, _) in enumerate(steps) if keyword == "COPY"]
    dependencies = next(
        i for i, (keyword, args) in enumerate(steps) if keyword == "RUN" and "pip install -r" in args
    )
    source = next(
        i for i, (keyword, args) in enumerate(steps) if keyword == "COPY" and "diffstore" in args.split()
    )
    assert [steps[i][1] for i in copies if i < dependencies] == ["pyproject.toml ./"]
    assert dependencies < source
    # the step's own command, run on our pyproject.toml, lists exactly the base dependencies
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    command = re.search(r'python -c "(.*?)"\s*>', steps[dependencies][1])
    assert command, steps[dependencies][1]
    listed = subprocess.run(
        [sys.executable, "-c", command.group(1)], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.split()
    with (REPO / "pyproject.toml").open("rb") as f:
        project = tomllib.load(f)["project"]
    extras = project["optional-dependencies"]
    assert listed == list(dict.fromkeys(project["dependencies"] + extras["server"] + extras["streams"]))
    assert "pip install --no-deps ." in " ".join(args for _, args in steps[source:])


def docker_ignored() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def ignored(relative: str, patterns: list[str]) -> bool:
    """Whether Docker leaves ``relative`` (a path in the build context) out, as .dockerignore says."""
    name = relative.rsplit("/", 1)[-1]
    anywhere = [p[3:] for p in patterns if p.startswith("**/")]  # `**/NAME`: at any depth
    at_top = any(fnmatch.fnmatch(relative, p) for p in patterns)
    return at_top or any(fnmatch.fnmatch(name, p) for p in anywhere)


def copy_in(sources: list[str], dest: Path) -> None:
    """COPY SOURCES... DEST from the repository (the build context), as Docker does it."""
    patterns = docker_ignored()
    for source in sources:
        origin = REPO / source
        if origin.is_file():
            shutil.copy(origin, dest / origin.name if dest.is_dir() else dest)
            continue
        target = dest if len(sources) == 1 and not dest.exists() else dest / origin.name
        shutil.copytree(
            origin,
            target,
            ignore=lambda folder, names: [
                n for n in names if ignored(str(Path(folder, n).relative_to(REPO)), patterns)
            ],
        )


def rerooted(command: str, root: Path) -> str:
    """``command`` with every absolute path moved under ``root`` (``/app``: ``ROOT/app``)."""
    moved = re.sub(r"(?<![^\s>])/", lambda _: f"{root}/", command)
    if command.split()[0] in ("rm", "mkdir"):  # never outside the stand-in file system
        paths = [word for word in shlex.split(moved)[1:] if not word.startswith("-")]
        assert paths and all(Path(p).is_relative_to(root) for p in paths), moved
    return moved


@pytest.mark.timeout(1800)  # two pip installs: 2.5 min at load 12 here, past 10 min at a load CI can reach
def test_the_build_steps_install_the_package_whose_accelerator_the_image_checks(tmp_path: Path) -> None:
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler here: the image's check asks for the compiled accelerator")
    root = tmp_path / "root"  # the image's file system
    (root / "tmp").mkdir(parents=True)
    base = tmp_path / "base-python"  # the base image's Python, its `python` and `pip` first on PATH
    venv.create(base, with_pip=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    env["PATH"] = f"{base / 'bin'}{os.pathsep}{env['PATH']}"
    env["PIP_ROOT_USER_ACTION"] = "ignore"
    cwd, entrypoint, replayed = root, "", []
    for keyword, args in dockerfile_instructions():
        if keyword == "WORKDIR":
            cwd = root / args.lstrip("/")
            cwd.mkdir(parents=True, exist_ok=True)
        elif keyword == "COPY":
            *sources, dest = args.split()
            copy_in(sources, cwd / dest)
        elif keyword == "ENV":
            # pip's cache stays on (PIP_NO_CACHE_DIR): it makes the replay faster, not what it installs
            env.update(dict(pair.split("=", 1) for pair in shlex.split(args) if pair != "PIP_NO_CACHE_DIR=1"))
        elif keyword == "RUN":
            commands = [part.strip() for part in args.split("&&")]
            unknown = [c for c in commands if c.split()[0] not in REPLAYED | LEFT_OUT]
            assert unknown == [], f"the replay does not know these commands: {unknown}"
            script = " && ".join(rerooted(c, root) for c in commands if c.split()[0] in REPLAYED)
            done = subprocess.run(
                ["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=DEADLINE_S
            )
            assert done.returncode == 0, f"{script}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
            replayed.append(script)
        elif keyword == "ENTRYPOINT":
            entrypoint = shlex.split(args.strip("[]").replace(",", " "))[0]
        else:
            assert keyword in NOT_BUILD_STEPS, f"the replay does not know {keyword}"
    assert any("layout.ACCEL is not None" in script for script in replayed)  # the check ran, and passed
    # the image's command from its last WORKDIR: the installed package, with its accelerator
    where = subprocess.run(
        [str(base / "bin" / "python"), "-c", "from diffstore.engine import layout; print(layout.ACCEL)"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=DEADLINE_S,
    )  # fmt: skip
    assert where.returncode == 0 and str(base) in where.stdout, where.stdout + where.stderr
    version = subprocess.run(
        [entrypoint, "--version"], cwd=cwd, env=env, capture_output=True, text=True, timeout=DEADLINE_S
    )
    assert version.returncode == 0 and version.stdout.startswith("diffstore "), version.stderr
