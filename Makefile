# The two commands that matter: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONFIG ?= config/gateway.yaml
STAMP := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run
PORT ?=
JS_STAMP := tests/js/node_modules/.installed
UI_STAMP := tests/ui/node_modules/.installed
CLIS_STAMP := tests/clis/node_modules/.installed

.PHONY: setup system js run test lint typecheck check bench clean

setup: $(STAMP)

# What the tests start or drive themselves: a throwaway PostgreSQL and Redis (replica and
# store-outage tests), promtool and docker-compose (deploy/ validation), Chromium (admin UI),
# Node and npm (the JavaScript clients in tests/js). Installed from Debian's packages only when
# missing.
system:
	@need=""; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need="$$need postgresql"; \
	command -v redis-server >/dev/null || need="$$need redis-server"; \
	command -v promtool >/dev/null || need="$$need prometheus"; \
	command -v docker-compose >/dev/null || need="$$need docker-compose"; \
	command -v chromium >/dev/null || need="$$need chromium"; \
	command -v node >/dev/null || need="$$need nodejs"; \
	command -v npm >/dev/null || need="$$need npm"; \
	if [ -n "$$need" ]; then \
		echo "installing:$$need"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$need; \
	fi

# What serving needs (make run), and that plus the development toolchain (make test).
$(RUN_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[providers]'
	touch $(RUN_STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,providers]'
	touch $(STAMP) $(RUN_STAMP)

# The JavaScript clients tests/js drives, axe-core for tests/ui's accessibility check, and the
# coding-agent CLIs tests/clis drives, Claude Code and Codex (package.json pins them; the
# lockfiles are committed): installed from the npm registry once, again only when a lockfile
# changes.
js: $(JS_STAMP) $(UI_STAMP) $(CLIS_STAMP)

$(JS_STAMP): tests/js/package.json tests/js/package-lock.json | system
	cd tests/js && npm ci --no-audit --no-fund --loglevel=error
	touch $(JS_STAMP)

$(UI_STAMP): tests/ui/package.json tests/ui/package-lock.json | system
	cd tests/ui && npm ci --no-audit --no-fund --loglevel=error
	touch $(UI_STAMP)

# Not --ignore-scripts: Claude Code's postinstall puts its native binary in place.
$(CLIS_STAMP): tests/clis/package.json tests/clis/package-lock.json | system
	cd tests/clis && npm ci --no-audit --no-fund --loglevel=error
	touch $(CLIS_STAMP)

run: $(RUN_STAMP)
	mkdir -p data
	@echo "make run: serving $(CONFIG); another port: PORT=8080 make run (or gateway serve --port 8080)"
	$(BIN)/gateway serve --config $(CONFIG) $(if $(PORT),--port $(PORT))

# The admin UI's JavaScript (no build step) is formatted and linted by Biome (biome.json),
# installed with the UI tests' packages.
BIOME := tests/ui/node_modules/.bin/biome

test: setup system js
	$(BIN)/ruff check gateway tests bench clients
	$(BIOME) ci gateway/ui
	$(BIN)/mypy
	$(BIN)/python .ci/audit
	$(BIN)/pytest -q -p no:cacheprovider

lint: setup $(UI_STAMP)
	$(BIN)/ruff check gateway tests bench clients
	$(BIOME) ci gateway/ui

typecheck: setup
	$(BIN)/mypy

bench: setup
	$(BIN)/python -m bench.run

clean:
	rm -rf $(VENV) data/*.db* .pytest_cache .mypy_cache .ruff_cache tests/js/node_modules \
		tests/ui/node_modules tests/clis/node_modules
