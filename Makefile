# Everything runs from the project's own virtualenv, made from pyproject.toml.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# bench/ is linted once it exists.
LINT_PATHS := app tests $(wildcard bench)

.PHONY: install test unit integration faults lint format typecheck run bench clean

$(BIN)/ricochet: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(BIN)/ricochet  ## make the virtualenv with ricochet and the dev tools

test: install lint typecheck  ## lint, type-check, then every test against the local RabbitMQ
	$(BIN)/python -m pytest $(PYTEST_ARGS)

unit: install
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

integration: install
	$(BIN)/python -m pytest tests/integration $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)

format: install
	$(BIN)/ruff format $(LINT_PATHS)
	$(BIN)/ruff check --fix $(LINT_PATHS)

typecheck: install
	$(BIN)/mypy

run: install  ## a worker against the local broker (settings from the environment)
	$(BIN)/ricochet worker

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
