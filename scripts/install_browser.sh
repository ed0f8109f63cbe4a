#!/usr/bin/env bash
# Installs the headless browser of the console's tests (Debian's chromium) when it is missing and this
# machine can (root and apt-get). Otherwise says so loudly: the browser tests then skip.
set -uo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing chromium for the console's browser tests (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    if apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; then
        exit 0
    fi
    echo "!!! apt-get could not install chromium" >&2
fi
echo "!!! no chromium and no way to install it (needs root and apt-get):" >&2
echo "!!! the console's browser tests (tests/console) will be SKIPPED" >&2
exit 0
