"""ricochet doctor: read the broker through the management API, then check it against the plan."""

import asyncio
import re
from typing import Any
from urllib.parse import quote

from aio_pika.exceptions import ChannelNotFoundEntity

from ricochet.broker.connection import close_quietly, connect, connection_name
from ricochet.broker.diff import diff, exchange_names, queue_names
from ricochet.broker.lead import lead_is_held
from ricochet.broker.legacy import levels_name, old_levels, old_stores
from ricochet.broker.management import Api, open_api, vhost
from ricochet.broker.plan import PLAN_FIELDS, Plan, plan
from ricochet.broker.publish import confirming_channel
from ricochet.broker.rate_store import Applied, read_applied
from ricochet.broker.rate_store import waiting as waiting_for_tokens
from ricochet.broker.record import declared_settings
from ricochet.broker.register import amqp_user
from ricochet.errors import BrokerUnavailable, ManagementUnavailable
from ricochet.log import get_logger
from ricochet.names import SHARED, SHARED_PREFIX, Names
from ricochet.ops.checks import (
    BrokerState,
    Check,
    RatesSeen,
    binding_check,
    consumer_check,
    dead_letters,
    earlier_check,
    exchange_checks,
    failed_check,
    held_of,
    holding_dead_letters,
    journal_check,
    key_lanes_check,
    levels_as_one,
    monitor_check,
    open_files_check,
    orphans_check,
    permission_check,
    queue_checks,
    rate_limits_check,
    stale_tier_check,
    stranded_check,
    unwanted_binding_check,
)
from ricochet.ops.limits import with_current_policies
from ricochet.ops.policies import policy_check
from ricochet.ops.versions import (
    STRANDING_FIXED,
    priority_check,
    reported_version,
    version_check,
)
from ricochet.settings import Settings

log = get_logger("ricochet.doctor")
# A queue none of whose workers has rate limits.
RATES_UNREAD = RatesSeen(Applied({}, {}), {}, led=False)

# Only what the checks read, so the answers stay small on a broker with many queues.
OVERVIEW_COLUMNS = "rabbitmq_version,product_version,exchange_types"
QUEUE_COLUMNS = (
    "name,type,arguments,messages,messages_ready,messages_unacknowledged,messages_dlx,consumers,"
    "policy,operator_policy,effective_policy_definition,leader,node"
)
HELD_COLUMNS = "messages,messages_ready,messages_unacknowledged,messages_dlx"
# Dead-letters seen are read again this much later: past a refresh of the API's figures (5 s)
# and a quorum queue's own report of them (5 s), and past the 5 s retry of a broker that runs
# with ricochet's dead_letter_worker_publisher_confirm_timeout, so that what is still held then
# does not move (ops/checks.py: stranded_check).
DEAD_LETTERS_RECHECK_S = 15.0
EXCHANGE_COLUMNS = "name,type,arguments"
BINDING_COLUMNS = "source,destination,destination_type,routing_key,properties_key"


async def read_state(
    management_url: str,
    amqp_url: str,
    plan: Plan,
    recheck_s: float = DEAD_LETTERS_RECHECK_S,
) -> BrokerState:
    """The overview, and the queues (their policies as defined now), exchanges and bindings of
    the plan's names as they are; the queues that hold dead-letters are read again recheck_s
    later."""
    vh = vhost(amqp_url)
    # The main queue's name and every name under it, and the shared ones; the checks pick theirs.
    names = f"^({re.escape(plan.names.queue)}(\\..*)?|{re.escape(SHARED_PREFIX)}.*)$"
    async with open_api(management_url, amqp_url) as api:
        overview, queues, exchanges = await asyncio.gather(
            api.get("overview", columns=OVERVIEW_COLUMNS),
            api.listing("queues", vh, names, QUEUE_COLUMNS),
            api.listing("exchanges", vh, names, EXCHANGE_COLUMNS),
        )
        wanted_queues, wanted_exchanges = set(queue_names(plan)), set(exchange_names(plan))
        # A policy set a moment ago is in the definitions before the queues' statistics show it.
        ours_q = await with_current_policies(
            api, vh, {q["name"]: q for q in queues if q["name"] in wanted_queues}
        )
        ours_x = {x["name"]: x for x in exchanges if x["name"] in wanted_exchanges}
        v = quote(vh, safe="")
        paths = [
            *(
                f"exchanges/{v}/{quote(x, safe='')}/bindings/{side}"
                for x in ours_x
                for side in ("source", "destination")
            ),
            *(f"queues/{v}/{quote(q, safe='')}/bindings" for q in ours_q),
        ]
        answers = await asyncio.gather(*(api.get(p, columns=BINDING_COLUMNS) for p in paths))
        nodes, all_queues = await asyncio.gather(
            api.get("nodes", columns="name,fd_used,fd_total"), api.get("queues", columns="type")
        )
        user = amqp_user(amqp_url)
        try:
            permissions = await api.get(f"permissions/{v}/{quote(user, safe='')}")
        except ManagementUnavailable:  # only an administrator may read them
            permissions = None
        again = await _dead_letters_again(api, vh, holding_dead_letters(ours_q), recheck_s)
        # One by one: a page of the listing carries no figures.
        lanes = [q["name"] for q in queues if plan.names.key_lane_index(q["name"]) is not None]
        lane_figures = await asyncio.gather(*(api.queue(vh, n, QUEUE_COLUMNS) for n in lanes))
    # A binding between two of ricochet's names is listed at both ends.
    unique = {
        (b["source"], b["destination"], b["destination_type"], b["properties_key"]): b
        for answer in answers
        for b in answer or []
    }
    return BrokerState(
        api.base,
        vh,
        overview or {},
        ours_q,
        ours_x,
        list(unique.values()),
        nodes=nodes or [],
        quorum_queues=sum(1 for q in all_queues or [] if q.get("type") == "quorum"),
        user=user,
        permissions=permissions,
        dead_letters_again=again,
        dead_letters_recheck_s=recheck_s,
        earlier=earlier_objects(plan.names, queues, exchanges),
        key_lanes={n: q for n, q in zip(lanes, lane_figures, strict=True) if q is not None},
        keys_exchange=any(x["name"] == plan.names.keys for x in exchanges),
    )


