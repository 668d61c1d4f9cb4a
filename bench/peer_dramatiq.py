"""The bench's Dramatiq actors (`dramatiq bench.peer_dramatiq`), on the run's queue
(BENCH_QUEUE); Dramatiq acks after the job."""

import os

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from bench import peer_jobs

broker = RabbitmqBroker(url=os.environ.get("BENCH_AMQP_URL"))
dramatiq.set_broker(broker)
QUEUE = os.environ.get("BENCH_QUEUE", "bench")


@dramatiq.actor(queue_name=QUEUE, actor_name="cpu", max_retries=0)
def cpu() -> None:
    peer_jobs.burn_cpu()


@dramatiq.actor(queue_name=QUEUE, actor_name="blocking", max_retries=0)
def blocking() -> None:
    peer_jobs.block()
