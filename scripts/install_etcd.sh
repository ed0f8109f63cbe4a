#!/usr/bin/env bash
# Installs etcd (Debian's etcd-server) for the fail-over tests (tests/ha) when it is missing and this
# machine can (root and apt-get). Otherwise says so loudly: the fail-over tests then FAIL (they never skip).
set -uo pipefail
if command -v etcd >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing etcd for the fail-over tests (apt-get install etcd-server)"
    export DEBIAN_FRONTEND=noninteractive
    if apt-get update -qq && apt-get install -y -qq etcd-server >/dev/null; then
        exit 0
    fi
    echo "!!! apt-get could not install etcd-server" >&2
fi
echo "!!! no etcd and no way to install it (needs root and apt-get; or put an etcd binary on PATH," >&2
echo "!!! or set DIFFSTORE_ETCD=/path/to/etcd): the fail-over tests (tests/ha) will FAIL" >&2
exit 0
