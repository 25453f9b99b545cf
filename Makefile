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

LOCK := requirements.lock
# Every package, transitive ones included, at the version and with the hashes of requirements.lock; nothing else is
# resolved. The project itself goes in editable, without dependencies, built with the locked setuptools.
$(STAMP): $(LOCK) pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --require-hashes --no-deps -r $(LOCK)
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	$(BIN)/python -m pip check
	@touch $(STAMP)

venv: $(STAMP) ## create .venv and install exactly the locked dependencies (requirements.lock, hashes checked)

LOCK_VENV := .venv-lock
LOCK_TOOLS := pip-tools==7.6.2
LOCK_ARGS ?=
$(LOCK_VENV)/.installed: Makefile
	@test -x $(LOCK_VENV)/bin/python || $(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install --quiet $(LOCK_TOOLS)
	@touch $@

lock: $(LOCK_VENV)/.installed ## re-resolve requirements.lock from pyproject.toml after editing it; LOCK_ARGS=--upgrade updates every pin
	CUSTOM_COMPILE_COMMAND="make lock" $(LOCK_VENV)/bin/pip-compile --quiet --generate-hashes --allow-unsafe \
		--strip-extras --no-emit-find-links --extra dev --extra bench --all-build-deps $(LOCK_ARGS) \
		--output-file $(LOCK) pyproject.toml

deps: venv ## fetch Kafka's and Spark's jars from Maven Central; install redis-server, chromium, promtool, pdftoppm, dot if missing
	$(BIN)/adbill deps

up: deps ## run the local stack (Kafka, Redis, traffic) in the foreground; Ctrl-C stops it
	$(BIN)/adbill up

up-cluster: deps ## run the local cluster (3 Kafka brokers, Spark master and 2 workers, Redis, job, web, traffic); Ctrl-C stops it
	$(BIN)/adbill up --cluster

down: venv ## stop a local stack or cluster left in the background
	$(BIN)/adbill down

# Test files spread over this many pytest processes (pytest-xdist), each with its own Redis, PostgreSQL and Spark and
# one Kafka broker for all; a file's tests stay in one process, in order. TEST_WORKERS=0 runs them in this process.
# The local cluster's test runs in the pool like the others.
TEST_WORKERS ?= 3

test: deps ## run the unit, integration and browser tests (real Kafka, Redis, Spark and Chromium, started by fixtures)
	$(BIN)/python -m tests.spark_archive
	$(BIN)/pytest -m "not slow" -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-slow: deps ## run the tests kept out of `make test` for time: the SIGKILL test with each task writing on its executor and with join state format 4, the cluster with format 4
	$(BIN)/python -m tests.spark_archive
	$(BIN)/pytest -m slow $(PYTEST_ARGS)

test-unit: venv ## run the pure tests only (no services)
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

test-integration: deps ## run the integration tests only
	$(BIN)/pytest tests/integration -m "not slow" $(PYTEST_ARGS)

test-e2e: deps ## run the browser tests only (Debian's headless Chromium; screenshots in var/test-output/screens/)
	$(BIN)/pytest tests/e2e -m "e2e and not slow" $(PYTEST_ARGS)

RATE ?= 20000
DURATION ?= 60
bench-stream: deps ## offered traffic through Kafka and the job: throughput, click-to-Redis latency, CPU, memory (RATE=, DURATION=)
	$(BIN)/python -m ops.bench.stream --rate $(RATE) --duration $(DURATION)

BENCH_RATES ?= 5000,10000,20000,40000,60000
BENCH_DURATION ?= 30
BENCH_ARGS ?=
bench: deps ## ceiling, textbook baseline and pipeline side by side up to the knee; report in var/bench/<time>/ (BENCH_RATES=, BENCH_DURATION=, BENCH_ARGS="--set trigger_ms=500")
	$(BIN)/python -m ops.bench --rates $(BENCH_RATES) --duration $(BENCH_DURATION) $(BENCH_ARGS)

REALTIME_VENV := .venv-realtime
REALTIME_PYSPARK ?= 4.3.0
REALTIME_ARGS ?=
# The probe's venv: the product's installed packages at their versions, with pyspark (and its py4j) at REALTIME_PYSPARK.
bench-realtime: deps ## whether Spark's real-time mode runs the attribution join, in pyspark REALTIME_PYSPARK (its own venv): each try's outcome (REALTIME_ARGS="--rate 1000")
	@test -x $(REALTIME_VENV)/bin/python || $(PYTHON) -m venv $(REALTIME_VENV)
	$(BIN)/python -m pip freeze --exclude-editable | grep -v -E '^(pyspark|py4j)==' > $(REALTIME_VENV)/others.txt
	$(REALTIME_VENV)/bin/python -m pip install --quiet pyspark==$(REALTIME_PYSPARK) -r $(REALTIME_VENV)/others.txt
	$(BIN)/python -m ops.bench.realtime --spark-python $(REALTIME_VENV)/bin/python $(REALTIME_ARGS)

CLUSTER_WORKERS ?= 1,2
CLUSTER_RATES ?= 10000,20000,40000
bench-cluster: deps ## the pipeline on a local Spark cluster of 1, then 2 workers: throughput, the driver's and the executors' CPU per event (CLUSTER_WORKERS=, CLUSTER_RATES=)
	$(BIN)/python -m ops.bench --cluster-workers $(CLUSTER_WORKERS) --rates $(CLUSTER_RATES) --duration $(BENCH_DURATION) $(BENCH_ARGS)

SOAK_MINUTES ?= 30
bench-soak: deps ## the pipeline at RATE for SOAK_MINUTES: memory, state and latency over time, flat or not
	$(BIN)/python -m ops.bench --soak-minutes $(SOAK_MINUTES) --rate $(RATE)

EVENTS ?= 10000000
bench-reconcile: deps ## reconcile, close and export a synthetic day of EVENTS events (default 10 million) and print the time
	$(BIN)/python -m ops.bench.reconcile --events $(EVENTS)

NETWORK_SIZES ?= 10000,100000,1000000
NETWORK_SECONDS ?= 60
NETWORK_STREAM_SECONDS ?= 120
NETWORK_ARGS ?=
bench-network: deps ## the catalog at NETWORK_SIZES ads: load, a process's start, a bid change at each door (store, API, page, command), ten changes a second from four doors for NETWORK_SECONDS, the catalog's pages and a dashboard, the stream at 10,000 events/s for NETWORK_STREAM_SECONDS while the doors write, against a run with 60 ads and no changes (NETWORK_ARGS="--phases web,stream")
	$(BIN)/python -m ops.bench.network --sizes $(NETWORK_SIZES) --seconds $(NETWORK_SECONDS) --stream-seconds $(NETWORK_STREAM_SECONDS) $(NETWORK_ARGS)

CHANGES ?= 10
CATALOG_DURATION ?= 300
bench-catalog: deps ## a catalog change to its first bill (median of CHANGES), and a run whose prices change every minute: stream, final and ground truth
	$(BIN)/python -m ops.bench.catalog --changes $(CHANGES) --duration $(CATALOG_DURATION)

CLIENTS ?= 50
WEB_DURATION ?= 20
bench-web: deps ## the dashboard and its API under CLIENTS concurrent clients on gunicorn: req/s, p50/p99/max (WEB_DURATION=)
	$(BIN)/python -m ops.bench.web --clients $(CLIENTS) --duration $(WEB_DURATION)

STORY_HOURS ?= 744
STORY_CLICKS ?= 1000
bench-stories: venv ## a month (STORY_HOURS hourly periods, STORY_CLICKS clicks each) written as the product writes it: click stories (found in its files), adbill explain and clicks by price timed
	$(BIN)/python -m ops.bench.stories --hours $(STORY_HOURS) --clicks-per-hour $(STORY_CLICKS)

STORY_DAYS ?= 7
STORY_DAY_CLICKS ?= 10000000
STORY_SCRATCH ?= /tmp
bench-stories-scale: venv ## STORY_DAYS days of STORY_DAY_CLICKS clicks at the 1 s trigger, closed day by day as written: the product's compaction, filters and click lookups (cold and warm), checked against what was written (about 1.5 h and 65 GB of STORY_SCRATCH at the defaults)
	$(BIN)/python -m ops.bench.story_options --days $(STORY_DAYS) --clicks-per-day $(STORY_DAY_CLICKS) --batches-per-hour 3600 --options product --lookups 60 --absent 6 --scratch $(STORY_SCRATCH) --close-daily

AUDIT_VENV := .venv-audit
AUDIT_TOOLS := pip-audit==2.10.1 bandit==1.9.4
$(AUDIT_VENV)/.installed: Makefile
	@test -x $(AUDIT_VENV)/bin/python || $(PYTHON) -m venv $(AUDIT_VENV)
	$(AUDIT_VENV)/bin/python -m pip install --quiet $(AUDIT_TOOLS)
	@touch $@

audit: venv $(AUDIT_VENV)/.installed ## bandit on the code, pip-audit on every pinned package of .venv (tools in their own venv); docs/security.md
	@mkdir -p var/audit
	$(BIN)/python -m pip freeze --exclude-editable > var/audit/requirements.txt
	@status=0; \
	$(AUDIT_VENV)/bin/bandit -c pyproject.toml -r attribution billing producers web ops -q \
		&& echo "bandit: no issues" || status=1; \
	$(AUDIT_VENV)/bin/pip-audit --strict --no-deps --disable-pip --progress-spinner off \
		-r var/audit/requirements.txt || status=1; \
	exit $$status

CHAOS_SEED ?=
CHAOS_RATE ?= 100
chaos: deps ## the chaos suite on the local cluster: driver, worker, broker, Redis kills, overlapping faults, a full disk, poison, a 20-minute outage, prices changing, a schema version deployed; report in var/chaos/<time>/ (CHAOS_SEED=, CHAOS_RATE=, CHAOS_ARGS="--outage-minutes 2")
	$(BIN)/python -m ops.chaos --rate $(CHAOS_RATE) $(if $(CHAOS_SEED),--seed $(CHAOS_SEED)) $(CHAOS_ARGS)

docs: venv ## check the docs (links and anchors, the commands they show, the generated settings page and picture); fast, no services, part of `make test`
	$(BIN)/pytest tests/unit/test_docs.py -q $(PYTEST_ARGS)

docs-generate: venv ## write docs/settings.md from ops/settings.py and draw docs/dataflow.svg from docs/dataflow.dot (Graphviz's dot)
	$(BIN)/python -m ops.docs

lint: venv ## ruff (lint and format check) and mypy
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy attribution billing producers web ops

format: venv ## format the code with ruff
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean: ## remove local data (var/); keeps .venv and .deps
	rm -rf var

.PHONY: help venv lock deps up up-cluster down test test-slow test-unit test-integration test-e2e bench-stream bench bench-cluster bench-soak bench-reconcile bench-catalog bench-network bench-web bench-stories bench-stories-scale audit chaos docs docs-generate lint format clean
