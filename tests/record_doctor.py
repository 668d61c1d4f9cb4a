"""Record the management API answers that doctor's unit tests read (python -m tests.record_doctor).

Declares a topology on the test broker and reads it as doctor does while consumers are on the
main queue and the failure events; then breaks it in every way doctor looks for and reads it
again. The answers go to tests/unit/data/doctor_{healthy,broken}_VERSION.json with the settings
they are checked against; the topology is removed afterwards unless --keep is given (to run
`ricochet doctor` on it). tests/broker.py names the broker: after `eval "$(scripts/brokers.sh env
sid)"` it records the newest RabbitMQ 4's answers.
"""

import argparse
import asyncio
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aio_pika
from ricochet.broker.declare import declare
from ricochet.broker.plan import TTL, plan
from ricochet.ops.doctor import read_state
from ricochet.ops.versions import reported_version
from ricochet.settings import Settings

from tests.breakage import add_policy, fill, redeclare, remove_policy, unbind
from tests.broker import BROKER
from tests.support import delete_topology

DATA = Path(__file__).parent / "unit" / "data"
# The management API refreshes a queue's figures every 5 s.
STATS_INTERVAL_S = 6


async def record(settings: Settings, name: str) -> None:
    # A new queue's figures (depth, consumers) reach the API some seconds after its declaration.
    while True:
        state = await read_state(BROKER.management_url, BROKER.amqp_url, plan(settings))
        if all("messages" in q and "consumers" in q for q in state.queues.values()):
            break
        await asyncio.sleep(1)
    await asyncio.sleep(STATS_INTERVAL_S)  # and the newest of them another round
    state = await read_state(BROKER.management_url, BROKER.amqp_url, plan(settings))
    used = settings.model_dump(include={"queue", "max_retries", "alert_failed_threshold"})
    answers = {"settings": used, "state": asdict(state)}
    version = reported_version(state.overview)
    assert version is not None, state.overview
    path = DATA / f"doctor_{name}_{version[0]}.{version[1]}.json"
    path.write_text(json.dumps(answers, indent=1, sort_keys=True) + "\n")


async def main(queue: str, keep: bool) -> None:
    # An earlier deployment retried three times; the settings doctor reads now say two.
    earlier = Settings(amqp_url=BROKER.amqp_url, queue=queue, max_retries=3)
    now = Settings(amqp_url=BROKER.amqp_url, queue=queue, max_retries=2)
    n = plan(now).names
    connection = await aio_pika.connect(BROKER.amqp_url)
    channel = await connection.channel()
    policy = None
    try:
        await declare(connection, now)
        # A worker on the main queue, a monitor on the failure events.
        consuming = [await channel.get_queue(name) for name in (queue, n.events)]
        tags = [await q.consume(lambda _m: asyncio.sleep(0)) for q in consuming]
        await record(now, "healthy")
        for q, tag in zip(consuming, tags, strict=True):
            await q.cancel(tag)

        await declare(connection, earlier)
        await fill(channel, n.tier(3), 2)
        tier2: dict[str, Any] = {**plan(now).tiers[1].arguments, TTL: 45_000}
        await redeclare(channel, n.tier(2), tier2)
        await unbind(channel, n.return_to_queue, n.queue)
        await (await channel.get_queue(queue)).bind(n.failed)
        policy = add_policy(n.failed, {"max-length": 100})
        await fill(channel, n.failed, 12)
        await record(now, "broken")
    finally:
        if not keep:
            if policy:
                remove_policy(policy)
            await delete_topology(connection, queue)
        await connection.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue", default="jobs")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    asyncio.run(main(args.queue, args.keep))
