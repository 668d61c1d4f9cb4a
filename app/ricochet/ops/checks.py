"""What doctor finds in the topology: pure functions of the management API's answers and the plan.

The topology's checks read the diff of the plan that `topology` declares with what the API shows
(broker/diff.py), so what differs is decided there and no name or argument is spelled here; each
finding says what to run to fix it.
"""

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal
from urllib.parse import quote

from ricochet.broker.diff import (
    REBUILD,
    Bind,
    Conflict,
    DeclareExchange,
    DeclareQueue,
    DelayDiffers,
    ExchangeDiffers,
    ExchangeSeen,
    Held,
    LimitNotLifted,
    QueueSeen,
    RetireTier,
    Step,
    Unbind,
    Unwanted,
    held_delay_ms,
    planned_bindings,
    planned_exchanges,
    planned_queues,
    queue_names,
)
from ricochet.broker.plan import (
    CONSISTENT_HASH_EXCHANGE,
    DELIVERY_LIMIT,
    QUEUE_TYPE,
    Binding,
    Plan,
    QueueSpec,
    delivery_limit_policy_command,
    earlier_return,
)
from ricochet.broker.rate_store import Applied
from ricochet.names import DELAY_LEVELS, SHARED, SHARED_PREFIX, Names
from ricochet.ops.report import duration
from ricochet.settings import variable_name

Status = Literal["ok", "warn", "fail"]
JSON = dict[str, Any]

DECLARE = "`ricochet topology` declares it (so does any worker or monitor start)"


@dataclass(frozen=True)
class Check:
    """One finding: what was checked, ok / warn / fail, and what to do about it."""

    check: str
    status: Status
    detail: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class BrokerState:
    """The management API's answers about one main queue's topology, as the API spelled them.

    queues and exchanges map the names that exist to the API's objects; bindings are those whose
    source or destination is one of them. api_url (no credentials) and vhost are where they came
    from, for the commands the findings suggest.
    """

    api_url: str
    vhost: str
    overview: JSON
    queues: dict[str, JSON]
    exchanges: dict[str, JSON]
    bindings: list[JSON]
    # The nodes' open files (fd_used, fd_total), the quorum queues the broker holds in every
    # vhost, and the AMQP user's permissions in the vhost (None: not readable).
    nodes: list[JSON] = field(default_factory=list)
    quorum_queues: int | None = None
    user: str = ""
    permissions: JSON | None = None
    # The dead-letters (dead_letters) of each queue that held some, read again
    # dead_letters_recheck_s later; None when they were not read again.
    dead_letters_again: dict[str, int] | None = None
    dead_letters_recheck_s: float = 0.0
    # What an earlier ricochet left for this queue (its cancel store, its delay levels' entry).
    earlier: list[str] = field(default_factory=list)
    # The queue's key lanes by name, and whether its key exchange exists (SPEC 28).
    key_lanes: dict[str, JSON] = field(default_factory=dict)
    keys_exchange: bool = False


# The statuses, worst first: the order doctor prints its findings in.
SEVERITY: tuple[Status, ...] = ("fail", "warn", "ok")


def worst(statuses: Iterable[Status]) -> Status:
    """The worst of the statuses by SEVERITY; ok for none."""
    return min(statuses, key=SEVERITY.index, default="ok")


def worst_first(checks: Iterable[Check]) -> list[Check]:
    """The findings, failures first, then warnings, then the ones that pass, each in the order
    given (pure)."""
    return sorted(checks, key=lambda c: SEVERITY.index(c.status))


# The one row of the delays' levels: an exchange and a queue each, checked one by one.
LEVELS_CHECK = "shared delay levels"
# Each level's name, and its k.
_LEVELS = {SHARED.delay(k): k for k in range(DELAY_LEVELS)}


def _object_name(check: Check) -> str:
    """The queue or exchange a row of queue_checks or exchange_checks is about."""
    return check.check.rpartition(" ")[2]


