# Everything runs from the project's own virtualenv, made from pyproject.toml.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# bench/ is linted once it exists.
LINT_PATHS := app tests $(wildcard bench)

.PHONY: install test unit integration faults lint lint-docker format typecheck run bench lock clean

$(BIN)/ricochet: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(BIN)/ricochet  ## make the virtualenv with ricochet and the dev tools

$(VENV)/.bench: $(BIN)/ricochet
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	touch $@

test: install lint lint-docker typecheck  ## lint, type-check, then every test against the local RabbitMQ
	$(BIN)/python -m pytest $(PYTEST_ARGS)

unit: install
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

integration: install
	$(BIN)/python -m pytest tests/integration $(PYTEST_ARGS)

faults: install  ## the fault suite alone: real workers, a private broker node, a 3-node cluster
	$(BIN)/python -m pytest tests/faults $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)

format: install
	$(BIN)/ruff format $(LINT_PATHS)
	$(BIN)/ruff check --fix $(LINT_PATHS)

typecheck: install
	$(BIN)/mypy

lint-docker: install  ## hadolint on the Dockerfile
	$(BIN)/hadolint --no-color Dockerfile

# The image installs requirements.lock with hashes (scripts/install-locked.sh); regenerate it after
# changing dependencies in pyproject.toml (add PIP_COMPILE_ARGS=--upgrade to take newer releases).
lock: install  ## pin every runtime dependency, with hashes, in requirements.lock
	$(BIN)/pip-compile --quiet --generate-hashes --allow-unsafe --build-deps-for=wheel \
		--strip-extras --no-emit-index-url --no-emit-find-links $(PIP_COMPILE_ARGS) \
		--output-file=requirements.lock pyproject.toml

# A benchmark, not a test: 7-16 minutes on the local broker (BENCH_ARGS=--quick: three minutes).
BENCH_ARGS ?=
bench: $(VENV)/.bench  ## throughput, retry delays and memory against a raw aio-pika loop (bench/)
	$(BIN)/python -m bench $(BENCH_ARGS)

run: install  ## a worker against the local broker (settings from the environment)
	$(BIN)/ricochet worker

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
