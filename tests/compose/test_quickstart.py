"""The Quickstart with Docker (docs/getting-started.md), for real: the repository's
docker-compose.yml and Dockerfile on a Docker engine, the README's `docker compose up` and the
Quickstart's commands run as printed, and what a user would look at afterwards (logs, health,
queues, Prometheus, a replay, a restart, a drain, a scale-out).

Run by `make test-compose`, which starts the engine and makes the base images (scripts/engine.sh).
The tests run in file order on one stack, each on what the ones before left.
"""

import json
import re
import socket
import time
from typing import Any

import pytest
import yaml

from tests.compose.stack import (
    Published,
    Stack,
    cancel_command,
    http_get,
    quickstart_commands,
    replay_commands,
    wait,
)
from tests.support import ROOT

pytestmark = pytest.mark.timeout(900)
# The tier a job that fails once waits in, with the stack's settings (config/ricochet.env).
FIRST_TIER = ("jobs.retry.1", 30000)
# compose's stop_grace_period for worker and monitor.
GRACE_S = 45


def replay(stack: Stack, message_id: str, *, dry_run: bool) -> str:
    """The operations guide's replay command (preview or move) for one job, as printed."""
    preview, move = replay_commands()
    return stack.run((preview if dry_run else move).replace("<id>", message_id))


def failed_copies(stack: Stack, message_id: str) -> int:
    """How many copies of the job the failed queue holds, as the replay preview lists them."""
    return replay(stack, message_id, dry_run=True).count(message_id)


def test_published_ports_answer_on_loopback_only(stack: Stack) -> None:
    """What the Quickstart points at answers on the host: AMQP, the management API as the
    stack's user with the password from .env, the broker's metrics, Prometheus; every
    published port is bound to 127.0.0.1."""
    with socket.create_connection(("127.0.0.1", stack.port("RABBITMQ_AMQP_PORT")), 10) as amqp:
        amqp.sendall(b"AMQP\x00\x00\x09\x01")
        frame = amqp.recv(7)
    assert frame[:3] == b"\x01\x00\x00", f"no AMQP Connection.Start on the AMQP port: {frame!r}"
    user = ("ricochet", stack.dotenv("RABBITMQ_PASSWORD"))
    management = f"http://127.0.0.1:{stack.port('RABBITMQ_MANAGEMENT_PORT')}/api/overview"
    metrics = f"http://127.0.0.1:{stack.port('RABBITMQ_METRICS_PORT')}/metrics"
    prometheus = f"http://127.0.0.1:{stack.port('PROMETHEUS_PORT')}/-/ready"
    for url, auth in ((management, user), (metrics, None), (prometheus, None)):
        status = http_get(url, auth)[0]
        assert status == 200, f"{url} answered {status or 'nothing'}"
    published = [p for c in stack.containers() for p in c.get("Publishers") or []]
    bound = {p["URL"] for p in published if p.get("PublishedPort")}
    assert bound == {"127.0.0.1"}, published


def test_worker_and_monitor_are_healthy_and_ready(stack: Stack) -> None:
    """Both containers pass the image's health check, and answer /healthz and /readyz."""
    health = {c["Service"]: c.get("Health") for c in stack.containers()}
    for service in ("worker", "monitor"):
        assert health[service] == "healthy", health
        assert stack.http_inside(service, "/healthz") == 200, service
        assert stack.http_inside(service, "/readyz") == 200, service


def test_quickstart_status_lists_every_queue(
    stack: Stack, quickstart: dict[str, Published]
) -> None:
    """The Quickstart's `ricochet status` shows the main queue, each tier and the failed queues."""
    (status,) = [c for c in quickstart_commands() if c.endswith("ricochet status")]
    out = stack.run(status)
    for queue in ("jobs", "jobs.retry.1", "jobs.retry.2", "jobs.retry.3", "jobs.failed"):
        assert re.search(rf"^\s*{re.escape(queue)}\s", out, re.MULTILINE), out


def test_succeeding_job_is_acked(stack: Stack, quickstart: dict[str, Published]) -> None:
    job = quickstart["succeeded"]
    (done,) = wait(
        "the job's success", 30, lambda: stack.events("worker", "job succeeded", job.message_id)
    )
    assert done["attempt"] == 1


def test_one_worker_runs_a_job_of_each_of_its_queues(stack: Stack) -> None:
    """The stack's worker consumes thumbnails (prefetch 1), email (5) and jobs (10): a job
    published to each runs there, and its log line names its queue."""
    sent = {
        queue: stack.ricochet(
            "publish", "--queue", queue, "--type", "report", json.dumps({"report_id": queue})
        ).strip()
        for queue in ("thumbnails", "email", "jobs")
    }
    for queue, message_id in sent.items():

        def succeeded(message_id: str = message_id) -> list[dict[str, Any]]:
            return stack.events("worker", "job succeeded", message_id)

        (done,) = wait(f"the {queue} job's success", 30, succeeded)
        assert done["queue"] == queue
    listed = {
        q["name"]: q for q in json.loads(stack.ricochet("status", "--all", "--json"))["queues"]
    }
    assert {"thumbnails", "email", "jobs"} <= set(listed)