def levels_as_one(checks: list[Check]) -> list[Check]:
    """The rows of the delays' levels as one, where the first of them stood: how many levels
    there are, and that they are as declared, or each row that is not (pure)."""
    rows = [c for c in checks if _object_name(c) in _LEVELS]
    if not rows:
        return checks
    levels = list(dict.fromkeys(_object_name(c) for c in rows))
    span = f"{levels[0]}-{_LEVELS[levels[-1]]}"
    astray = [c for c in rows if c.status != "ok"]
    if astray:
        fine = len(levels) - len({_object_name(c) for c in astray})
        detail = "; ".join(
            [
                *(f"{c.check}: {c.detail}" for c in astray),
                f"the other {fine} of the {len(levels)} levels ({span}) are as the settings "
                "declare them",
            ]
        )
    else:
        detail = (
            f"{len(levels)} levels ({span}), each exchange and queue as the settings declare it"
        )
    at = checks.index(rows[0])
    rest = [c for c in checks if c not in rows]
    return [*rest[:at], Check(LEVELS_CHECK, worst(c.status for c in rows), detail), *rest[at:]]


def count(queue: JSON | None, field: str) -> int | None:
    """A queue's figure; None when the queue is missing or the API has no figures yet (a queue's
    statistics appear a few seconds after it is declared)."""
    value = None if queue is None else queue.get(field)
    return value if isinstance(value, int) else None


def vhost_option(state: BrokerState) -> str:
    """The rabbitmqctl / rabbitmq-queues option naming the vhost ('' for the default one)."""
    return f" --vhost {state.vhost}" if state.vhost != "/" else ""


def _figure(check: str, name: str, field: str, state: BrokerState) -> int | Check:
    """A queue's figure, or the finding when the queue is missing or has no figures yet."""
    if name not in state.queues:
        return Check(check, "fail", f"{name} does not exist (see its queue check)")
    value = count(state.queues[name], field)
    if value is None:
        return Check(
            check,
            "warn",
            f"the API has no figures for {name} yet (a new queue gets them within seconds): "
            "run doctor again",
        )
    return value


def held_of(state: BrokerState) -> Held:
    """What the broker holds of the plan's names, as the diff reads it."""
    return Held(
        queues={
            name: QueueSeen(q.get("type"), q.get("arguments", {}), count(q, "messages"))
            for name, q in state.queues.items()
        },
        exchanges={
            name: ExchangeSeen(x.get("type"), x.get("arguments", {}))
            for name, x in state.exchanges.items()
        },
        bindings=[_binding(b) for b in state.bindings],
    )


def _binding(b: JSON) -> Binding:
    """A binding as the API lists it, as the plan spells it."""
    return Binding(
        b["source"], b["destination"], b["routing_key"], b["destination_type"] == "exchange"
    )


def _tier_delay_check(name: str, step: DelayDiffers) -> Check:
    old = held_delay_ms(step.seen)
    was = f"waits {duration(old)}" if old is not None else "has no delay"
    waits = f"{was}, the settings say {duration(step.spec.delay_ms)}"
    messages = step.seen.messages
    if messages:
        return Check(
            name,
            "warn",
            f"{waits}; it keeps its old delay until its {messages} jobs drain (within "
            f"{duration(old)}), then a running worker (or `ricochet topology`) declares it again",
        )
    return Check(name, "fail", f"{waits} and it is empty: `ricochet topology` redeclares it")


def _delivery_limit_check(name: str, queue: JSON, lift: str) -> Check:
    """A queue declared before ricochet lifted RabbitMQ 4's delivery limit: its arguments cannot
    change, so a policy lifts it."""
    definition = queue.get("effective_policy_definition")
    limit = (
        definition.get(DELIVERY_LIMIT.removeprefix("x-")) if isinstance(definition, dict) else None
    )
    if isinstance(limit, int) and limit < 0:
        return Check(name, "ok", f"{queue.get('type')}, its delivery limit lifted by a policy")
    return Check(
        name,
        "fail",
        "keeps RabbitMQ 4's delivery limit of 20 (declared before ricochet lifted it), so a job "
        f"or failed copy handed back 20 times is dropped; lift it by a policy: `{lift}`",
    )


