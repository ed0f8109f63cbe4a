#!/usr/bin/env bash
# Builds the Docker image for real and runs serve, ingest and backup in it, as a user would:
#
#   scripts/docker_smoke.sh [--base IMAGE] [--require]
#
# The base image is --base (or $DIFFSTORE_DOCKER_BASE), else python:3.11-slim when it is present or can be
# pulled, else one built here from Debian's packages with debootstrap (needs root and Debian's mirror, not
# a registry): Debian's Python 3.11 and its headers, with a venv on PATH so that `python` and `pip` are what
# they are in python:3.11-slim, and the host's certificate authorities (for pip behind a TLS proxy). Then
# (the other containers on the host's network):
#   1. docker build (the Dockerfile's own check: the installed package has the compiled accelerator);
#   2. serve, the image's default command (0.0.0.0:3030, a token, the volume /data) on a published port:
#      its HEALTHCHECK turns healthy, a request without the token is refused, a put and a query through
#      the image's CLI;
#   3. streams serve + ingest: records produced to a stream land, exactly once, in a collection of the server;
#   4. backup of the running server (--url) into a volume, then check of the backup.
# Without Docker (no client, or no daemon that answers) it says so and exits 0, unless --require (exit 1).
# Containers, volumes and the image it made are removed at exit; the Debian base image is kept (cached).
set -euo pipefail

cd "$(dirname "$0")/.."
BASE="${DIFFSTORE_DOCKER_BASE:-}"
REQUIRE=0
while [ $# -gt 0 ]; do
    case "$1" in
        --base) BASE="$2"; shift 2 ;;
        --require) REQUIRE=1; shift ;;
        -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "docker_smoke: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

skip() {
    echo "docker_smoke: SKIPPED: $*" >&2
    exit "$REQUIRE"
}

command -v docker > /dev/null || skip "no docker client on PATH (Debian: apt-get install docker.io)"
docker info > /dev/null 2>&1 || skip "no Docker daemon answers (start dockerd, or set DOCKER_HOST)"

DEBIAN_BASE=diffstore-smoke-base:bookworm-python3.11
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
TAG="diffstore-smoke:$$"
VOLUME="diffstore-smoke-$$"  # serve's /data
AUX="diffstore-smoke-aux-$$"  # /data of the stream server and of the backup
TOKEN="smoke-token-$$"
CONTAINERS=()

cleanup() {
    for c in "${CONTAINERS[@]}"; do docker rm -f -v "$c" > /dev/null 2>&1 || true; done  # -v: anonymous /data too
    docker volume rm "$VOLUME" "$AUX" > /dev/null 2>&1 || true
    docker image rm "$TAG" > /dev/null 2>&1 || true
}
trap cleanup EXIT

