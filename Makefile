# MIMESIS: the two README commands are `make pipeline` and `make test`.
# Both create/refresh the local virtual environment first (idempotent).
SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

export PATH := $(abspath $(VENV))/bin:$(PATH)
export DVC_NO_ANALYTICS := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export GX_ANALYTICS_ENABLED := false
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR := false
export PYTHONUNBUFFERED := 1

.PHONY: setup pipeline test test-all test-fast seeds bench ui ui-stop clean-outputs help

help:
	@echo "make pipeline   # set up .venv and run the whole pipeline (dvc repro) on the tiny default"
	@echo "make test       # set up .venv and run the test suite (all but the \`long\` runs; CI runs this)"
	@echo "make test-all   # every test, the \`long\` runs included (full dvc repro, browser, agent signal)"
	@echo "make seeds      # the whole chain with other training seeds, effects pooled (SEEDS=\"1235 1236\")"
	@echo "make bench      # data-stage throughput benchmark (not a test)"
	@echo "make ui         # start the Prefect UI (+ deployments) and the MLflow UI on 127.0.0.1"
	@echo "make ui-stop    # stop them"

setup: $(STAMP)

# Order matters: torch first (the pinned CPU build), then deepspeed built against it
# without build isolation (an isolated build would fetch another torch), then the project.
$(STAMP): pyproject.toml requirements.lock
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (Python 3.11 is required)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet torch==2.13.0
	DS_BUILD_OPS=0 $(PY) -m pip install --quiet --no-build-isolation -c requirements.lock deepspeed
	$(PY) -m pip install --quiet -c requirements.lock -e ".[dev]"
	touch $(STAMP)

pipeline: setup
	dvc repro

test: setup
	pytest -m "not long"

test-all: setup
	pytest

test-fast: setup
	pytest -m "not slow"

ui: setup
	$(PY) -m flows.ui start $(if $(PREFECT_PORT),--prefect-port $(PREFECT_PORT)) $(if $(MLFLOW_PORT),--mlflow-port $(MLFLOW_PORT))

ui-stop:
	$(PY) -m flows.ui stop

# The whole chain again with other training seeds (clones of HEAD under .seeds/), effects pooled over the
# chains: reports/seeds.md, metrics/seeds.json. About 10.5 min per chain on 2 cores. SEEDS="1235 1236 1237".
seeds: setup
	$(PY) -m flows.seeds $(if $(SEEDS),--seeds $(SEEDS))

bench: setup
	$(PY) bench/bench_data_stages.py

clean-outputs:
	rm -rf data/processed data/quarantine data/splits data/gyms metrics/*.json