def _queue_check(
    spec: QueueSpec, step: Step | None, settings_type: str, state: BrokerState, lift: str
) -> Check:
    name = f"queue {spec.name}"
    queue_type = spec.arguments[QUEUE_TYPE]
    match step:
        case None:
            delay = f", waits {duration(spec.delay_ms)}" if spec.delay_ms is not None else ""
            return Check(name, "ok", f"{queue_type}{delay}, as the settings declare it")
        case DeclareQueue():
            return Check(name, "fail", f"missing: {DECLARE}")
        case Conflict(_, seen) if seen.type != queue_type:
            wants = (
                f"{variable_name('queue_type')} wants"
                if queue_type == settings_type
                else "ricochet wants"
            )
            return Check(name, "fail", f"is a {seen.type} queue, {wants} {queue_type}; {REBUILD}")
        case Conflict(_, _, differences):
            found = ", ".join(str(d) for d in differences)
            return Check(name, "fail", f"arguments differ: {found}; {REBUILD}")
        case DelayDiffers():
            return _tier_delay_check(name, step)
        case LimitNotLifted():
            return _delivery_limit_check(name, state.queues[spec.name], lift)
    raise AssertionError(f"not a step of a queue: {step}")


def _by_name(steps: list[Step]) -> dict[str, Step]:
    """The step of each queue and exchange of the plan that is not as planned."""
    found: dict[str, Step] = {}
    for step in steps:
        match step:
            case DeclareQueue(spec) | Conflict(spec) | DelayDiffers(spec) | LimitNotLifted(spec):
                found[spec.name] = step
            case DeclareExchange(x) | ExchangeDiffers(x):
                found[x.name] = step
    return found


def queue_checks(plan: Plan, steps: list[Step], queue_type: str, state: BrokerState) -> list[Check]:
    """Every queue of the plan exists with the type and arguments (a tier's TTL) it declares."""
    lift = delivery_limit_policy_command(plan.names)
    found = _by_name(steps)
    return [
        _queue_check(spec, found.get(spec.name), queue_type, state, lift)
        for spec in planned_queues(plan)
    ]


def exchange_checks(plan: Plan, steps: list[Step], state: BrokerState) -> list[Check]:
    """Every exchange of the plan exists with its type and arguments."""
    found = _by_name(steps)
    checks = []
    for x in planned_exchanges(plan):
        label = f"exchange {x.name}"
        match found.get(x.name):
            case DeclareExchange():
                checks.append(Check(label, "fail", f"missing: {DECLARE}"))
            case ExchangeDiffers() as differs:
                delete = _curl_delete(state, f"exchanges/{_q(state.vhost)}/{_q(x.name)}")
                checks.append(
                    Check(
                        label,
                        "fail",
                        f"differs: {differs}; delete it ({delete}), then run `ricochet topology`",
                    )
                )
            case _:
                checks.append(Check(label, "ok", f"{x.kind}, as the settings declare it"))
    return checks


def _describe(b: Binding) -> str:
    kind = "exchange" if b.to_exchange else "queue"
    key = f" with key {b.routing_key}" if b.routing_key else ""
    return f"{b.source} -> {kind} {b.destination}{key}"


def binding_check(plan: Plan, steps: list[Step]) -> Check:
    """Every binding of the plan exists."""
    planned = planned_bindings(plan)
    to_bind = {step.binding for step in steps if isinstance(step, Bind)}
    missing = [b for b in planned if b in to_bind]
    if not missing:
        return Check("bindings", "ok", f"all {len(planned)} bindings of the settings exist")
    return Check(
        "bindings",
        "fail",
        f"{len(missing)} missing; {'; '.join(_describe(b) for b in missing)}; "
        "`ricochet topology` adds them",
    )


def _q(part: str) -> str:
    return quote(part, safe="")


def _curl_delete(state: BrokerState, path: str) -> str:
    return f"curl -u USER:PASSWORD -X DELETE '{state.api_url}{path}'"


