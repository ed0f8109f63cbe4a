VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint install clean bench protos browser etcd asan newest-python

$(PY):
	python3 -m venv $(VENV)

# setup.py and the C source: the engine's compiled accelerator is built at install (rebuilt when it changes)
$(STAMP): $(PY) pyproject.toml setup.py diffstore/engine/_accel.c
	$(PY) -m pip install --upgrade pip
	# compat: a path entry (.pth) instead of an import hook, so that Spark's lookup of pyspark_* packages
	# (pkgutil.iter_modules) finds pyspark_diffstore from any working directory
	$(PY) -m pip install -e '.[dev]' --config-settings editable_mode=compat
	# The official HStreamDB client (a test peer) builds only with an old setuptools, outside isolation.
	$(PY) -m pip install 'setuptools<82' wheel
	$(PY) -m pip install --no-build-isolation 'hstreamdb==0.5.0'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/diffstore serve --data ./data

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy diffstore

# the console's tests drive a real headless Chromium (Debian's package): installed here when missing
browser:
	./scripts/install_browser.sh

# the fail-over tests run a real etcd (Debian's etcd-server): installed here when missing
etcd:
	./scripts/install_etcd.sh

test: $(STAMP) lint browser etcd
	$(PY) -m pytest -q tests
	$(MAKE) asan
	$(MAKE) newest-python

# The engine's core tests on the newest Python pyproject.toml claims (3.13), in .venv-3.13, when one is
# installed (on PATH or in pyenv; NEWEST_PYTHON=...): the accelerator's twins, writes, reads, diffs, GC,
# history, leases, cursors, check, replication. Skipped, saying so, without such a Python or without the
# package index. 40 s to 5 min here, as loaded (the whole of tests/engine: 20 min at load 20, its hypothesis model alone
# over pytest's 10 min limit then); NEWEST_PYTHON_TESTS=tests/engine runs it all.
NEWEST_PYTHON_TESTS ?= $(addprefix tests/engine/test_,layout.py accel.py accel_build.py writes.py diff.py \
	visibility.py collections.py history.py readers_gc.py lineage.py leases.py cursors.py check.py replication.py)
newest-python:
	./scripts/newest_python.sh $(NEWEST_PYTHON_TESTS)

# The accelerator's tests without the property-based ones (the whole file: scripts/asan_check.sh), under
# AddressSanitizer and UBSan; skipped, saying so, where gcc's sanitizer runtimes are not installed.
ASAN_TESTS ?= tests/engine/test_accel.py -k "not the_same_without and not general_rows and not general_path"
asan: $(STAMP)
	PY=$(PY) ./scripts/asan_check.sh --if-available $(ASAN_TESTS)

# a quick set (a few minutes): each figure beside its baseline of the same run, and the machine's facts;
# the full runs are each script without arguments (benchmarks/RESULTS.md keeps their history)
bench: $(STAMP)
	$(PY) benchmarks/engine.py --quick
	$(PY) benchmarks/http_api.py --records 100000 --putmany-rounds 1 --only putmany,get --get-rounds 1 --seconds 1
	$(PY) benchmarks/concurrent_pages.py --records 50000 --rounds 1
	$(PY) benchmarks/workers.py --records 20000 --rounds 1 --seconds 2 --only diff
	$(PY) benchmarks/consumer_parallel.py --keys 200 --workers 1,4 --rounds 1 --backend http
	$(PY) benchmarks/overview_changes.py --waiters 100 --window 1

clean:
	rm -rf $(VENV) data

protos: $(STAMP)
	$(PY) scripts/gen_protos.py
