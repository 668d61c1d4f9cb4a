"""Fixtures of the fault suite: a private broker node, a connection to it, one FaultRun a test."""

import os
import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractConnection
from hypothesis import settings
from ricochet.broker.connection import close_quietly

from tests.broker import BROKER, Broker
from tests.faults.harness import TALLIES, FaultRun, QueuesRun, fault_settings
from tests.faults.node import Node, node_base
from tests.support import delete_topology

# A node for each pytest-xdist worker (gw0 on 5682, gw1 on 5683, ...): below the cluster's 5691.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
NODE_PORT = 5682 + int(WORKER.removeprefix("gw"))

# CI replays the same fuzzed examples every run; on a developer's machine they are new each time.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


# A fault row's own bound, where it has none: its processes share two cores with the other
# pytest processes' tests, and a row of thousands of jobs took over two minutes beside them.
FAULT_TIMEOUT_S = 300


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/faults/" in str(item.path):
            item.add_marker(pytest.mark.faults)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(FAULT_TIMEOUT_S))


@pytest.fixture(autouse=True, scope="session")
def _vhost(own_vhost: None) -> None:
    """A fault row that talks to BROKER does so in the session's own vhost."""


@pytest.fixture(scope="session")
def node_dir() -> Iterator[Path]:
    path = node_base()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def node(node_dir: Path) -> Iterator[Node]:
    """A RabbitMQ node of the fault suite's own, so no fault reaches the shared broker."""
    private = Node(f"ricochet-faults-{WORKER}", NODE_PORT, node_dir).start()
    yield private
    private.stop()


@pytest.fixture(scope="session")
def fault_broker(request: pytest.FixtureRequest) -> Broker:
    """Where worker faults run: the broker under test when it exists for this run alone (a broker
    of the matrix), else a private node, so that no fault reaches a shared broker."""
    if BROKER.private:
        return BROKER
    node: Node = request.getfixturevalue("node")
    return node.broker


@pytest.fixture
def restart_ctl(fault_broker: Broker) -> Callable[..., str]:
    """The rabbitmqctl of the broker a row stops and starts (stop_app, start_app), the one its
    runs connect to: the fault suite's private node, or a broker of the matrix that
    RICOCHET_TEST_BROKER_ALONE=1 says no other run uses. On a broker others may be using (CI's
    matrix runs the newest releases' lane beside it), the row is skipped."""
    if BROKER.private and not BROKER.alone:
        pytest.skip(
            "restarts its broker: runs on the fault suite's private node (make faults), or on a "
            "broker of the matrix that RICOCHET_TEST_BROKER_ALONE=1 says no other run uses"
        )
    return fault_broker.rabbitmqctl


@pytest.fixture
async def connection(fault_broker: Broker, queue_name: str) -> AsyncIterator[AbstractConnection]:
    """The test's own connection to the faults' broker; the test's queues are deleted after."""
    url = fault_broker.amqp_url
    conn = await aio_pika.connect(url, client_properties={"connection_name": "tests"})
    yield conn
    # A fault may have closed the test's connection: clean up on a fresh one.
    async with await aio_pika.connect(url) as cleanup:
        await delete_topology(cleanup, queue_name)
    await close_quietly(conn)


@pytest.fixture
async def fault_run(
    fault_broker: Broker, connection: AbstractConnection, queue_name: str, tmp_path: Path
) -> AsyncIterator[Callable[..., FaultRun]]:
    """`fault_run(name, **settings)`: a run on the test's queue; its workers are killed after,
    and the connection a run opened again after a fault is closed (left open, aio-pika would
    close it once the test's loop had closed)."""
    runs: list[FaultRun] = []

    def make(name: str, **overrides: Any) -> FaultRun:
        run = FaultRun(
            name,
            connection,
            fault_settings(queue_name, fault_broker.amqp_url, **overrides),
            tmp_path,
        )
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.kill_workers()
        if run.connection is not connection:
            await close_quietly(run.connection)


@pytest.fixture
async def fault_queues(
    fault_broker: Broker, connection: AbstractConnection, queue_name: str, tmp_path: Path
) -> AsyncIterator[Callable[..., QueuesRun]]:
    """`fault_queues(name, {suffix: prefetch}, **settings)`: a QueuesRun with a FaultRun for
    each queue, named after the test's queue and the suffix; its worker is killed and every
    queue's topology deleted after."""
    made: list[QueuesRun] = []

    def make(name: str, prefetches: dict[str, int], **overrides: Any) -> QueuesRun:
        runs = []
        for suffix, prefetch in prefetches.items():
            queue = f"{queue_name}-{suffix}"
            (tmp_path / queue).mkdir()
            settings = fault_settings(queue, fault_broker.amqp_url, prefetch=prefetch, **overrides)
            runs.append(FaultRun(f"{name}: {suffix}", connection, settings, tmp_path / queue))
        made.append(QueuesRun(tmp_path, runs))
        return made[-1]

    yield make
    for queues in made:
        queues.runs[0].kill_workers()
    async with await aio_pika.connect(fault_broker.amqp_url) as cleanup:
        for queues in made:
            for run in queues.runs:
                await delete_topology(cleanup, run.settings.queue)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not TALLIES:
        return
    write = terminalreporter.write_line
    width = max(44, *(len(t.fault) for t in TALLIES))  # long fault names keep the columns aligned
    terminalreporter.section("fault suite: every job accounted for")
    write(
        f"{'fault':<{width}} {'jobs':>6} {'done':>6} {'failed':>6} {'lost':>5} {'dups':>5} "
        f"{'cancelled':>9}"
    )
    for t in TALLIES:
        write(
            f"{t.fault:<{width}} {t.published:>6} {t.completed:>6} {t.failed:>6} "
            f"{t.lost:>5} {t.duplicates:>5} {t.cancelled:>9}"
        )
    write(
        f"{'total':<{width}} {sum(t.published for t in TALLIES):>6} "
        f"{sum(t.completed for t in TALLIES):>6} {sum(t.failed for t in TALLIES):>6} "
        f"{sum(t.lost for t in TALLIES):>5} {sum(t.duplicates for t in TALLIES):>5} "
        f"{sum(t.cancelled for t in TALLIES):>9}"
    )