def unwanted_binding_check(steps: list[Step], state: BrokerState) -> Check:
    """No binding leads out of ricochet's exchanges, or into its exchanges and queues other than
    the main one, unless the plan wants it (diff's Unbind: earlier settings made it; Unwanted:
    nothing of ricochet's did)."""
    stale = {step.binding for step in steps if isinstance(step, Unbind)}
    unwanted = {step.binding for step in steps if isinstance(step, Unwanted)}
    found = []
    for b in state.bindings:
        binding = _binding(b)
        if binding in stale and binding == earlier_return(Names(binding.destination)):
            found.append(
                f"{_describe(binding)} (an earlier version's route back from the tiers, which "
                "loses a deleted queue's retried jobs: `ricochet topology` replaces it)"
            )
        elif binding in stale:
            found.append(
                f"{_describe(binding)} (left by an earlier {variable_name('max_retries')}: "
                "`ricochet topology` removes it)"
            )
        elif binding in unwanted:
            path = (
                f"bindings/{_q(state.vhost)}/e/{_q(b['source'])}/{b['destination_type'][0]}/"
                f"{_q(b['destination'])}/{_q(b['properties_key'])}"
            )
            found.append(f"{_describe(binding)} (remove it: {_curl_delete(state, path)})")
    if not found:
        return Check("unwanted bindings", "ok", "none")
    return Check(
        "unwanted bindings",
        "fail",
        f"jobs also flow where ricochet does not send them; {'; '.join(found)}",
    )


def stale_tier_check(plan: Plan, steps: list[Step]) -> Check:
    """Tiers beyond the retry budget that still exist, and the jobs they hold."""
    budget = len(plan.tiers)
    found = []
    for step in steps:
        if not isinstance(step, RetireTier) or step.seen is None:
            continue
        delay = held_delay_ms(step.seen)
        if step.seen.messages:
            found.append(
                f"{step.name} holds {step.seen.messages} jobs: they come back to "
                f"{plan.names.queue} within {duration(delay)} with the current budget, then "
                "`ricochet topology` removes it"
            )
        else:
            found.append(f"{step.name} is no longer used: `ricochet topology` removes it")
    beyond = f"beyond {variable_name('max_retries')}={budget}"
    if not found:
        return Check("stale tiers", "ok", f"no tier {beyond}")
    return Check("stale tiers", "warn", f"{beyond}; {'; '.join(found)}")


def _consumer_check(check: str, name: str, state: BrokerState, unread: Check) -> Check:
    consumers = _figure(check, name, "consumers", state)
    if isinstance(consumers, Check):
        return consumers
    return unread if consumers == 0 else Check(check, "ok", f"{consumers} consumers on {name}")


def consumer_check(plan: Plan, state: BrokerState) -> Check:
    """Some worker consumes the main queue."""
    name = plan.names.queue
    waiting = count(state.queues.get(name), "messages")
    unread = Check(
        "consumers",
        "fail",
        f"no worker consumes {name}"
        + (f", where {waiting} jobs wait" if waiting else "")
        + "; start one (`ricochet worker`), or if workers run, read their logs and /readyz",
    )
    return _consumer_check("consumers", name, state, unread)


def monitor_check(plan: Plan, state: BrokerState) -> Check:
    """Some monitor reads the failure events."""
    name = plan.names.events
    unread = Check(
        "monitor",
        "warn",
        f"no monitor reads {name}, so failed jobs are neither logged nor alerted on; "
        "start one (`ricochet monitor`)",
    )
    return _consumer_check("monitor", name, state, unread)


def failed_check(plan: Plan, threshold: int, state: BrokerState) -> Check:
    """The failed queue's depth against the monitor's alert threshold."""
    name = plan.names.failed
    depth = _figure("failed jobs", name, "messages", state)
    if isinstance(depth, Check):
        return depth
    see = (
        "; `ricochet replay --dry-run --group-by reason` counts them by reason, "
        "`ricochet replay` retries them once the cause is fixed"
    )
    text = f"{depth} in {name} ({variable_name('alert_failed_threshold')}={threshold})"
    if depth >= threshold:
        return Check("failed jobs", "fail", text + see)
    return Check("failed jobs", "ok", text + (see if depth else ""))


