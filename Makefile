# adbill: `make up` runs the local stack, `make test` runs the tests. Both set up what they need on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.DEFAULT_GOAL := help

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-16s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	@touch $(STAMP)

venv: $(STAMP) ## create .venv and install the project with its pinned dependencies

deps: venv ## fetch Kafka's and Spark's jars from Maven Central, install redis-server if missing
	$(BIN)/adbill deps

up: deps ## run the local stack (Kafka, Redis, traffic) in the foreground; Ctrl-C stops it
	$(BIN)/adbill up

up-cluster: deps ## run the local cluster (3 Kafka brokers, Spark master and 2 workers, Redis, job, web, traffic); Ctrl-C stops it
	$(BIN)/adbill up --cluster

down: venv ## stop a local stack or cluster left in the background
	$(BIN)/adbill down

test: deps ## run the unit, integration and browser tests (real Kafka, Redis, Spark and Chromium, started by fixtures)
	$(BIN)/pytest -m "not slow" $(PYTEST_ARGS)

test-unit: venv ## run the pure tests only (no services)
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

test-integration: deps ## run the integration tests only
	$(BIN)/pytest tests/integration -m "not slow" $(PYTEST_ARGS)

test-e2e: deps ## run the browser tests only (Debian's headless Chromium; screenshots in var/test-output/screens/)
	$(BIN)/pytest tests/e2e -m "e2e and not slow" $(PYTEST_ARGS)

RATE ?= 20000
DURATION ?= 60
bench-stream: deps ## offered traffic through Kafka and the job: throughput, click-to-Redis latency, CPU, memory (RATE=, DURATION=)
	$(BIN)/python -m ops.bench_stream --rate $(RATE) --duration $(DURATION)

BENCH_RATES ?= 5000,10000,20000,40000,60000
BENCH_DURATION ?= 30
bench: deps ## ceiling, textbook baseline and pipeline side by side up to the knee; report in var/bench/<time>/ (BENCH_RATES=, BENCH_DURATION=)
	$(BIN)/python -m ops.bench --rates $(BENCH_RATES) --duration $(BENCH_DURATION)

SOAK_MINUTES ?= 30
bench-soak: deps ## the pipeline at RATE for SOAK_MINUTES: memory, state and latency over time, flat or not
	$(BIN)/python -m ops.bench --soak-minutes $(SOAK_MINUTES) --rate $(RATE)

EVENTS ?= 10000000
bench-reconcile: deps ## reconcile, close and export a synthetic day of EVENTS events (default 10 million) and print the time
	$(BIN)/python -m ops.bench_reconcile --events $(EVENTS)

CLIENTS ?= 50
WEB_DURATION ?= 20
bench-web: deps ## the dashboard and its API under CLIENTS concurrent clients on gunicorn: req/s, p50/p99/max (WEB_DURATION=)
	$(BIN)/python -m web.bench --clients $(CLIENTS) --duration $(WEB_DURATION)

CHAOS_SEED ?=
CHAOS_RATE ?= 100
chaos: deps ## the chaos suite on the local cluster: driver, worker, broker, Redis kills, poison, an outage past the horizon; report in var/chaos/<time>/ (CHAOS_SEED=, CHAOS_RATE=)
	$(BIN)/python -m ops.chaos --rate $(CHAOS_RATE) $(if $(CHAOS_SEED),--seed $(CHAOS_SEED))

lint: venv ## ruff (lint and format check) and mypy
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy attribution billing producers web ops

format: venv ## format the code with ruff
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean: ## remove local data (var/); keeps .venv and .deps
	rm -rf var

.PHONY: help venv deps up up-cluster down test test-unit test-integration test-e2e bench-stream bench bench-soak bench-reconcile bench-web chaos lint format clean
