"""ricochet doctor: read the broker through the management API, then check it against the plan."""

from app.checks import (
    BrokerState,
    Check,
    binding_check,
    consumer_check,
    exchange_checks,
    failed_check,
    monitor_check,
    queue_checks,
    stale_tier_check,
    stranded_check,
    unwanted_binding_check,
)
from app.management import read_state
from app.policies import policy_check
from app.settings import Settings
from app.topology import plan
from app.versions import broker_version, version_check


def diagnose(settings: Settings, state: BrokerState) -> list[Check]:
    """Every check, in the order an operator reads them, against the plan for the broker's
    version (pure)."""
    version = broker_version(state.overview)
    p = plan(settings, version)
    return [
        version_check(state.overview, settings.queue_type),
        *exchange_checks(p, state),
        *queue_checks(p, settings.queue_type, state),
        binding_check(p, state),
        unwanted_binding_check(p, state),
        stale_tier_check(p, state),
        consumer_check(p, state),
        monitor_check(p, state),
        failed_check(p, settings.alert_failed_threshold, state),
        policy_check(p, settings.queue_type, version, state),
        stranded_check(p, state),
    ]


async def run_doctor(settings: Settings) -> list[Check]:
    """Read the broker (GETs only) and check it; ManagementUnavailable when the API cannot be."""
    # The names to read do not depend on the broker's version; the arguments to expect do.
    state = await read_state(settings.management_url, settings.amqp_url, plan(settings))
    return diagnose(settings, state)