def earlier_objects(
    names: Names, queues: list[dict[str, Any]], exchanges: list[dict[str, Any]]
) -> list[str]:
    """The objects an earlier ricochet left for this queue, by the listings (pure)."""
    found = [names.cancels] if names.queue in old_stores(queues) else []
    if names.queue in old_levels(exchanges):
        found.append(levels_name(names))
    return found


async def _dead_letters_again(
    api: Api, vh: str, names: list[str], recheck_s: float
) -> dict[str, int] | None:
    """The dead-letters of these queues recheck_s from now (a queue gone since holds none);
    None when there are none to read again."""
    if not names:
        return None
    log.info("queues hold dead-letters: reading them again", queues=names, in_s=recheck_s)
    await asyncio.sleep(recheck_s)
    answers = await asyncio.gather(*(api.queue(vh, name, HELD_COLUMNS) for name in names))
    return {name: dead_letters(answer) or 0 for name, answer in zip(names, answers, strict=True)}


def diagnose(
    settings: Settings, state: BrokerState, rates: RatesSeen | None = RATES_UNREAD
) -> list[Check]:
    """Every check, in the order an operator reads them (the delays' levels as one row),
    against the plan for the broker's version (pure); rates: the queue's rate limits as read
    over AMQP (None: they could not be)."""
    version = reported_version(state.overview)
    p = plan(settings, version)
    steps = diff(p, held_of(state))
    return [
        version_check(state.overview, settings.queue_type),
        priority_check(settings, version),
        *levels_as_one(
            [
                *exchange_checks(p, steps, state),
                *queue_checks(p, steps, settings.queue_type, state),
            ]
        ),
        binding_check(p, steps),
        unwanted_binding_check(steps, state),
        stale_tier_check(p, steps),
        consumer_check(p, state),
        monitor_check(p, state),
        failed_check(p, settings.alert_failed_threshold, state),
        orphans_check(state),
        journal_check(settings.journal == "on", state),
        key_lanes_check(p.names, settings.key_lanes, state),
        rate_limits_check(settings.queue, rates),
        earlier_check(state),
        open_files_check(state),
        permission_check(p, state),
        policy_check(p, settings.queue_type, version, state),
        stranded_check(p, state, version is None or version < STRANDING_FIXED),
    ]


# The finding of a doctor that could not read the declared settings (broker/record.py).
SETTINGS_CHECK = "declared settings"


async def settings_to_check(settings: Settings) -> tuple[Settings, Check | None]:
    """The settings to check the broker against: those given, or, when no retry setting was
    given, those the topology was declared with (broker/record.py), read over AMQP. A broker
    that cannot be reached that way leaves the settings as they are, with a warning to report
    (not a log line: when the broker does not answer at all, the API's error says it once)."""
    if settings.model_fields_set & PLAN_FIELDS:
        return settings, None
    try:
        # A convenience: doctor asks the broker once for it.
        connection = await connect(settings.amqp_url, connection_name("doctor", settings.queue), 0)
    except BrokerUnavailable as error:
        unknown = Check(
            SETTINGS_CHECK, "warn", f"unknown: {error}; checked against the defaults instead"
        )
        return settings, unknown
    try:
        return await declared_settings(connection, settings), None
    finally:
        await close_quietly(connection)


async def read_rates(settings: Settings) -> RatesSeen | None:
    """The queue's rate limits, read over AMQP (nothing consumed); None when the broker cannot
    be reached that way."""
    try:
        connection = await connect(settings.amqp_url, connection_name("doctor", settings.queue), 0)
    except BrokerUnavailable:
        return None
    names = Names(settings.queue)
    try:
        channel = await confirming_channel(connection)
        try:
            applied = await read_applied(channel, names, amqp_user(settings.amqp_url))
        except ChannelNotFoundEntity:  # no worker with limits ever ran
            return RATES_UNREAD
        waiting = {t: await waiting_for_tokens(channel, names, t) for t in applied.limits}
        led = await lead_is_held(channel, SHARED.rates_lead(settings.queue))
        return RatesSeen(applied, waiting, led)
    finally:
        await close_quietly(connection)


async def run_doctor(settings: Settings) -> list[Check]:
    """Read the broker (GETs only, and the registers over AMQP) and check it;
    ManagementUnavailable when the API cannot be."""
    settings, unknown = await settings_to_check(settings)
    # The names to read do not depend on the broker's version; the arguments to expect do.
    state = await read_state(settings.management_url, settings.amqp_url, plan(settings))
    rates = await read_rates(settings)
    return [*([unknown] if unknown else []), *diagnose(settings, state, rates)]
