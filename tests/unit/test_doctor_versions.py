"""The broker version check: supported versions and what each implies (SPEC section 9)."""

import pytest
from ricochet.broker.amqp import parse_version
from ricochet.ops.versions import version_check


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("3.10.8", (3, 10, 8)), ("4.1", (4, 1)), ("4.0.0-rc.1", (4, 0, 0)), ("", None)],
)
def test_parse_version(text: str, parsed: tuple[int, ...] | None) -> None:
    """Versions as brokers report them, release candidates included."""
    assert parse_version(text) == parsed


@pytest.mark.parametrize(
    ("version", "queue_type", "status", "says"),
    [
        ("3.9.29", "quorum", "fail", "ricochet needs 3.10 or later"),
        ("3.10.8", "quorum", "warn", "upgrade to 3.10.20 or later"),
        ("3.10.8", "classic", "ok", "RabbitMQ 3.10.8: supported"),
        ("3.10.20", "quorum", "ok", "RabbitMQ 3.10.20: supported"),
        ("3.13.7", "quorum", "ok", "supported"),
        ("4.0.5", "quorum", "ok", "a delivery limit of 20, which ricochet lifts"),
        ("4.0.5", "classic", "ok", "RabbitMQ 4.0.5: supported"),
        ("4.3.0", "quorum", "ok", "needs rabbitmqadmin v2 (Debian: rabbitmqadmin-ng)"),
        ("4.3.0", "classic", "ok", "no consumer timeout on classic queues"),
    ],
)
def test_version_check(version: str, queue_type: str, status: str, says: str) -> None:
    """Before 3.10 fails; 3.10 before .20 warns for quorum queues (stranded dead-letters); 4.0
    brings the quorum delivery limit, 4.3 drops /cli/rabbitmqadmin and the classic timeout."""
    found = version_check({"rabbitmq_version": version}, queue_type)
    assert (found.check, found.status) == ("broker version", status)
    assert says in found.detail


def test_version_from_product_version_or_none() -> None:
    """A broker that reports only product_version is read from it; none at all warns."""
    assert "RabbitMQ 4.1.0" in version_check({"product_version": "4.1.0"}, "quorum").detail
    assert version_check({}, "quorum").status == "warn"
    assert version_check({"rabbitmq_version": "4.1.0-rc.1"}, "quorum").status == "ok"