def test_ricochet_job_answers_from_the_monitor_s_index(
    stack: Stack, quickstart: dict[str, Published]
) -> None:
    """`docker compose exec worker ricochet job ID` asks the monitor (the stack sets
    RICOCHET_MONITOR_URL), which answers as its API does on the published port."""
    job = quickstart["succeeded"]
    base = f"http://127.0.0.1:{stack.port('MONITOR_PORT')}/api/jobs/{job.message_id}"

    def indexed() -> dict[str, Any] | None:
        status, body = http_get(base)
        shown = json.loads(body) if status == 200 else None
        return shown if shown and shown["state"] == "succeeded" else None

    from_api = wait("the monitor's index to show the job succeeded", 30, indexed)
    said = stack.compose(
        "exec", "-T", "worker", "sh", "-c", f"ricochet job {job.message_id} --json 2>&1"
    )
    assert "read the journal since" not in said  # not read back: asked of the monitor
    shown = json.loads(said)
    assert shown["state"] == "succeeded"
    assert shown["attempts"] == from_api["attempts"]


def test_retried_job_waits_its_tier_then_succeeds(
    stack: Stack, quickstart: dict[str, Published]
) -> None:
    """The job fails, waits in the first tier (30 s, the broker's TTL) and succeeds after."""
    job = quickstart["retried"]
    retries = wait(
        "the job's retry",
        30,
        lambda: stack.events("worker", "job failed, retrying", job.message_id),
    )
    assert (retries[0]["attempt"], retries[0]["tier"], retries[0]["delay_ms"]) == (1, *FIRST_TIER)
    (done,) = wait(
        "the retried job's success",
        FIRST_TIER[1] / 1000 * 3,
        lambda: stack.events("worker", "job succeeded", job.message_id),
    )
    assert done["attempt"] == job.request.fail_times + 1


def test_failing_job_lands_in_the_failed_queue_and_the_monitor_logs_it(
    stack: Stack, quickstart: dict[str, Published]
) -> None:
    job = quickstart["failed"]
    (failed,) = wait(
        "the job's failure", 30, lambda: stack.events("worker", "job failed", job.message_id)
    )
    assert failed["kind"] == "permanent"
    (logged,) = wait(
        "the monitor's line", 30, lambda: stack.events("monitor", "job failed", job.message_id)
    )
    assert logged["level"] == "error"
    assert logged["kind"] == "permanent"
    assert logged["reason"].startswith("PermanentError: ")
    assert failed_copies(stack, job.message_id) == 1
    assert stack.queues()["jobs.failed"]["messages"] >= 1


def test_replay_runs_the_failed_job_again(stack: Stack, quickstart: dict[str, Published]) -> None:
    """The guide's replay puts the copy back on jobs; the worker runs it again from attempt 1,
    it fails again, and exactly one copy is back in the failed queue."""
    job = quickstart["failed"]
    wait("the failed copy", 30, lambda: failed_copies(stack, job.message_id) == 1)
    replay(stack, job.message_id, dry_run=False)
    failures = wait(
        "the replayed job's second failure",
        30,
        lambda: [
            e for e in stack.events("worker", "job failed", job.message_id) if e["attempt"] == 1
        ][1:],
    )
    assert failures[0]["kind"] == "permanent"
    wait(
        "the monitor's second line",
        30,
        lambda: len(stack.events("monitor", "job failed", job.message_id)) == 2,
    )
    assert failed_copies(stack, job.message_id) == 1


def test_a_retrying_job_is_seen_waiting_with_its_reason_then_cancelled(stack: Stack) -> None:
    """The operations guide's walk from a retry to a cancel: a job that always fails waits in
    jobs.retry.1; `ricochet waiting` lists it with the reason of its failure, the console's
    /waiting (opened on the commands' queue, jobs) shows it, and after the guide's `ricochet
    cancel` the worker acks it as cancelled when it comes due, instead of running it again."""
    request = {"report_id": "doomed", "fail": "always"}
    message_id = stack.ricochet("publish", "--type", "report", json.dumps(request)).strip()
    wait("the job's retry", 30, lambda: stack.events("worker", "job failed, retrying", message_id))
    listed = stack.ricochet("waiting", "--queue", "jobs", "--json").splitlines()
    (row,) = [r for r in map(json.loads, listed) if r["message_id"] == message_id]
    reason = "ReportBackendDown: report backend timed out for report doomed"
    assert (row["queue"], row["attempt"], row["reason"]) == ("jobs", 2, reason), row
    status, page = http_get(f"http://127.0.0.1:{stack.port('MONITOR_PORT')}/waiting")
    assert status == 200, page[:500]
    for shown in ("<code>jobs</code>", message_id, reason):
        assert shown.encode() in page, shown
    stack.run(f"docker compose exec worker {cancel_command().replace('MESSAGE_ID', message_id)}")
    (cancelled,) = wait(
        "the job's cancel",
        FIRST_TIER[1] / 1000 * 3,
        lambda: stack.events("worker", "job cancelled", message_id),
    )
    assert cancelled["attempt"] == 2
    assert len(stack.events("worker", "job failed, retrying", message_id)) == 1


