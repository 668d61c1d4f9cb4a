# Everything runs from the project's own virtualenv, made from pyproject.toml.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# The suites run over JOBS pytest-xdist processes (the tests wait on brokers far more than they
# compute), each process in a vhost of its own (tests/broker.py) and each fault process with a
# private node of its own; a test file stays on one process (its module fixtures are set up once).
# The timing rows (-m timing) run after the rest, by themselves (scripts/pytest-phases.sh).
# Two by default: on two cores beside the matrix, make test took 19.5 minutes in two processes
# against about 60 in one; three made tests that wait on a command's start miss their windows
# (docs/developing.md).
JOBS ?= 2
# bench/ is linted once it exists.
LINT_PATHS := app tests scripts docs/examples docs/hooks $(wildcard bench)

.PHONY: install tools dashboard-png docs docs-build test test-brokers test-compose test-newest unit integration faults lint lint-docker format typecheck run bench lock clean

$(BIN)/ricochet: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,docs]'
	touch $@

install: $(BIN)/ricochet  ## make the virtualenv with ricochet and the dev tools

$(VENV)/.bench: $(BIN)/ricochet
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	touch $@

# Debian's prometheus: promtool checks and tests the alert rules, and integration tests see each
# rule fire in the server, scraping real workers and monitors. The documentation's enqueueing examples
# run a Node.js producer (npm installs its amqplib, tests/node) and Debian's amqp-tools'
# amqp-publish. Debian's chromium: the console's browser test drives it headless (never a
# browser build of Playwright's own). scripts/tools.sh installs each only when its command is
# missing.
tools:  ## the Debian packages the tests use besides the broker (prometheus, npm, amqp-tools, chromium)
	scripts/tools.sh promtool prometheus npm npm amqp-publish amqp-tools chromium chromium

# Without a broker on the tests' URL, scripts/test-broker.sh runs them on the compose stack's
# RabbitMQ (Docker), leaving out (and naming) the fault tests that need a local rabbitmq-server.
test: install tools lint lint-docker typecheck docs-build  ## lint, type-check, build the docs, then every test against the local RabbitMQ
	scripts/test-broker.sh scripts/pytest-phases.sh $(JOBS) $(BIN)/python $(PYTEST_ARGS)

# The broker matrix: scripts/brokers.sh builds (once) and starts RabbitMQ 4.0 and the newest 4.x
# in chroots beside the machine's own; scripts/test-matrix.sh runs the integration tests and the
# fault tests that need one node on each at the same time, and one line per broker names its
# version, the result and the time it took.
# Only the integration tests whose outcome the broker decides (its routing, TTLs, dead-letters,
# redeliveries, streams, delivery limits, frame and message sizes, the topology it accepts) run
# on each; those of ricochet's own pages, logs, metrics, alerts, processes, clients' threads and
# examples do not change with the broker: make test runs them once.
# A fault row that restarts its broker runs only where the fault suite starts a node of its own
# (the local lane); on the matrix's other brokers pytest reports it as skipped, with the reason.
BROKERS ?= local trixie sid
# The fault rows whose outcome the broker decides (the delays, delivery limits, the failed queue,
# the shared levels, the lead of the schedules, the waiting view) run on each; those of the
# worker's own processes, parsing and queues (process, fuzz, queues, retry-shape faults) run in
# the local lane only: on the matrix they only added load to two cores already shared by four
# suites, and timing rows missed their waits.
BROKER_DECIDES := brokers cancel_running cancel_store client declared_topology delivery doctor \
	failed_queue hostile_deliveries legacy_levels lifecycle queues redelivery relaunch replay \
	resubscribe retry_ladder retry_shape schedules settling shared_waiting stock_replay wait waiting \
	orphans orphans_client migrate journal priority keys rate_limits
BROKER_TESTS ?= $(BROKER_DECIDES:%=tests/integration/test_%.py) \
	tests/faults/test_failed_queue_faults.py tests/faults/test_wait_faults.py \
	tests/faults/test_shared_waiting_faults.py tests/faults/test_schedule_faults.py \
	tests/faults/test_waiting_faults.py tests/faults/test_journal_faults.py \
	tests/faults/test_index_faults.py tests/faults/test_keys_faults.py \
	tests/faults/test_rate_limits_faults.py
