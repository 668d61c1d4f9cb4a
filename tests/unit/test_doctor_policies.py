"""Which policy keys take effect over ricochet's queue arguments, and how doctor rates them."""

from typing import Any

import pytest
from ricochet.broker.plan import plan
from ricochet.ops.policies import policy_check, takes_effect

from tests.unit.recorded import edited


@pytest.mark.parametrize(
    ("key", "value", "arguments", "queue_type", "effect"),
    [
        ("message-ttl", 1000, {}, "quorum", True),  # nothing declared: the policy applies
        ("message-ttl", 1000, {"x-message-ttl": 30000}, "quorum", True),  # the lower wins
        ("message-ttl", 60000, {"x-message-ttl": 30000}, "quorum", False),
        ("max-length", 100, {"x-max-length": 10000}, "classic", True),
        ("max-length", 20000, {"x-max-length": 10000}, "classic", False),
        ("overflow", "drop-head", {"x-overflow": "reject-publish"}, "quorum", True),
        ("overflow", "drop-head", {"x-overflow": "reject-publish"}, "classic", False),
        ("overflow", "reject-publish", {"x-overflow": "reject-publish"}, "quorum", False),
        ("dead-letter-exchange", "x", {"x-dead-letter-exchange": "jobs.dlx"}, "quorum", False),
        ("dead-letter-exchange", "x", {}, "quorum", True),
        ("queue-mode", "lazy", {}, "classic", True),
        ("delivery-limit", 20, {"x-delivery-limit": -1}, "quorum", True),  # 4.0: the higher
        ("delivery-limit", -1, {"x-delivery-limit": -1}, "quorum", False),
        ("delivery-limit", 5, {"x-delivery-limit": 10}, "quorum", True),
    ],
)
def test_takes_effect(
    key: str, value: Any, arguments: dict[str, Any], queue_type: str, effect: bool
) -> None:
    """Limits: the lower of policy and argument; quorum overflow: the policy; the rest: the
    argument when the queue was declared with one."""
    assert takes_effect(key, value, arguments, queue_type) is effect


@pytest.mark.parametrize(
    ("queue", "definition", "status", "says"),
    [
        ("jobs.retry.1", {"message-ttl": 60000}, "ok", "changes nothing ricochet declares"),
        ("jobs.retry.1", {"message-ttl": 1000}, "fail", "message-ttl=1000 (messages older"),
        ("jobs", {"overflow": "drop-head"}, "fail", "no longer at-least-once"),
        ("jobs", {"queue-leader-locator": "balanced"}, "warn", "not a setting ricochet relies"),
        ("jobs.failed", {"delivery-limit": 20}, "fail", "handed back this many times"),
        ("jobs.retry.1", {"delivery-limit": 10**9}, "ok", "no delivery limit a job reaches"),
        ("jobs.retry.1", {"delivery-limit": -1}, "fail", "handed back this many times"),  # 3: 0
    ],
)
def test_policy_check(queue: str, definition: dict[str, Any], status: str, says: str) -> None:
    """A policy that changes nothing passes; one that can drop, expire or reroute jobs fails;
    any other key of a policy on ricochet's queues warns."""
    settings, state = edited(
        "healthy_3.10", queue, policy="ops", effective_policy_definition=definition
    )
    found = policy_check(plan(settings), settings.queue_type, (3, 10, 8), state)
    assert found.status == status
    assert f"{queue}: policy 'ops'" in found.detail
    assert says in found.detail


def test_no_policy_applies() -> None:
    """Without a policy (the API answers null, and an empty definition) the check passes."""
    settings, state = edited("healthy_3.10", "jobs", policy=None, effective_policy_definition=[])
    found = policy_check(plan(settings), settings.queue_type, (3, 10, 8), state)
    assert (found.status, found.detail) == ("ok", "no policy applies to ricochet's queues")
