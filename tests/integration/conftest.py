"""The integration suite runs in a vhost of its test process's own (tests/broker.py)."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def _vhost(own_vhost: None) -> None:
    """Every integration test talks to BROKER, in the session's own vhost."""