# Each broker's suite runs over MATRIX_JOBS processes: the brokers' suites run at the same time.
# Two: in one, CI's matrix (two brokers beside make test) was its longest lane, 27-29 minutes;
# in two, 18.5, and make test 25.7 beside it.
MATRIX_JOBS ?= 2
test-brokers: install tools  ## the integration and process-fault tests on every RabbitMQ of the matrix
	scripts/brokers.sh start $(BROKERS)
	scripts/test-matrix.sh "$(BROKERS)" scripts/pytest-phases.sh $(MATRIX_JOBS) $(BIN)/python \
		$(BROKER_TESTS) $(PYTEST_ARGS)

# The Quickstart (docs/getting-started.md) on a real Docker engine (tests/compose): scripts/engine.sh installs
# Debian's docker.io and Compose v2 when missing, starts an engine of its own (stopped after),
# and builds the base images the stack cannot pull here once (debootstrap, about 2 minutes).
test-compose: install  ## docker compose up and the Quickstart on a Docker engine of its own
	flock /tmp/ricochet-compose.lock scripts/engine.sh run $(BIN)/python -m pytest tests/compose $(PYTEST_ARGS)

# The documentation site (mkdocs.yml): --strict fails on a link to a page or heading that does not
# exist. Built into a directory of its own that is removed after; make docs serves it instead.
# Material's notice of its end of life (May 2027) is not a warning of the build: kept out of it.
DOCS_ADDR ?= 127.0.0.1:8001
docs-build: install  ## build the documentation site, strictly
	site=$$(mktemp -d) && trap 'rm -rf "$$site"' EXIT && \
		NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir "$$site"

docs: install  ## serve the documentation site on DOCS_ADDR, rebuilt as its files change
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict --dev-addr $(DOCS_ADDR)

# The newest releases of aio-pika, aiormq, pamqp, structlog, pydantic, pydantic-settings and
# tenacity, installed over the lock on the newest Python Debian ships (trixie's 3.13, in the
# trixie broker's chroot, against that broker): the unit suite, then a smoke of the integration
# suite (scripts/test-newest.sh names it). A failure names the packages newer than the lock.
test-newest:  ## the unit tests and an integration smoke on Python 3.13 with the newest releases of ricochet's libraries
	scripts/test-newest.sh $(PYTEST_ARGS)

unit: install tools
	scripts/pytest-phases.sh $(JOBS) $(BIN)/python tests/unit $(PYTEST_ARGS)

integration: install tools
	scripts/pytest-phases.sh $(JOBS) $(BIN)/python tests/integration $(PYTEST_ARGS)

faults: install  ## the fault suite alone: real workers, private broker nodes, a 3-node cluster
	scripts/pytest-phases.sh $(JOBS) $(BIN)/python tests/faults $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/lint-imports  # the layers and the AMQP adapter's contracts, in pyproject.toml

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

# A benchmark, not a test: 20-25 minutes on the local broker (BENCH_ARGS=--quick: three minutes).
# The local broker is started with the plugins the jitter rows need (the random exchange), as the
# tests start it; a broker named by RICOCHET_BENCH_AMQP_URL is taken as it is.
BENCH_ARGS ?=
bench: $(VENV)/.bench  ## throughput, retry delays and memory against a raw aio-pika loop (bench/)
	$(if $(RICOCHET_BENCH_AMQP_URL),,scripts/brokers.sh start local)
	$(BIN)/python -m bench $(BENCH_ARGS)

# The picture of docs/observability.md: a worker, a monitor and Prometheus on the local broker for about seven
# minutes of example jobs, then each dashboard panel drawn from Prometheus and shot with Chromium.
dashboard-png: install  ## redraw docs/dashboard.png from a real run (needs chromium)
	scripts/tools.sh promtool prometheus chromium chromium
	PYTHONPATH=. $(BIN)/python scripts/dashboard.py

run: install  ## a worker against the local broker (settings from the environment)
	$(BIN)/ricochet worker

clean:
	rm -rf $(VENV) .venv-newest .pytest_cache .pytest_cache-newest .mypy_cache .ruff_cache