debian_base() {
    # python:3.11-slim's stand-in from Debian's packages: a root file system by debootstrap, imported
    if docker image inspect "$DEBIAN_BASE" > /dev/null 2>&1; then
        return
    fi
    command -v debootstrap > /dev/null || skip "no base image: python:3.11-slim cannot be pulled and there" \
        "is no debootstrap to build one (apt-get install debootstrap), or pass --base IMAGE"
    [ "$(id -u)" = 0 ] || skip "no base image: python:3.11-slim cannot be pulled, and debootstrap needs root"
    local root
    root=$(mktemp -d)
    echo "docker_smoke: building $DEBIAN_BASE from $MIRROR (debootstrap, a few minutes)" >&2
    debootstrap --variant=minbase --include=python3,python3-venv,libpython3.11-dev,ca-certificates \
        bookworm "$root" "$MIRROR" > "$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
    chroot "$root" python3 -m venv /opt/python
    # the certificate authorities this machine trusts (a proxy that re-signs TLS adds its own): the build's
    # pip reaches the package index as the host's does
    local trust=()
    if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
        cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
        trust=(--change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt')
    fi
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin
    tar -C "$root" -c . | docker import \
        --change 'ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' "${trust[@]}" \
        --change 'CMD ["python3"]' - "$DEBIAN_BASE" > /dev/null
    rm -rf "$root" "$root.log"
}

if [ -z "$BASE" ]; then
    if docker image inspect python:3.11-slim > /dev/null 2>&1 \
        || timeout 60 docker pull python:3.11-slim > /dev/null 2>&1; then
        BASE=python:3.11-slim
    else
        debian_base
        BASE="$DEBIAN_BASE"
    fi
fi

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_for SECONDS WHAT COMMAND...: runs COMMAND until it succeeds, or fails after SECONDS
wait_for() {
    local deadline=$((SECONDS + $1)) what="$2"
    shift 2
    until "$@" > /dev/null 2>&1; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "docker_smoke: FAILED: $what (no success within the deadline)" >&2
            return 1
        fi
        sleep 0.5
    done
}

echo "docker_smoke: building the image on $BASE" >&2
docker build --network host --build-arg "BASE=$BASE" -t "$TAG" . >&2

HTTP_PORT=$(free_port)
HSTREAM_PORT=$(free_port)
URL="http://127.0.0.1:$HTTP_PORT"
HSTREAM="hstream://127.0.0.1:$HSTREAM_PORT"
docker volume create "$VOLUME" > /dev/null
docker volume create "$AUX" > /dev/null
run() {  # a one-off command of the image's CLI, on the host's network, with the aux volume at /data
    docker run --rm --network host -e DIFFSTORE_TOKEN="$TOKEN" -v "$AUX:/data" "$TAG" "$@"
}

echo "docker_smoke: serve" >&2
CONTAINERS+=("diffstore-smoke-serve-$$")
docker run -d --name "diffstore-smoke-serve-$$" -p "127.0.0.1:$HTTP_PORT:3030" -e DIFFSTORE_TOKEN="$TOKEN" \
    -v "$VOLUME:/data" "$TAG" > /dev/null
healthy() { [ "$(docker inspect -f '{{.State.Health.Status}}' "diffstore-smoke-serve-$$")" = healthy ]; }
wait_for 180 "serve's HEALTHCHECK turns healthy" healthy
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/collections")" = 401 ] \
    || { echo "docker_smoke: FAILED: a request without the token was not refused" >&2; exit 1; }
run collections create smoke --manual --url "$URL" > /dev/null
run generation start smoke g1 --url "$URL" > /dev/null
run put smoke hello world --generation g1 --url "$URL" > /dev/null
run generation commit smoke g1 --url "$URL" > /dev/null
[ "$(run query smoke --url "$URL")" = "$(printf 'hello\tworld')" ] \
    || { echo "docker_smoke: FAILED: query after put" >&2; exit 1; }

echo "docker_smoke: streams serve + ingest" >&2
CONTAINERS+=("diffstore-smoke-streams-$$")
docker run -d --name "diffstore-smoke-streams-$$" --network host -v "$AUX:/data" "$TAG" \
    streams serve --host 127.0.0.1 --port "$HSTREAM_PORT" --data /data/hstream > /dev/null
wait_for 120 "streams serve answers" run streams ls --hstream "$HSTREAM"
run streams create events --hstream "$HSTREAM" > /dev/null
run streams subscribe events --subscription smoke-sub --hstream "$HSTREAM" > /dev/null
seq 1 100 | sed 's/^/record-/' | docker run --rm -i --network host "$TAG" \
    streams produce events --hstream "$HSTREAM" > /dev/null
CONTAINERS+=("diffstore-smoke-ingest-$$")
docker run -d --name "diffstore-smoke-ingest-$$" --network host -e DIFFSTORE_TOKEN="$TOKEN" "$TAG" \
    ingest --hstream "$HSTREAM" --subscription smoke-sub --collection ingested --url "$URL" \
    --create-collection --window-ms 100 --log-commits > /dev/null
# without a mapper a record's key is its partition key (one here): the collection keeps the last value
applied() { docker logs "diffstore-smoke-ingest-$$" 2> /dev/null | grep -q '"applied": 100,'; }
wait_for 120 "ingest applies the 100 records produced" applied
[ "$(run query ingested --url "$URL")" = "$(printf '\trecord-100')" ] \
    || { echo "docker_smoke: FAILED: query of what ingest wrote" >&2; exit 1; }
docker stop -t 30 "diffstore-smoke-ingest-$$" > /dev/null  # SIGTERM: commits its open window, exits
[ "$(docker inspect -f '{{.State.ExitCode}}' "diffstore-smoke-ingest-$$")" = 0 ] \
    || { docker logs "diffstore-smoke-ingest-$$" >&2; echo "docker_smoke: FAILED: ingest's exit" >&2; exit 1; }

echo "docker_smoke: backup + check" >&2
run backup --url "$URL" /data/backup >&2
run check --data /data/backup >&2

echo "docker_smoke: OK: built on $BASE; serve, ingest (100 records) and backup ran in the image"
