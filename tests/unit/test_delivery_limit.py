"""The delivery limit RabbitMQ applies to a queue, from the management API's object for it
(pure): what a scan of the failed queue heeds; and the policies of queues' objects brought up to
date from the vhost's definitions, as a scan and doctor read them."""

from typing import Any, cast

import aiohttp
import pytest
from ricochet.broker.management import Api
from ricochet.errors import ManagementUnavailable
from ricochet.ops.limits import (
    DeliveryLimit,
    current_policies,
    delivery_limit,
    with_current_policies,
)
from structlog.testing import capture_logs

V3, V40, V43 = (3, 10, 8), (4, 0, 5), (4, 3, 6)


def queue(
    arguments: dict[str, Any] | None = None, policy: int | None = None, kind: str = "quorum"
) -> dict[str, Any]:
    """The management API's object for a queue, with a policy 'ops' setting delivery-limit."""
    found: dict[str, Any] = {"type": kind, "arguments": {"x-queue-type": kind, **(arguments or {})}}
    if policy is not None:
        found |= {"policy": "ops", "effective_policy_definition": {"delivery-limit": policy}}
    return found


@pytest.mark.parametrize(
    ("found", "version", "limit"),
    [
        (queue(), V3, None),  # RabbitMQ 3 has no default
        (queue(), V40, DeliveryLimit(20, "default", "x")),  # RabbitMQ 4 has 20
        (queue(), None, DeliveryLimit(20, "default", "x")),  # unknown: the stricter, 4's
        (queue({"x-delivery-limit": -1}), V40, None),  # as ricochet declares it on 4
        (queue({"x-delivery-limit": -1}), V43, None),
        (queue({"x-delivery-limit": 5}), V3, DeliveryLimit(5, "argument", "x")),
        (queue(policy=3), V3, DeliveryLimit(3, "policy", "x")),
        (queue({"x-delivery-limit": -1}, policy=3), V40, DeliveryLimit(3, "policy", "x")),
        (queue(policy=-1), V43, None),  # a policy that lifts 4's default
        (queue({"x-delivery-limit": 5}, policy=10), V43, DeliveryLimit(5, "argument", "x")),
        (queue({"x-delivery-limit": 5}, policy=2), V43, DeliveryLimit(2, "policy", "x")),
        (queue(policy=3, kind="classic"), V3, None),  # classic queues have no limit
        (queue(kind="classic"), V43, None),
        (queue(policy=1_000_000_000), V3, None),  # no job reaches it: none, on 3 too
        (queue({"x-delivery-limit": 999_999}), V3, DeliveryLimit(999_999, "argument", "x")),
    ],
)
def test_delivery_limit(
    found: dict[str, Any], version: tuple[int, ...] | None, limit: DeliveryLimit | None
) -> None:
    """A policy's limit where it takes effect over the argument (the lower; the higher when one
    is negative on 4), else the argument, else RabbitMQ 4's default of 20; none on a classic
    queue, on 3 without one, negative on 4, or a million and more."""
    got = delivery_limit(found, version)
    assert (got and (got.value, got.set_by)) == (limit and (limit.value, limit.set_by))


def test_delivery_limit_names_what_sets_it() -> None:
    """The limit says which policy sets it, or that it is the queue's own argument, or 4's
    default for a queue declared without one."""
    assert delivery_limit(queue(policy=3), V3) == DeliveryLimit(3, "policy", "policy 'ops'")
    found = delivery_limit(queue({"x-delivery-limit": 7}), V40)
    assert found is not None
    assert found.source == "its x-delivery-limit argument"
    default = delivery_limit(queue(), V40)
    assert default is not None
    assert "declared without x-delivery-limit" in default.source


def policy(
    name: str, pattern: str, limit: int, priority: int = 0, apply_to: str = "all"
) -> dict[str, Any]:
    """A policy as GET /api/policies/{vhost} lists it, setting delivery-limit."""
    return {
        "vhost": "v",
        "name": name,
        "pattern": pattern,
        "apply-to": apply_to,
        "definition": {"delivery-limit": limit},
        "priority": priority,
    }


