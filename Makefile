# ddpjob developer commands. `make help` lists them.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
CLUSTER_DIR ?= .cluster
# mypy's incremental cache outside the checkout, shared by every clone (it re-checks a module whose source hash
# changed, and what depends on it): a fresh clone's type check takes ~2 s instead of 55-66 s (CI clones afresh).
export MYPY_CACHE_DIR ?= $(or $(DDPJOB_CACHE),$(HOME)/.cache/ddpjob)/mypy

.DEFAULT_GOAL := help

# Area-specific targets (packaging, e2e) live beside their scripts.
-include hack/make/*.mk

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# `make test` collects each phase's time here (hack/timed.sh; DDPJOB_TIMINGS for the scripts and suites it runs)
# and prints them as a table at the end, whatever the outcome.
TIMINGS ?= $(CURDIR)/.out/timings.tsv
TIMED := bash hack/timed.sh
# import-linter's CLI (the .importlinter contracts) through the venv's python: its console script lives in the
# shared dependency venv, not in .venv/bin.
LINT_IMPORTS = $(PY) -c 'import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())' --no-cache

.PHONY: venv
venv: ## Create .venv and install ddpjob with dev extras (idempotent)
	@$(TIMED) venv bash hack/venv.sh

.PHONY: tools
tools: ## Build the pinned cluster tools (k8s v1.34, etcd, kwok, helm) into ~/.cache/ddpjob (cached)
	@$(TIMED) tools bash hack/install-tools.sh

.PHONY: core-tools
core-tools: ## Build only the tools of a plain cluster (k8s v1.34, etcd, kwok, helm): no Kueue, scheduler-plugins, Prometheus, SeaweedFS, registry
	@$(TIMED) tools bash hack/install-tools.sh --core

# `make test` is what CI runs (.ci/run): everything, the real-node e2e tier included (root, ~15 GB free disk).
.PHONY: test
test: ## Run every test: lint, types, unit, integration, then the e2e tier on a local real node (hack/test.sh); prints a timing table
	@mkdir -p $(dir $(TIMINGS)) && rm -f $(TIMINGS)
	@start=$$(date +%s); DDPJOB_TIMINGS=$(TIMINGS) MAKE="$(MAKE)" bash hack/test.sh; rc=$$?; \
		python3 hack/timings.py $(TIMINGS) --since $$start; exit $$rc

.PHONY: test-fast
test-fast: venv tools test-static ## Run lint, type checks, unit and integration tests (no root, no Docker)
	$(TIMED) pytest $(PY) -m pytest tests -m "not e2e" -q -n 2 --dist loadgroup

.PHONY: test-static
test-static: venv ## ruff, the layer contracts and mypy, each a row of make test's timing table
	$(TIMED) lint $(PY) -m ruff check operator worker tests bench
	$(TIMED) layers $(LINT_IMPORTS)
	$(TIMED) types $(PY) -m mypy

.PHONY: unit
unit: venv ## Run the unit tests only
	$(PY) -m pytest tests -m unit -q

.PHONY: lint
lint: venv ## ruff, the operator's layer contracts (.importlinter; docs/architecture.md) and mypy
	$(PY) -m ruff check operator worker tests bench
	$(LINT_IMPORTS)
	$(PY) -m mypy

.PHONY: cluster-up
cluster-up: venv $(if $(filter 0,$(ADDONS)),core-tools,tools) ## Start the local control plane in .cluster/ (ADDONS=0: no Kueue, no scheduler-plugins); the last line is `export KUBECONFIG=...`
	@$(if $(filter real,$(NODE)),$(MAKE) --no-print-directory node-tools)
	@$(PY) -m tests.cluster up --dir $(CLUSTER_DIR) $(if $(filter real,$(NODE)),--real-node --nodes $(NODES)) $(if $(filter 0,$(ADDONS)),--no-addons)

.PHONY: disk
disk: ## Show what the builds and tests keep on disk, place by place; exit 1 over DDPJOB_DISK_BUDGET_GB (default 70)
	@bash hack/disk.sh

.PHONY: cluster-down
cluster-down: ## Stop the local control plane and remove its state (no process or port left)
	@if [ -x $(PY) ]; then $(PY) -m tests.cluster down --dir $(CLUSTER_DIR); else python3 -m tests.cluster down --dir $(CLUSTER_DIR); fi

.PHONY: run-local
run-local: venv ## Run the CPU example DDPJob locally with `ddpjob run` (no Kubernetes)
	$(VENV)/bin/ddpjob run manifests/examples/cpu-charlm.yaml

.PHONY: bench
bench: venv tools ## Run the benchmarks (operator scale; checkpoint and worker benchmarks live in bench/ too)
	$(PY) bench/operator_scale.py --jobs 1 100 500 --out docs/bench

.PHONY: bench-steady
bench-steady: venv tools ## 1,000 running jobs x 8 workers reporting progress for 10 min: operator CPU, API load, replacement latency
	PYTHONPATH=operator:worker $(PY) bench/steady_state.py --jobs 1000 --workers 8 --minutes 10 --out docs/bench

.PHONY: bench-replication
bench-replication: venv tools ## Replication of a script's 1 GB checkpoints: step time off/on, copy lag, restore from a peer and from S3
	$(PY) bench/replication_bench.py --size-mb 1024 --every 40 --steps 160 --repeats 2

.PHONY: bench-recovery
bench-recovery: venv tools node-tools images ## Faults of 3 kinds x 5 on a real node, spares 0 and 1: recovery phases p50/p95
	$(PY) bench/recovery.py --faults 5 --spares 0 1 --out docs/bench

.PHONY: bench-recovery-nodes
bench-recovery-nodes: venv tools node-tools images ## A node powered off / partitioned x 5, spares 0 and 1, on 4 real nodes: phases p50/p95
	$(PY) bench/recovery.py --kinds node --faults 5 --spares 0 1 --out docs/bench

.PHONY: bench-gang
bench-gang: venv tools ## Time the coscheduling scheduler placing 100 gang jobs x 4 workers against kube-scheduler
	$(PY) bench/gang_scheduling.py --jobs 100 --workers 4 --rounds 2
