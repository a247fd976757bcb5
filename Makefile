# warmpool — `make serve` and `make test` bootstrap everything they need.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_VERSION ?= 2.13.0
MODEL ?= sentence-transformers/all-MiniLM-L6-v2
MODEL_DIR := models/all-MiniLM-L6-v2
STAMP := $(VENV)/.installed

.PHONY: setup model serve test lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q torch==$(TORCH_VERSION)
	$(PIP) install -q -e '.[dev]'
	touch $@

model: $(STAMP)
	$(PY) -m orchestrator.models $(MODEL) models

$(MODEL_DIR)/config.json: | $(STAMP)
	$(PY) -m orchestrator.models sentence-transformers/all-MiniLM-L6-v2 models

serve: $(STAMP) $(MODEL_DIR)/config.json
	$(PY) -m orchestrator

test: $(STAMP) $(MODEL_DIR)/config.json
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check orchestrator server tests bench
	$(PY) -m ruff format --check orchestrator server tests bench
	$(PY) -m mypy

bench: $(STAMP) $(MODEL_DIR)/config.json
	$(PY) -m bench.load

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
