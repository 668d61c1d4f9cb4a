"""The stack, up once for the module: built from the Dockerfile, started with the README's
`docker compose up`, and removed afterwards with its volumes and network."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.compose.stack import BUILD_TIMEOUT_S, Published, Stack, payload_of, quickstart_commands


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = Stack.create(Path(tmp_path_factory.mktemp("compose")))
    # Leftovers of a run that was killed must not be what this one tests.
    stack.remove()
    stack.compose("build", timeout_s=BUILD_TIMEOUT_S)
    try:
        stack.start()
        yield stack
    finally:
        stack.remove()


@pytest.fixture(scope="module")
def quickstart(stack: Stack) -> dict[str, Published]:
    """The Quickstart's commands run as printed: each publish prints its job's message id; the
    jobs by what the example handler does with them (succeeded, retried, failed)."""
    jobs: dict[str, Published] = {}
    for command in quickstart_commands():
        out = stack.run(command)
        if " ricochet publish " in command:
            job = Published(command, out.strip(), payload_of(command))
            assert job.message_id, f"`{command}` printed no message id"
            jobs[job.expected] = job
    assert set(jobs) == {"succeeded", "retried", "failed"}, (
        "the Quickstart must publish a job that succeeds, one that is retried and one that fails"
    )
    return jobs
