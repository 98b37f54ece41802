# The two commands that matter: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONFIG ?= config/gateway.yaml
STAMP := $(VENV)/.installed

.PHONY: setup system run test lint typecheck check bench clean

setup: $(STAMP)

# What the tests start or drive themselves: a throwaway PostgreSQL and Redis (replica and
# store-outage tests), promtool and docker-compose (deploy/ validation), Chromium (admin UI).
# Installed from Debian's packages only when missing.
system:
	@need=""; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need="$$need postgresql"; \
	command -v redis-server >/dev/null || need="$$need redis-server"; \
	command -v promtool >/dev/null || need="$$need prometheus"; \
	command -v docker-compose >/dev/null || need="$$need docker-compose"; \
	command -v chromium >/dev/null || need="$$need chromium"; \
	if [ -n "$$need" ]; then \
		echo "installing:$$need"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$need; \
	fi

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: setup
	mkdir -p data
	$(BIN)/gateway serve --config $(CONFIG)

test: setup system
	$(BIN)/ruff check gateway tests bench
	$(BIN)/mypy
	$(BIN)/python .ci/audit
	$(BIN)/pytest -q -p no:cacheprovider

lint: setup
	$(BIN)/ruff check gateway tests bench

typecheck: setup
	$(BIN)/mypy

bench: setup
	$(BIN)/python -m bench.run

clean:
	rm -rf $(VENV) data/*.db* .pytest_cache .mypy_cache .ruff_cache
