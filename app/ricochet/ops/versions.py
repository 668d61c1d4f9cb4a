"""What the broker's version implies for ricochet (SPEC section 9)."""

from ricochet import priority
from ricochet.broker.amqp import parse_version
from ricochet.ops.checks import JSON, Check
from ricochet.settings import Settings, variable_name

OLDEST = (3, 10)
STRANDING_FIXED = (3, 10, 20)  # rabbitmq-server#7677


def _version_text(overview: JSON) -> str:
    return str(overview.get("rabbitmq_version") or overview.get("product_version") or "")


def reported_version(overview: JSON) -> tuple[int, ...] | None:
    """The RabbitMQ version the management API's overview reports (broker.amqp.broker_version
    reads it from a connection); None when it reports none."""
    return parse_version(_version_text(overview))


def _implications(version: tuple[int, ...], queue_type: str) -> list[str]:
    quorum = queue_type == "quorum"
    notes = []
    if quorum and version < STRANDING_FIXED:
        notes.append(
            "a leader change can strand the jobs a quorum queue dead-letters (see the stranded "
            "dead-letters check); upgrade to 3.10.20 or later"
        )
    if version >= (4, 0) and quorum:
        notes.append(
            "quorum queues have a delivery limit of 20, which ricochet lifts on the queues it "
            "consumes from (one declared before keeps it: see its check)"
        )
    if version >= (4, 3):
        notes.append(
            "no /cli/rabbitmqadmin: replay with the stock tools needs rabbitmqadmin v2 "
            "(Debian: rabbitmqadmin-ng)"
        )
        if not quorum:
            notes.append(
                "no consumer timeout on classic queues: only "
                f"{variable_name('handler_timeout_s')} bounds a stuck job"
            )
    return notes


def version_check(overview: JSON, queue_type: str) -> Check:
    """The broker's version: supported, and what it means for ricochet's queues."""
    text = _version_text(overview)
    version = parse_version(text)
    name = "broker version"
    if version is None:
        return Check(name, "warn", f"the API reports no RabbitMQ version ({text!r})")
    if version < OLDEST:
        return Check(name, "fail", f"RabbitMQ {text}: ricochet needs 3.10 or later; upgrade it")
    notes = _implications(version, queue_type)
    stranding = queue_type == "quorum" and version < STRANDING_FIXED
    detail = f"RabbitMQ {text}: " + ("; ".join(notes) if notes else "supported")
    return Check(name, "warn" if stranding else "ok", detail)


def priority_check(settings: Settings, version: tuple[int, ...] | None) -> Check:
    """How the broker orders the queue's backlog by priority (SPEC 28): said, never failed."""
    how = priority.honouring(settings.queue_type, settings.max_priority, version)
    return Check("priority", "ok", priority.said(how, settings.queue_type, settings.max_priority))
