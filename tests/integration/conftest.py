"""The integration suite runs in a vhost of its test process's own (tests/broker.py)."""

from collections.abc import AsyncIterator

import pytest

from tests.broker import BROKER


@pytest.fixture(autouse=True, scope="session")
def _vhost(own_vhost: None) -> None:
    """Every integration test talks to BROKER, in the session's own vhost."""


@pytest.fixture
async def vhost_url() -> AsyncIterator[str]:
    """A scratch vhost of the test's own (Broker.scratch_vhost): its AMQP URL."""
    async with BROKER.scratch_vhost() as url:
        yield url
