# diffstore HTTP server:
#   docker build -t diffstore . && docker run -p 3030:3030 -e DIFFSTORE_TOKEN=... -v diffstore-data:/data diffstore
# It binds 0.0.0.0, so it refuses to start without DIFFSTORE_TOKEN (every route but /healthz and the
# console's static shell then needs `Authorization: Bearer <token>`).
# BASE: any image with Python 3.11 as `python`/`pip` and apt-get (scripts/docker_smoke.sh builds one from
# Debian's packages where no registry is reachable).
ARG BASE=python:3.11-slim
FROM ${BASE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# The dependencies first, from pyproject.toml alone: a change to the source then rebuilds only the layers
# below, not this one (the base package's, the server's and the streams' extras: no spark, no dev tools).
COPY pyproject.toml ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; extras = p['optional-dependencies']; print(*dict.fromkeys(p['dependencies'] + extras['server'] + extras['streams']), sep='\n')" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
COPY setup.py README.md LICENSE ./
COPY diffstore ./diffstore
# gcc only while installing: it builds the engine's compiled hot loops (diffstore/engine/_accel.c; without
# it the engine would run their pure-Python twins). The source is removed once installed: in /app it would
# shadow the installed package (which holds the compiled accelerator) for the check and for any
# `python -c` run there. tests/test_dockerfile.py replays these steps without Docker.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install --no-deps . \
    && cd / && rm -rf /app \
    && python -c "from diffstore.engine import layout; assert layout.ACCEL is not None, 'no accelerator'" \
    && apt-get purge -y gcc libc6-dev && apt-get autoremove -y && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --home-dir /data --no-create-home diffstore \
    && mkdir -p /data \
    && chown diffstore:diffstore /data

WORKDIR /data
USER diffstore
VOLUME ["/data"]
EXPOSE 3030
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:3030/healthz', timeout=2).status != 200)"]

ENTRYPOINT ["diffstore"]
CMD ["serve", "--host", "0.0.0.0", "--port", "3030", "--data", "/data"]