def earlier_check(state: BrokerState) -> Check:
    """What an earlier ricochet left, that every worker's start still reads (SPEC 25)."""
    if not state.earlier:
        return Check("earlier versions' objects", "ok", "none: nothing to migrate")
    return Check(
        "earlier versions' objects",
        "warn",
        f"{', '.join(state.earlier)}: left by an earlier ricochet, and honoured by every worker; "
        "run `ricochet migrate` once no worker of that version is left",
    )


def orphans_check(state: BrokerState) -> Check:
    """Jobs whose queue was deleted while they waited in the shared levels (SPEC 18)."""
    name = SHARED.orphans
    depth = _figure("orphaned jobs", name, "messages", state)
    if isinstance(depth, Check):
        return depth
    if not depth:
        return Check("orphaned jobs", "ok", f"none in {name}")
    return Check(
        "orphaned jobs",
        "warn",
        f"{depth} in {name}: jobs whose queue was deleted while they waited; each keeps its "
        "message_id and headers. Move them to a queue with a shovel, or purge the queue once "
        "nobody needs them",
    )


def key_lanes_check(names: Names, wanted: int, state: BrokerState) -> Check:
    """One job per key at a time (SPEC 28): the plugin the key exchange needs, the queue's
    lanes once it has them, whether each has a consumer, and how many jobs wait in them."""
    types = state.overview.get("exchange_types")
    if isinstance(types, list) and CONSISTENT_HASH_EXCHANGE not in {t.get("name") for t in types}:
        return Check(
            "key lanes",
            "warn",
            "the broker lacks the consistent-hash exchange: a job with a key fails until "
            "`rabbitmq-plugins enable rabbitmq_consistent_hash_exchange`",
        )
    lanes = state.key_lanes
    if not state.keys_exchange and not lanes:
        return Check(
            "key lanes",
            "ok",
            f"none yet: {wanted} are declared with {names.queue}'s first job with a key",
        )
    waiting = sum(count(lane, "messages") or 0 for lane in lanes.values())
    idle = sorted(
        (n for n, lane in lanes.items() if not count(lane, "consumers")),
        key=lambda name: names.key_lane_index(name) or 0,
    )
    said = f"{len(lanes)} lanes, {waiting} jobs with a key waiting in them"
    if len(lanes) != wanted or not state.keys_exchange:
        return Check(
            "key lanes",
            "warn",
            f"{said}; RICOCHET_KEY_LANES is {wanted}"
            + ("" if state.keys_exchange else f", and the exchange {names.keys} is missing")
            + ": the first declaration fixes the count, and every worker consumes the lanes it "
            "finds; to change it, let the lanes drain, delete them and the exchange, and send "
            "the next job with a key",
        )
    if idle and waiting:
        return Check(
            "key lanes",
            "warn",
            f"{said}; no worker consumes {', '.join(idle[:5])}"
            + (" ..." if len(idle) > 5 else "")
            + ": their jobs wait until a worker of the queue runs",
        )
    return Check("key lanes", "ok", f"{said}, each consumed by one worker at a time")


@dataclass(frozen=True)
class RatesSeen:
    """A queue's rate limits as read over AMQP: what their leader applies (and the limits the
    workers disagree on), the jobs waiting for each type's tokens, whether a process leads."""

    applied: Applied
    waiting: dict[str, int]
    led: bool


def rate_limits_check(queue: str, seen: RatesSeen | None) -> Check:
    """Rate limits (SPEC 28): each limit applied and the jobs that wait for it; a warning when
    workers disagree on one (the lowest applies), or when no process leads while jobs wait."""
    if seen is None:
        return Check("rate limits", "warn", "unknown: the broker could not be read over AMQP")
    limits = seen.applied.limits
    if not limits:
        return Check("rate limits", "ok", f"none: no worker limits a type of {queue}")
    said = ", ".join(
        f"{t} {x.text()} ({seen.waiting.get(t, 0)} waiting)" for t, x in sorted(limits.items())
    )
    if seen.applied.differing:
        differ = "; ".join(
            f"{t}: {', '.join(x)}" for t, x in sorted(seen.applied.differing.items())
        )
        return Check(
            "rate limits",
            "warn",
            f"{said}; workers disagree ({differ}): the lowest applies. Give every worker the "
            "same limits",
        )
    if not seen.led and any(seen.waiting.values()):
        return Check(
            "rate limits",
            "warn",
            f"{said}; no process leads the limits: the jobs wait until a worker with limits runs",
        )
    return Check("rate limits", "ok", said)


