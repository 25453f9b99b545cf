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
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP) ## create .venv and install the project with its pinned dependencies

deps: venv ## fetch Kafka's and Spark's jars from Maven Central, install redis-server if missing
	$(BIN)/adbill deps

up: deps ## run the local stack (Kafka, Redis, traffic) in the foreground; Ctrl-C stops it
	$(BIN)/adbill up

down: venv ## stop a local stack left in the background
	$(BIN)/adbill down

test: deps ## run the unit and integration tests (real Kafka, Redis and Spark, started by fixtures)
	$(BIN)/pytest -m "not slow and not e2e" $(PYTEST_ARGS)

test-unit: venv ## run the pure tests only (no services)
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

test-integration: deps ## run the integration tests only
	$(BIN)/pytest tests/integration -m "not slow" $(PYTEST_ARGS)

RATE ?= 20000
DURATION ?= 60
bench-stream: deps ## offered traffic through Kafka and the job: throughput, click-to-Redis latency, CPU, memory (RATE=, DURATION=)
	$(BIN)/python -m ops.bench_stream --rate $(RATE) --duration $(DURATION)

lint: venv ## ruff (lint and format check) and mypy
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy attribution billing producers web ops

format: venv ## format the code with ruff
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean: ## remove local data (var/); keeps .venv and .deps
	rm -rf var

.PHONY: help venv deps up down test test-unit test-integration bench-stream lint format clean
