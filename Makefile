# FlowX — a newcomer's Makefile. `make demo` and `make test` set everything up themselves.

PYTHON ?= $(shell for p in python3.13 python3.12 python3.11 python3; do \
             command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
             && { command -v $$p; break; }; done)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help demo ui test lint typecheck services bench chaos clean

help: ## list the targets
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml src/flowx/_version.py
	@test -n "$(PYTHON)" || { echo "FlowX needs Python 3.11 or newer on PATH"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade 'pip>=25.1'
	$(BIN)/python -m pip install --quiet -e '.[all]' --group dev
	@touch $@

demo: $(STAMP) ## crash a worker mid-flight (SQLite; STORE=postgresql://... for PostgreSQL); another finishes
	$(BIN)/python -m examples.demo$(if $(STORE), --store "$(STORE)")

ui: $(STAMP) ## serve the web UI and HTTP API over the demo's journal (run `make demo` first)
	@test -f .demo/flowx.db || { echo "no demo journal yet: run 'make demo' first"; exit 1; }
	$(BIN)/flowx serve --db sqlite:///.demo/flowx.db --flows examples.order_flow:FLOWS --port 8080

services: ## check the PostgreSQL, Redis, RabbitMQ and NATS the tests use; start any that is down
	@bash scripts/services.sh

lint: $(STAMP) ## ruff, import-linter (the engine is pure; layers point down) and bandit
	$(BIN)/ruff check src tests examples benchmarks
	$(BIN)/lint-imports
	$(BIN)/bandit --quiet -c pyproject.toml -r src/flowx

typecheck: $(STAMP) ## mypy --strict on src/
	$(BIN)/mypy

test: $(STAMP) services lint typecheck ## everything CI runs: services, lint, types, the test suite
	$(BIN)/pytest

bench: $(STAMP) ## benchmarks (JSON to benchmarks/results/, and a table)
	$(BIN)/python -m benchmarks.journal_throughput

chaos: $(STAMP) services ## the full chaos run (kills workers, restarts PostgreSQL and Redis!)
	$(BIN)/python -m benchmarks.chaos

clean: ## remove the virtualenv, caches and demo files
	rm -rf $(VENV) .demo .mypy_cache .ruff_cache .pytest_cache
