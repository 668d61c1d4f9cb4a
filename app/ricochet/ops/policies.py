"""Doctor's check of the policies applied to ricochet's queues: which of their keys take effect
over what ricochet declares (ricochet/ops/limits.py), and what each does to ricochet's jobs.
"""

from typing import Any

from ricochet.broker.plan import Plan
from ricochet.ops.checks import JSON, BrokerState, Check, Status, vhost_option, worst
from ricochet.ops.limits import applied_policies, policy_names, reached
from ricochet.ops.limits import takes_effect as takes_effect  # doctor's, and its tests'

# What a key that takes effect does to ricochet's jobs. Any other key is not one ricochet relies on.
CONSEQUENCES = {
    "message-ttl": "messages older than this expire",
    "expires": "the queue is deleted after this long unused",
    "max-length": "messages beyond it are dropped or refused",
    "max-length-bytes": "messages beyond it are dropped or refused",
    "delivery-limit": "a message handed back this many times is dropped or dead-lettered",
    "overflow": "replaces reject-publish, so dead-lettering is no longer at-least-once",
    "dead-letter-exchange": "what the queue drops or rejects goes to this exchange",
    "dead-letter-routing-key": "changes the key dead-letters are routed with",
    "dead-letter-strategy": "changes how the queue dead-letters",
}


def _rating(key: str, value: Any, broker_version: tuple[int, ...] | None) -> tuple[Status, str]:
    """How a key that takes effect bears on ricochet's jobs, in words."""
    rabbitmq_4 = broker_version is not None and broker_version >= (4, 0)
    if key == "delivery-limit" and isinstance(value, int) and not reached(value, rabbitmq_4):
        return "ok", "no delivery limit a job reaches"
    if key in CONSEQUENCES:
        return "fail", CONSEQUENCES[key]
    return "warn", "not a setting ricochet relies on"


def _effects(
    queue: JSON, queue_type: str, version: tuple[int, ...] | None, vhost: str
) -> tuple[Status, str, set[str]] | None:
    """(status, what the queue's policies set, the commands that clear them), None without any."""
    applied = applied_policies(queue)
    if not applied:
        return None
    names = policy_names(applied)
    definition = queue.get("effective_policy_definition")
    # An empty definition comes as [] from some versions.
    keys = definition if isinstance(definition, dict) else {}
    rated = {
        k: _rating(k, v, version)
        for k, v in sorted(keys.items())
        # The broker weighs a policy against the arguments the queue has, whatever the plan says.
        if takes_effect(k, v, queue.get("arguments", {}), queue_type)
    }
    if not rated:
        return "ok", f"{queue['name']}: {names} changes nothing ricochet declares", set()
    sets = ", ".join(f"{k}={keys[k]} ({words})" for k, (_, words) in rated.items())
    status = worst(s for s, _ in rated.values())
    clears = {f"`rabbitmqctl {cmd}{vhost} {name}`" for name, _, cmd in applied}
    return status, f"{queue['name']}: {names} sets {sets}", clears if status != "ok" else set()


def policy_check(
    plan: Plan, queue_type: str, version: tuple[int, ...] | None, state: BrokerState
) -> Check:
    """The policies that apply to ricochet's queues, and what they override."""
    vhost = vhost_option(state)
    found = [
        effect
        for spec in [*plan.queues, *plan.tiers]
        if (queue := state.queues.get(spec.name)) is not None
        and (effect := _effects(queue, queue_type, version, vhost)) is not None
    ]
    if not found:
        return Check("policies", "ok", "no policy applies to ricochet's queues")
    clears = sorted({c for _, _, commands in found for c in commands})
    fix = (
        [f"narrow the pattern so it skips these queues, or clear it: {', '.join(clears)}"]
        if clears
        else []
    )
    return Check(
        "policies", worst(s for s, _, _ in found), "; ".join([t for _, t, _ in found] + fix)
    )