FAILED = "jobs.failed"
# (policies, operator policies, the policy and operator policy applied, the delivery-limit set)
POLICIES = [
    ([], [], None, None, None),
    ([policy("a", r"^jobs\.failed$", 3)], [], "a", None, 3),
    # The pattern matches anywhere in the name, as re:run does.
    ([policy("a", r"failed", 3)], [], "a", None, 3),
    ([policy("a", r"^failed", 3)], [], None, None, None),
    ([policy("a", r"^jobs$", 3)], [], None, None, None),
    # The highest priority wins, whatever the limit; equal priorities go by name.
    ([policy("a", "jobs", 3, 1), policy("b", "failed", 7, 2)], [], "b", None, 7),
    ([policy("b", "jobs", 3, 5), policy("a", "failed", 7, 1)], [], "b", None, 3),
    ([policy("b", "jobs", 3), policy("a", "failed", 7)], [], "a", None, 7),
    # apply-to: the queue's type, queues and all cover a quorum queue; the others do not.
    ([policy("a", "jobs", 3, apply_to="quorum_queues")], [], "a", None, 3),
    ([policy("a", "jobs", 3, apply_to="queues")], [], "a", None, 3),
    ([policy("a", "jobs", 3, apply_to="classic_queues")], [], None, None, None),
    ([policy("a", "jobs", 3, apply_to="exchanges")], [], None, None, None),
    ([policy("a", "jobs", 3, 9, "exchanges"), policy("b", "jobs", 5)], [], "b", None, 5),
    # An operator policy applies beside the policy; of a limit both set, the lower.
    ([], [policy("op", "jobs", 4)], None, "op", 4),
    ([policy("a", "jobs", 3)], [policy("op", "jobs", 4)], "a", "op", 3),
    ([policy("a", "jobs", 30)], [policy("op", "jobs", 4)], "a", "op", 4),
]


@pytest.mark.parametrize(("policies", "operator", "name", "op_name", "limit"), POLICIES)
def test_the_policies_a_queue_has_come_from_their_definitions(
    policies: list[dict[str, Any]],
    operator: list[dict[str, Any]],
    name: str | None,
    op_name: str | None,
    limit: int | None,
) -> None:
    """Which policy and operator policy the broker applies to Q.failed, read from the vhost's
    definitions (current) rather than the queue's statistics (a stats interval behind: here
    they still say no policy)."""
    found: dict[str, Any] = {"name": FAILED, "type": "quorum", "arguments": {}, "policy": None}
    current = current_policies(found, policies, operator)
    assert current is not None
    assert (current["policy"], current["operator_policy"]) == (name, op_name)
    assert current["effective_policy_definition"].get("delivery-limit") == limit
    assert current["arguments"] == {}


def test_a_pattern_python_cannot_read_leaves_it_to_the_statistics() -> None:
    found = {"name": FAILED, "type": "quorum", "arguments": {}}
    assert current_policies(found, [policy("a", "(?<x>jobs)", 3, 9)], []) is None


class Definitions(Api):
    """A management API that lists these policies, or (None) refuses to."""

    def __init__(self, policies: list[dict[str, Any]] | None) -> None:
        super().__init__(cast(aiohttp.ClientSession, None), "http://broker/api/")
        self._policies = policies

    async def policies(self, vhost: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        if self._policies is None:
            raise ManagementUnavailable("HTTP 401")
        return self._policies, []


def stale(name: str, kind: str = "quorum") -> dict[str, Any]:
    """A queue's object whose statistics do not show the policy set on it yet."""
    return {"name": name, "type": kind, "arguments": {}, "policy": None}


async def test_every_queue_takes_its_policies_from_the_definitions() -> None:
    queues = {name: stale(name) for name in (FAILED, "jobs")}
    with capture_logs() as logs:
        found = await with_current_policies(
            Definitions([policy("a", r"^jobs\.failed$", 3)]), "/", queues
        )
    assert {name: q["policy"] for name, q in found.items()} == {FAILED: "a", "jobs": None}
    assert found[FAILED]["effective_policy_definition"] == {"delivery-limit": 3}
    assert logs == []


async def test_unreadable_definitions_are_warned_of_once_for_every_queue() -> None:
    """A management user that may not read the definitions: each queue keeps its statistics'
    policies, and one warning names them all."""
    queues = {name: stale(name) for name in (FAILED, "jobs", "jobs.retry.1")}
    with capture_logs() as logs:
        found = await with_current_policies(Definitions(None), "/", queues)
    assert found == queues
    (warning,) = logs
    assert warning["event"].startswith("policy definitions unreadable")
    assert warning["queues"] == list(queues)


async def test_a_pattern_python_cannot_read_is_warned_of_once() -> None:
    """Only the queues such a pattern could apply to keep their statistics' policies, named in
    one warning; the others read theirs from the definitions."""
    queues = {name: stale(name, "classic") for name in ("jobs", "jobs.retry.1")}
    queues[FAILED] = stale(FAILED)
    unreadable = policy("b", "(?<x>jobs)", 5, 9, apply_to="classic_queues")
    with capture_logs() as logs:
        found = await with_current_policies(
            Definitions([unreadable, policy("a", "failed", 3)]), "/", queues
        )
    assert found["jobs"] == queues["jobs"]
    assert found[FAILED]["policy"] == "a"
    (warning,) = logs
    assert warning["queues"] == ["jobs", "jobs.retry.1"]
