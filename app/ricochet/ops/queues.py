"""Which ricochet queues a vhost holds: each one that a worker or `topology` declared keeps the
record of its settings beside it (Q.topology, broker/record.py), so the records name them."""

import re

from ricochet.broker.management import open_api, vhost
from ricochet.names import Names
from ricochet.settings import Settings, queue_problem

RECORD_SUFFIX = Names("Q").record.removeprefix("Q")


async def held_queues(settings: Settings) -> list[str]:
    """Every ricochet queue of the settings' vhost, by name, read from the management API
    (ManagementUnavailable when it cannot be)."""
    async with open_api(settings.management_url, settings.amqp_url) as api:
        records = await api.listing(
            "queues", vhost(settings.amqp_url), f"{re.escape(RECORD_SUFFIX)}$", "name"
        )
    names = (item["name"].removesuffix(RECORD_SUFFIX) for item in records)
    return sorted(name for name in names if queue_problem(name) is None)
