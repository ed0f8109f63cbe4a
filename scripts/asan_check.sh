#!/usr/bin/env bash
# Runs tests against the engine's compiled accelerator (diffstore/engine/_accel.c) built with
# AddressSanitizer and UndefinedBehaviorSanitizer, Python's allocations going through malloc so that ASan
# sees them too. The sanitized build replaces the in-tree .so for the run; the normal build is restored
# on exit (also on failure or Ctrl-C).
#
#   scripts/asan_check.sh                      # tests/engine/test_accel.py
#   scripts/asan_check.sh tests/engine -k diff # any pytest arguments
#   scripts/asan_check.sh --if-available ...   # exit 0, saying so, where gcc's sanitizers or the
#                                              # accelerator are not there (`make test` runs it so)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}

IF_AVAILABLE=0
if [ "${1:-}" = "--if-available" ]; then IF_AVAILABLE=1; shift; fi
unavailable() {
    if [ "$IF_AVAILABLE" = 1 ]; then echo "asan_check: skipped: $1"; exit 0; fi
    echo "asan_check: $1" >&2
    exit 1
}
command -v gcc >/dev/null || unavailable "no gcc here"
for lib in libasan.so libubsan.so; do
    [ -e "$(gcc -print-file-name=$lib)" ] || unavailable "gcc has no $lib here (install its sanitizer runtimes)"
done
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'int main(void) { return 0; }' >"$probe/probe.c"
gcc -fsanitize=address,undefined "$probe/probe.c" -o "$probe/probe" 2>/dev/null && "$probe/probe" \
    || unavailable "gcc cannot build with -fsanitize=address,undefined here"
"$PY" -c 'import importlib.util as u; raise SystemExit(u.find_spec("diffstore.engine._accel") is None)' \
    || unavailable "the accelerator is not built for this interpreter (see setup.py)"
SO=$("$PY" -c 'import sysconfig; print("diffstore/engine/_accel" + sysconfig.get_config_var("EXT_SUFFIX"))')
INCLUDE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
DIGEST=$(sha256sum diffstore/engine/_accel.c | cut -d' ' -f1) # as setup.py passes it: layout.py uses the build

restore() {
    rm -rf "$probe"
    # the accelerator was built here before (checked above), whatever version setup.py vouches for
    DIFFSTORE_ACCEL_UNTESTED=1 "$PY" setup.py -q build_ext --inplace --force >/dev/null 2>&1 \
        || echo "restoring the normal build failed: run make install" >&2
}
trap restore EXIT

gcc -shared -fPIC -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined \
    -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Werror \
    -DDIFFSTORE_ACCEL_SOURCE="\"$DIGEST\"" -I"$INCLUDE" diffstore/engine/_accel.c -o "$SO"

export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export PYTHONMALLOC=malloc
"$PY" -c 'from diffstore.engine import layout; assert layout.ACCEL is not None, "the sanitized build did not load"'
if [ $# -eq 0 ]; then set -- tests/engine/test_accel.py; fi
"$PY" -X dev -m pytest -q -p no:cacheprovider "$@"
