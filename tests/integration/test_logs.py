"""Worker logs: one JSON object per line, with the job's fields, and never the broker password."""

import asyncio
import json
import signal
from pathlib import Path

from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet.delivery.failed import TRACEBACK_MAX_CHARS

from tests.support import AMQP_URL, consumers, make_settings, publish, ricochet_env, spawn, wait_for


async def test_job_lines_carry_job_fields_and_no_secret(
    connection: AbstractConnection, channel: AbstractChannel, queue_name: str, tmp_path: Path
) -> None:
    """A job that fails once then succeeds logs a retry (with tier and delay) and a success,
    each line a JSON object with message_id, type, attempt and max_attempts."""
    output = tmp_path / "worker.log"
    settings = make_settings(queue_name, handler="tests.handlers:flaky", retry_delay_ms=20)
    with spawn(["worker"], ricochet_env(settings), output) as worker:
        await wait_for(lambda: consumers(connection, queue_name), 20, "the worker to consume")
        await publish(channel, queue_name, '{"fail": 1}', message_id="logged", type="demo")
        await wait_for(lambda: '"job succeeded"' in output.read_text(), 15, "the success line")
        worker.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(worker.wait, 20) == 0

    text = output.read_text()
    password = AMQP_URL.split("@")[0].rsplit(":", 1)[1]
    assert f":{password}@" not in text
    lines = [json.loads(line) for line in text.splitlines()]  # every line is one JSON object
    jobs = {line["event"]: line for line in lines if line.get("message_id") == "logged"}
    retry, success = jobs["job failed, retrying"], jobs["job succeeded"]
    assert retry["level"] == "warning"
    assert (retry["attempt"], retry["max_attempts"], retry["type"]) == (1, 4, "demo")
    assert retry["tier"] == f"{queue_name}.retry.1"
    assert retry["delay_ms"] == 20
    assert retry["error"] == "ConnectionError: flaky on attempt 1"
    assert (success["attempt"], success["level"]) == (2, "info")
    assert all("timestamp" in line for line in lines)


async def test_failed_job_line_is_capped_and_scrubbed(
    connection: AbstractConnection, channel: AbstractChannel, queue_name: str, tmp_path: Path
) -> None:
    """A job failing with a 200 kB message holding a database URL logs one 'job failed' line
    whose traceback is capped like the failed-traceback header, and without the password."""
    output = tmp_path / "worker.log"
    settings = make_settings(queue_name, handler="tests.handlers:leaky")
    with spawn(["worker"], ricochet_env(settings), output) as worker:
        await wait_for(lambda: consumers(connection, queue_name), 20, "the worker to consume")
        await publish(channel, queue_name, "{}", message_id="leaky")
        await wait_for(lambda: '"job failed"' in output.read_text(), 15, "the failure line")
        worker.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(worker.wait, 20) == 0

    text = output.read_text()
    assert "hunter2" not in text
    (line,) = [json.loads(line) for line in text.splitlines() if '"job failed"' in line]
    assert len(line["exception"]) <= TRACEBACK_MAX_CHARS
    assert line["exception"].endswith("postgresql://app:***@db/orders")
