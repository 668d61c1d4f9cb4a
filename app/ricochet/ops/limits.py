"""Which of a queue's arguments and policies RabbitMQ applies, and so the delivery limit a queue
has: what doctor's checks report, and what a scan of the failed queue heeds. Both read the
management API's object for a queue (type, arguments, policies, effective definition), its
policies first brought up to date from the policy definitions themselves (with_current_policies,
the one read of the API here; the rest is pure): the object's own come from queue statistics,
which show a policy only one stats interval after it is set.

Of the policies of a vhost, the broker applies to a queue the one of highest priority whose
apply-to covers the queue's type and whose pattern matches somewhere in its name; the same for
operator policies; and merges the two definitions key by key, the lower value for a limit (as
for arguments below), the operator policy's for the rest.

A policy key the queue's own arguments do not set always applies. When both set it, RabbitMQ
takes the lower of the limits (the higher delivery limit when one is negative, meaning none, on
RabbitMQ 4), the quorum queue's policy for overflow, and the argument for the rest
(dead-lettering, queue mode).
"""

import re
from dataclasses import dataclass
from typing import Any, Literal

from ricochet.broker.management import Api
from ricochet.broker.plan import DELIVERY_LIMIT
from ricochet.errors import ManagementUnavailable
from ricochet.log import get_logger

log = get_logger("ricochet.limits")

JSON = dict[str, Any]

LOWER_WINS = frozenset(
    {"message-ttl", "expires", "max-length", "max-length-bytes", "delivery-limit"}
)
# The API's field naming each kind of policy, what to call it, and the command that clears one.
POLICY_KINDS = (
    ("policy", "policy", "clear_policy"),
    ("operator_policy", "operator policy", "clear_operator_policy"),
)
# What RabbitMQ 4 gives a quorum queue declared without x-delivery-limit.
DEFAULT_DELIVERY_LIMIT = 20
# A limit no job reaches: it would have to be looked at a million times. RabbitMQ 3 has no value
# that means none, and under any limit its quorum queue hands a returned message back at its
# head, where it expires on time (without one, 3.x appends it behind the rest).
UNREACHED_DELIVERY_LIMIT = 1_000_000


# What a policy's apply-to says when it covers a queue of each type, besides "all" and "queues".
APPLY_TO = {"classic": "classic_queues", "quorum": "quorum_queues", "stream": "streams"}


def current_policies(
    queue: JSON, policies: list[JSON], operator_policies: list[JSON]
) -> JSON | None:
    """The queue's object with its policy, operator_policy and effective_policy_definition as
    the vhost's policy definitions give them now; None when a pattern that could apply is not
    one Python reads (then only the statistics can say)."""
    try:
        policy, operator_policy = _applied(queue, policies), _applied(queue, operator_policies)
    except re.error:
        return None
    definition = dict(policy[1]) if policy else {}
    for key, value in (operator_policy[1] if operator_policy else {}).items():
        mine = definition.get(key)
        lower = key in LOWER_WINS and isinstance(mine, int) and isinstance(value, int)
        definition[key] = min(mine, value) if lower else value
    return queue | {
        "policy": policy[0] if policy else None,
        "operator_policy": operator_policy[0] if operator_policy else None,
        "effective_policy_definition": definition,
    }


# What a queue whose policies cannot be read from their definitions goes by.
STATISTICS = (
    "policies read from the queues' statistics, which show a policy set in the last stats "
    "interval only after it"
)


async def with_current_policies(api: Api, vhost: str, queues: dict[str, JSON]) -> dict[str, JSON]:
    """The queues' objects (by name) with their policies as the vhost's policy definitions give
    them now (current_policies), the definitions read once for all of them. Where they cannot be
    read, or a pattern that could apply is not one Python reads, an object keeps the policies of
    its statistics: said in one warning for all the queues concerned."""
    if not queues:
        return queues
    try:
        policies = await api.policies(vhost)
    except ManagementUnavailable as error:
        log.warning(
            "policy definitions unreadable: the management user needs a tag that reads them "
            f"(policymaker, administrator); {STATISTICS}",
            queues=list(queues),
            error=str(error),
        )
        return queues
    current = {name: current_policies(queue, *policies) for name, queue in queues.items()}
    if unread := [name for name, found in current.items() if found is None]:
        log.warning(f"a policy pattern is not one Python reads; {STATISTICS}", queues=unread)
    return {name: current[name] or queue for name, queue in queues.items()}