def journal_check(enabled: bool, state: BrokerState) -> Check:
    """The journal (SPEC 26): on or off, and the records its stream keeps."""
    name = SHARED.journal
    if not enabled:
        return Check(
            "journal",
            "ok",
            "off (RICOCHET_JOURNAL=off): `ricochet job` and `ricochet jobs` know nothing of this "
            "worker's jobs",
        )
    records = _figure("journal", name, "messages", state)
    if isinstance(records, Check):
        return records
    policy = state.queues[name].get("effective_policy_definition") or {}
    kept = {k: v for k, v in policy.items() if k in ("max-age", "max-length-bytes")}
    retention = f"a policy's {kept}" if kept else "7 days, 1 GB at most"
    return Check(
        "journal",
        "ok",
        f"on: {name} keeps {records} records of entries ({retention}); `ricochet job ID` reads it",
    )


# Open files a quorum queue takes on a node: RabbitMQ 3.10 with an open-file limit of 1,024 stops
# accepting connections at 300-325 of them (its file-handle cache is full), and new connections
# hang with nothing logged.
FILES_PER_QUORUM_QUEUE = 3
RAISE_OPEN_FILES = (
    "raise the broker's open-file limit: LimitNOFILE=65536 in a systemd override of "
    "rabbitmq-server (systemctl edit rabbitmq-server), `ulimit -n 65536` before it starts, or in "
    "a container its nofile ulimit (docker compose: `ulimits: {nofile: 65536}`)"
)


def open_files_check(state: BrokerState) -> Check:
    """The quorum queues the broker holds against what its nodes' open-file limit can hold."""
    limits = [n["fd_total"] for n in state.nodes if isinstance(n.get("fd_total"), int)]
    used = [n["fd_used"] for n in state.nodes if isinstance(n.get("fd_used"), int)]
    if not limits or state.quorum_queues is None:
        return Check("open files", "warn", "the API gave no open-file figures: run doctor again")
    limit = min(limits)
    room = limit // FILES_PER_QUORUM_QUEUE
    text = (
        f"{state.quorum_queues} quorum queues on the broker; an open-file limit of {limit} "
        f"holds about {room} (each ricochet queue takes 4 + its tiers, the shared ones 26), "
        f"{max(used, default=0)} files open"
    )
    if state.quorum_queues >= room * 0.85 or max(used, default=0) >= limit * 0.9:
        return Check(
            "open files",
            "fail",
            f"{text}: the node will soon refuse connections; {RAISE_OPEN_FILES}",
        )
    if state.quorum_queues >= room * 0.6:
        return Check("open files", "warn", f"{text}; {RAISE_OPEN_FILES}")
    return Check("open files", "ok", text)


def permission_check(plan: Plan, state: BrokerState) -> Check:
    """The AMQP user may declare, publish to and read both the queue's objects and the shared
    ones (RabbitMQ matches each permission's regular expression anywhere in a name)."""
    if state.permissions is None:
        return Check(
            "permissions",
            "warn",
            f"{state.user}'s permissions in the vhost could not be read (the management user "
            "needs the administrator tag to read them)",
        )
    names = [plan.names.queue, plan.names.failed, SHARED.delay_entry, SHARED.orphans]
    missing = [
        f"{kind} on {name}"
        for kind in ("configure", "write", "read")
        for name in names
        if not _permits(state.permissions.get(kind), name)
    ]
    if missing:
        return Check(
            "permissions",
            "fail",
            f"{state.user} lacks {', '.join(missing)}: grant it with rabbitmqctl set_permissions"
            f"{vhost_option(state)} {state.user} '.*' '.*' '.*' (or patterns that cover "
            f"{plan.names.queue}.* and {SHARED_PREFIX}*)",
        )
    return Check(
        "permissions", "ok", f"{state.user} may configure, write and read what ricochet uses"
    )


