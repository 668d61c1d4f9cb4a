"""The bench's Celery app (`celery -A bench.peer_celery worker`): the shapes as tasks, acked after
the job (task_acks_late), as ricochet acks."""

import os

from celery import Celery

from bench import peer_jobs

app = Celery("bench", broker=os.environ.get("BENCH_AMQP_URL"))
app.conf.update(task_acks_late=True, worker_hijack_root_logger=False, broker_heartbeat=0)


@app.task(name="cpu")
def cpu() -> None:
    peer_jobs.burn_cpu()


@app.task(name="blocking")
def blocking() -> None:
    peer_jobs.block()
