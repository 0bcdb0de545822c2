# runjournal — every target installs what it needs first (system packages via apt-get when root).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INPUT ?=
DEMO_ARGS ?=
KNOWLEDGE ?= ../shared/data/knowledge/tau-bench-airline-policy.md

.PHONY: help deps deps-test venv install test test-slow test-cluster test-campaign campaign-acceptance test-fast lint schemas-check demo stack-up stack-down stack-status topics bench clean

help: ## List targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

deps: ## Install java, mvn, redis-server/redis-cli and openssl from Debian's packages when missing (needs root)
	@missing=""; \
	command -v java >/dev/null || missing="$$missing openjdk-17-jre-headless"; \
	command -v mvn >/dev/null || missing="$$missing maven"; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v redis-cli >/dev/null || missing="$$missing redis-tools"; \
	command -v openssl >/dev/null || missing="$$missing openssl"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "missing:$$missing — run: sudo apt-get install -y$$missing" >&2; exit 1; fi; \
	fi

deps-test: ## Install what the tests drive besides the stack: Debian's chromium (browser tests) and prometheus (promtool)
	@missing=""; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  else echo "missing:$$missing — run: sudo apt-get install -y$$missing" >&2; exit 1; fi; \
	fi

# .[dev] = every extra (cli, memory, registry, console) + the test, lint and type-check tools; make demo needs
# .[demo] only, but one venv serves both targets.
$(BIN)/runjournal: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

venv: $(BIN)/runjournal ## Create .venv and install runjournal with every extra and the dev tools

install: deps venv ## deps + venv

lint: venv ## ruff, import-linter layers and cycles, mypy --strict on the public packages, deptry
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/deptry .

schemas-check: venv ## Compatibility gate over every published schema version
	$(BIN)/runjournal schemas check

test: install deps-test ## Install everything, start a private real stack, run the whole suite, stop the stack
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(BIN)/deptry .
	$(BIN)/runjournal schemas check
	$(BIN)/pytest -q --durations=30

# The longest tests (marker `slow`, set in their modules; tests/faults holds most): crash matrices, the main job end to end, fresh
# venvs, browser and adapter examples. Same private stack as make test; .ci/run runs it after make test.
test-slow: install deps-test ## The slow tests left out of `make test` (crash matrices, demo, packaging; ~20 min)
	$(BIN)/pytest -q --durations=30 -m 'slow and not cluster'

# The production shape (tests/cluster, marker `cluster`): three KRaft brokers, SASL_SSL + SCRAM, the roles' ACLs,
# leader failover under load; a 3-master Redis Cluster over TLS with ACL users per role, the projector and recovery
# crash tests against it. Starts and stops a stack of its own (`runjournal stack up --brokers 3 --secure
# --redis-cluster`).
test-cluster: install ## The 3-broker secure-cluster tests (left out of `make test`; ~4 min)
	$(BIN)/pytest -q -m cluster tests/cluster

# The fault campaign (tests/campaign, marker `campaign`): the main job on the real input (200 runs) with --faults all
# on a 3-broker stack with a registry that the test starts. Two cells by default (seed 1, provider idempotency off, in
# each outcome mode: group commit and strict); campaign-acceptance runs the acceptance matrix (3 seeds x idempotency
# off/on in group commit, plus 3 strict cells and one with encryption on; ~40-65 min) and keeps each cell's summary.
# A cell is seed:idempotency[:mode[:encryption]]; encryption `enc` runs the fleet with RUNJOURNAL_ENCRYPTION=on.
CAMPAIGN_MATRIX ?= 1:off:group,1:off:strict
test-campaign: install ## The fault campaign on the real input, one cell per outcome mode (~6-12 min)
	RJ_CAMPAIGN_MATRIX=$(CAMPAIGN_MATRIX) $(BIN)/pytest -q -m campaign --timeout=2400 tests/campaign

campaign-acceptance: install ## The acceptance matrix: 3 seeds x idempotency off/on, group + 3 strict + 1 encrypted cell (~40-65 min)
	RJ_CAMPAIGN_MATRIX=1:off,2:off,3:off,1:on,2:on,3:on,1:off:strict,2:on:strict,3:off:strict,1:off:group:enc \
	  RJ_CAMPAIGN_RESULTS=campaign-results.jsonl \
	  $(BIN)/pytest -q -m campaign --timeout=2400 tests/campaign

demo: install ## The main job end to end (INPUT=path/to/trajectories.json for real runs)
	$(BIN)/runjournal stack up
	$(BIN)/runjournal topics create
	$(BIN)/runjournal demo $(if $(INPUT),--input $(INPUT),) $(if $(wildcard $(KNOWLEDGE)),--knowledge $(KNOWLEDGE),) $(DEMO_ARGS)

stack-up: install ## Start Kafka + Redis (+ Qdrant local path)
	$(BIN)/runjournal stack up

stack-down: ## Stop what stack-up started
	@if [ -x $(BIN)/runjournal ]; then $(BIN)/runjournal stack down; fi

stack-status: venv
	$(BIN)/runjournal stack status

topics: venv ## Create the topics on the running stack
	$(BIN)/runjournal topics create

QUIX_VENV := bench/out/quix-venv
BENCH_ARGS ?=

$(VENV)/.bench-installed: pyproject.toml | $(BIN)/runjournal
	$(BIN)/pip install -q -e '.[dev,bench]'
	touch $@

# Quix Streams (the projection anchor) pins confluent-kafka<2.13: it gets a venv of its own.
$(QUIX_VENV)/.installed: bench/quix-requirements.txt
	test -x $(QUIX_VENV)/bin/python || $(PYTHON) -m venv $(QUIX_VENV)
	$(QUIX_VENV)/bin/pip install -q -r bench/quix-requirements.txt
	touch $@

bench: install $(VENV)/.bench-installed $(QUIX_VENV)/.installed ## Benchmarks side by side (bench/README.md); BENCH_ARGS=--quick|--json
	$(BIN)/runjournal stack up || echo "bench: 'stack up' failed (ports in use?); the bench starts a private stack"
	$(BIN)/python -m bench $(BENCH_ARGS)

clean: stack-down
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
