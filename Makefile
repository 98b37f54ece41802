# The two commands that matter: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONFIG ?= config/gateway.yaml
STAMP := $(VENV)/.installed

.PHONY: setup run test lint typecheck check bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: setup
	mkdir -p data
	$(BIN)/gateway serve --config $(CONFIG)

test: setup
	$(BIN)/ruff check gateway tests bench
	$(BIN)/mypy
	$(BIN)/pytest -q -p no:cacheprovider

lint: setup
	$(BIN)/ruff check gateway tests bench

typecheck: setup
	$(BIN)/mypy

bench: setup
	$(BIN)/python -m bench.run

clean:
	rm -rf $(VENV) data/*.db* .pytest_cache .mypy_cache .ruff_cache