def test_prometheus_scrapes_worker_and_monitor_with_the_shipped_rules(
    stack: Stack, quickstart: dict[str, Published]
) -> None:
    """Debian's Prometheus, with the stack's config: the worker, monitor and broker targets are
    up, the shipped rules are loaded and evaluate cleanly, and the worker's counters arrive."""
    base = f"http://127.0.0.1:{stack.port('PROMETHEUS_PORT')}/api/v1"

    def api(path: str) -> Any:
        status, body = http_get(f"{base}/{path}")
        assert status == 200, (path, body)
        return json.loads(body)["data"]

    def targets_up() -> bool:
        active = api("targets")["activeTargets"]
        health = {t["labels"]["job"]: t["health"] for t in active}
        return health == {"ricochet-worker": "up", "ricochet-monitor": "up", "rabbitmq": "up"}

    wait("every target up", 60, targets_up, every_s=2)
    shipped = yaml.safe_load((ROOT / "config" / "prometheus" / "rules.yml").read_text())
    wanted = {r["alert"] for g in shipped["groups"] for r in g["rules"]}

    def rules_evaluated() -> dict[str, str] | None:
        groups = api("rules")["groups"]
        rules = {r["name"]: r for g in groups for r in g["rules"]}
        assert set(rules) == wanted
        evaluated = all(not r["lastEvaluation"].startswith("0001") for r in rules.values())
        return {n: r["health"] for n, r in rules.items()} if evaluated else None

    health = wait("every rule evaluated", 60, rules_evaluated, every_s=2)
    assert set(health.values()) == {"ok"}, health

    def failed_counted() -> bool:
        result = api('query?query=ricochet_jobs_total{outcome="failed"}')["result"]
        return any(float(sample["value"][1]) >= 1 for sample in result)

    wait("the worker's failed-job counter in Prometheus", 60, failed_counted, every_s=2)


def test_stopping_the_worker_lets_the_job_in_flight_finish(stack: Stack) -> None:
    """`docker compose stop worker` sends SIGTERM mid-job: the job finishes and is acked within
    the grace period, the worker exits 0, nothing goes back to the queue."""
    work_s = 8
    message_id = stack.ricochet(
        "publish", "--type", "report", json.dumps({"report_id": "drain", "work_s": work_s})
    ).strip()

    def in_flight() -> bool:
        metrics = stack.metrics_inside("worker")
        return (
            re.search(r'^ricochet_jobs_in_flight\{queue="jobs"\} 1\.0$', metrics, re.M) is not None
        )

    wait("the job in flight", 20, in_flight, every_s=0.5)
    started = time.monotonic()
    stack.compose("stop", "worker", timeout_s=GRACE_S + 30)
    stopped_s = time.monotonic() - started
    assert stopped_s < GRACE_S, f"the stop took {stopped_s:.0f} s: killed at the grace period?"
    draining = [e for e in stack.logs("worker") if e["event"] == "draining"]
    assert draining[-1]["jobs"] == 1, "SIGTERM did not come mid-job"
    (done,) = stack.events("worker", "job succeeded", message_id)
    assert done["attempt"] == 1
    (worker,) = [c for c in stack.containers(all_states=True) if c["Service"] == "worker"]
    assert worker["ExitCode"] == 0, worker
    stack.compose("start", "worker")
    stack.wait_healthy(("worker",))
    assert stack.queues()["jobs"]["messages"] == 0
    assert stack.events("worker", "job succeeded", message_id) == [done]


def test_scale_out_to_three_workers(stack: Stack) -> None:
    """`docker compose up -d --scale worker=3`: three workers consume jobs."""
    stack.compose("up", "-d", "--scale", "worker=3")
    wait(
        "three consumers on jobs", 120, lambda: stack.queues()["jobs"]["consumers"] == 3, every_s=2
    )
    workers = [c for c in stack.containers() if c["Service"] == "worker"]
    assert len(workers) == 3, workers


def test_broker_volume_keeps_the_failed_copy_across_down_and_up(
    stack: Stack, quickstart: dict[str, Published]
) -> None:
    """`docker compose down`, then the README's `docker compose up` again: the broker's volume
    still holds the failed copy (the failed queue is durable and its messages persistent)."""
    job = quickstart["failed"]
    wait("the failed copy", 30, lambda: failed_copies(stack, job.message_id) == 1)
    stack.stop()
    assert stack.containers(all_states=True) == []
    stack.start()
    assert failed_copies(stack, job.message_id) == 1
    assert stack.queues()["jobs.failed"]["messages"] >= 1