def _permits(pattern: object, name: str) -> bool:
    try:
        return isinstance(pattern, str) and re.search(pattern, name) is not None
    except re.error:
        return False


def dead_letters(queue: JSON | None) -> int | None:
    """The expired jobs a quorum queue holds until the target of their dead-letter confirms it
    (at-least-once dead-lettering): the API's messages_dlx, else what is neither ready nor
    unacked; None when the API has no figures."""
    held = count(queue, "messages_dlx")
    if held is not None:
        return held
    total, ready, unacked = (count(queue, f) for f in _STRANDED_FIELDS)
    if total is None or ready is None or unacked is None:
        return None
    return max(total - ready - unacked, 0)


def holding_dead_letters(queues: dict[str, JSON]) -> list[str]:
    """The queues that hold dead-letters now: those doctor reads a second time."""
    return [name for name, queue in queues.items() if dead_letters(queue)]


# After a broker restart, a level or tier can dead-letter before the node has recovered the
# exchanges and bindings: the broker keeps those dead-letters and tries them again only when its
# publisher-confirm timeout ends, which only advanced.config can set.
LOWER_TIMEOUT = (
    "the broker tries such dead-letters again only every "
    "dead_letter_worker_publisher_confirm_timeout (3 minutes by default), so after a restart "
    "they can wait that long: set it to 5 s in the broker's advanced.config "
    "(`[{rabbit, [{dead_letter_worker_publisher_confirm_timeout, 5000}]}].`) and restart it, "
    "see docs/broker-problems.md: What a broker restart costs waiting jobs; if they stay "
    "longer than the timeout, their target refuses them or no binding leads there (see the "
    "bindings and policies checks)"
)


def _new_leader(queue: str, state: BrokerState) -> str:
    leader = state.queues[queue].get("leader") or state.queues[queue].get("node")
    vhost = vhost_option(state)
    return (
        f"`rabbitmq-queues delete_member{vhost} {queue} {leader}`, then "
        f"`rabbitmq-queues add_member{vhost} {queue} {leader}`"
    )


def stranded_check(plan: Plan, state: BrokerState, leader_change_strands: bool) -> Check:
    """Expired jobs whose dead-letters do not move: held at both of doctor's readings, some
    seconds apart, when a dead-letter takes milliseconds. leader_change_strands: the broker is
    one that a leader change can leave with dead-letters stranded for good (before 3.10.20)."""
    name = "stranded dead-letters"
    again = state.dead_letters_again
    gap = duration(round(state.dead_letters_recheck_s * 1000))
    held, moved, new_leaders = [], [], []
    for queue in queue_names(plan):
        first = dead_letters(state.queues.get(queue))
        if not first:
            continue
        now = first if again is None else again.get(queue, 0)
        if not now:
            moved.append(queue)
            continue
        held.append(
            f"{queue} holds {now}" + ("" if again is None else f" ({first} read {gap} earlier)")
        )
        new_leaders.append(_new_leader(queue, state))
    if held:
        when = (
            "read once: being dead-lettered right now or stuck, so run doctor again"
            if again is None
            else f"still held {gap} later, when a dead-letter takes milliseconds"
        )
        stranding = (
            [
                "RabbitMQ before 3.10.20 can also strand them for good after a leader change "
                "(docs/broker-problems.md: A quorum queue that stops dead-lettering): give the "
                "queue a new leader, with every node running",
                *new_leaders,
            ]
            if leader_change_strands
            else []
        )
        parts = [f"expired jobs wait for their dead-letters ({when})", *held, LOWER_TIMEOUT]
        return Check(name, "warn", "; ".join(parts + stranding))
    if moved:
        return Check(name, "ok", f"dead-letters seen in {', '.join(moved)} moved on within {gap}")
    return Check(name, "ok", "every message is ready or unacked")


_STRANDED_FIELDS = ("messages", "messages_ready", "messages_unacknowledged")
