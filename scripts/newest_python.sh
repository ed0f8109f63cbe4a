#!/usr/bin/env bash
# The engine's tests on the newest Python that pyproject.toml claims (its last classifier, 3.13), in a venv
# of their own (.venv-3.13), when such an interpreter is installed: `make test` runs this after the main
# suite, which runs on the oldest (3.11). The engine is what every front stands on, and what a new CPython
# can break: the accelerator (built for the versions setup.py lists) and the pure-Python path beside it.
#
# Skips, saying so and exiting 0, when no python3.13 is found (on PATH, or in pyenv's versions) or when the
# package index cannot be reached to install the test venv; any other failure fails.
#
#   NEWEST_PYTHON=/path/to/python3.13 scripts/newest_python.sh [pytest args]   (default: tests/engine)
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(sed -n 's/.*"Programming Language :: Python :: \(3\.[0-9]*\)".*/\1/p' pyproject.toml | sort -V | tail -1)
skip() { echo "newest Python ($version): skipped: $*"; exit 0; }

python=${NEWEST_PYTHON:-}
if [ -z "$python" ]; then
    for candidate in "python$version" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$version"*/bin/"python$version"; do
        if "$candidate" -c 'import ssl, venv' >/dev/null 2>&1; then
            python=$candidate
            break
        fi
    done
fi
[ -n "$python" ] || skip "no python$version found (set NEWEST_PYTHON to one)"
found=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$found" = "$version" ] || skip "$python is Python $found, not $version"

venv=.venv-$version
stamp=$venv/.installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ] \
        || [ diffstore/engine/_accel.c -nt "$stamp" ]; then
    index=${PIP_INDEX_URL:-https://pypi.org/simple}
    "$python" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1].rstrip('/') + '/pip/', timeout=20)" \
        "$index" >/dev/null 2>&1 || skip "the package index ($index) cannot be reached"
    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q -e '.[server]' --config-settings editable_mode=compat \
        'pytest>=8' 'pytest-timeout>=2.2' 'hypothesis>=6.100' 'psutil>=5.9' setuptools wheel
    touch "$stamp"
fi

started=$(date +%s)
"$venv/bin/python" -c 'import sys; from diffstore.engine import layout
accel = "built" if layout.ACCEL else "not built (pure Python)"
print(f"newest Python: {sys.version.split()[0]}, accelerator {accel}")'
"$venv/bin/python" -m pytest -q -p no:cacheprovider "${@:-tests/engine}"
echo "newest Python ($version): passed in $(( $(date +%s) - started )) s"
