VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint install clean bench

$(PY):
	python3 -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/diffstore serve --data ./data

lint: $(STAMP)
	$(VENV)/bin/ruff check diffstore tests benchmarks examples
	$(VENV)/bin/mypy diffstore

test: $(STAMP) lint
	$(PY) -m pytest -q tests

bench: $(STAMP)
	$(PY) benchmarks/engine.py

clean:
	rm -rf $(VENV) data