def _applied(queue: JSON, policies: list[JSON]) -> tuple[str, JSON] | None:
    """(name, definition) of the policy the broker applies to the queue, if any; re.error for a
    pattern Python cannot read. Of equal priorities the first by name, as the broker's store
    lists them."""
    covers = {"all", "queues", APPLY_TO.get(str(queue.get("type")))}
    best: tuple[int, str, JSON] | None = None
    for policy in sorted(policies, key=lambda p: str(p.get("name"))):
        priority, definition = policy.get("priority", 0), policy.get("definition")
        if (
            policy.get("apply-to", "all") in covers
            and isinstance(priority, int)
            and isinstance(definition, dict)
            and (best is None or priority > best[0])
            and re.search(str(policy.get("pattern")), str(queue.get("name"))) is not None
        ):
            best = (priority, str(policy.get("name")), definition)
    return None if best is None else best[1:]


def reached(limit: int, rabbitmq_4: bool) -> bool:
    """Whether a delivery limit can drop or send on a job: not a negative one on RabbitMQ 4
    (none; 3.x reads it as 0), nor one of UNREACHED_DELIVERY_LIMIT or more."""
    return not ((limit < 0 and rabbitmq_4) or limit >= UNREACHED_DELIVERY_LIMIT)


def takes_effect(key: str, value: Any, arguments: JSON, queue_type: str) -> bool:
    """Whether a policy's key overrides (or adds to) what the queue was declared with."""
    argument = arguments.get(f"x-{key}")
    if argument is None:
        return True
    if not (isinstance(value, int) and isinstance(argument, int) and key in LOWER_WINS):
        return key == "overflow" and queue_type == "quorum" and value != argument
    if key == "delivery-limit" and min(value, argument) < 0:
        # RabbitMQ 4 reads a negative limit as none, and then keeps the higher of the two.
        return value > argument
    return value < argument


def applied_policies(queue: JSON) -> list[tuple[str, str, str]]:
    """(name, what to call it, the command that clears it) of each policy applied to a queue."""
    return [(queue[field], label, cmd) for field, label, cmd in POLICY_KINDS if queue.get(field)]


def policy_names(applied: list[tuple[str, str, str]]) -> str:
    """The policies, in words: "policy 'ops' and operator policy 'limits'"."""
    return " and ".join(f"{label} {name!r}" for name, label, _ in applied)


@dataclass(frozen=True)
class DeliveryLimit:
    """The times a quorum queue hands a message back before it drops it, and what sets that: a
    policy, the queue's own argument, or RabbitMQ 4's default (source says so in words)."""

    value: int
    set_by: Literal["policy", "argument", "default"]
    source: str


def delivery_limit(queue: JSON, version: tuple[int, ...] | None) -> DeliveryLimit | None:
    """The delivery limit in effect on a queue; None when there is none: a classic queue,
    RabbitMQ 3 without one, a negative limit on RabbitMQ 4 (an unknown version counts as 4,
    whose default is the stricter), or a limit no job reaches."""
    if queue.get("type") != "quorum":
        return None
    arguments = queue.get("arguments") or {}
    key = DELIVERY_LIMIT.removeprefix("x-")
    definition = queue.get("effective_policy_definition")
    policy = definition.get(key) if isinstance(definition, dict) else None
    argument = arguments.get(DELIVERY_LIMIT)
    rabbitmq_4 = version is None or version >= (4, 0)
    if isinstance(policy, int) and takes_effect(key, policy, arguments, "quorum"):
        found = DeliveryLimit(policy, "policy", policy_names(applied_policies(queue)) or "a policy")
    elif isinstance(argument, int):
        found = DeliveryLimit(argument, "argument", f"its {DELIVERY_LIMIT} argument")
    elif rabbitmq_4:
        default = f"RabbitMQ 4's default: it was declared without {DELIVERY_LIMIT}"
        found = DeliveryLimit(DEFAULT_DELIVERY_LIMIT, "default", default)
    else:
        return None
    return found if reached(found.value, rabbitmq_4) else None
