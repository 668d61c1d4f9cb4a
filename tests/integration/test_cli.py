"""The commands as a user runs them: exit codes, messages and output."""

import datetime as dt
import json

from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet.names import Names

from tests.support import exists, make_settings, ricochet_env, run_cli, take, take_waiting


async def test_invalid_setting_exits_2_before_touching_the_broker(
    connection: AbstractConnection, queue_name: str
) -> None:
    """RICOCHET_MAX_RETRIES=99: exit 2, one line naming variable, value, range; nothing declared."""
    env = ricochet_env(make_settings(queue_name), RICOCHET_MAX_RETRIES="99")
    for command in (["worker"], ["topology"], ["status"]):
        result = run_cli(command, env)
        assert result.returncode == 2, result
        assert (
            result.stderr.strip() == "ricochet: RICOCHET_MAX_RETRIES='99' is invalid: allowed 0-25"
        )
    assert not await exists(connection, queue_name)


async def test_bad_handler_exits_2(connection: AbstractConnection, queue_name: str) -> None:
    """A handler that cannot be imported stops the worker with exit 2, before any declaration."""
    env = ricochet_env(make_settings(queue_name, handler="no.such.module:handle"))
    result = run_cli(["worker"], env)
    assert result.returncode == 2
    assert "RICOCHET_HANDLER='no.such.module:handle' is invalid: cannot import it" in result.stderr
    assert not await exists(connection, queue_name)


def test_unreachable_broker_exits_1(queue_name: str) -> None:
    """No broker: retries with backoff for the connect timeout, then exit 1; no secret shown."""
    settings = make_settings(
        queue_name, amqp_url="amqp://user:hunter2@127.0.0.1:1/", connect_timeout_s=1.5
    )
    result = run_cli(["worker"], ricochet_env(settings))
    assert result.returncode == 1
    assert "unreachable after 1.5 s" in result.stderr
    assert "broker unreachable, retrying" in result.stdout
    assert "hunter2" not in result.stdout + result.stderr
    assert "user:***@" in result.stderr


async def test_conflicting_main_queue_exits_2(channel: AbstractChannel, queue_name: str) -> None:
    """A main queue declared elsewhere with other arguments: exit 2 saying what differs."""
    await channel.declare_queue(queue_name, durable=True)  # classic, no dead-lettering
    result = run_cli(["topology"], ricochet_env(make_settings(queue_name)))
    assert result.returncode == 2
    assert f"queue {queue_name!r} conflicts with the settings" in result.stderr
    assert "x-dead-letter-exchange" in result.stderr or "x-queue-type" in result.stderr


async def test_topology_status_publish(
    connection: AbstractConnection, channel: AbstractChannel, queue_name: str
) -> None:
    """topology --dry-run touches nothing; topology declares; publish queues; status shows it."""
    env = ricochet_env(make_settings(queue_name, max_retries=2, retry_delay_ms=1000))
    dry = run_cli(["topology", "--dry-run"], env)
    assert dry.returncode == 0
    assert f"{queue_name}.retry.2" in dry.stdout
    assert "2s" in dry.stdout
    assert not await exists(connection, queue_name)

    declared = run_cli(["topology"], env)
    assert declared.returncode == 0, declared.stderr
    assert await exists(connection, Names(queue_name).tier(2))

    published = run_cli(
        [
            "publish",
            "--type",
            "report",
            "--message-id",
            "cli-1",
            "--header",
            "max-retries=1",
            '{"a": 1}',
        ],
        env,
    )
    assert published.returncode == 0, published.stderr
    assert published.stdout.strip() == "cli-1"

    status = run_cli(["status", "--json"], env)
    assert status.returncode == 0, status.stderr
    rows = {q["name"]: q for q in json.loads(status.stdout)["queues"]}
    assert rows[queue_name]["messages"] == 1
    assert rows[f"{queue_name}.retry.2"]["delay_ms"] == 2000
    assert rows[f"{queue_name}.failed"]["messages"] == 0

    [message] = await take(channel, queue_name, 1)
    assert message.body == b'{"a": 1}'
    assert (message.message_id, message.type, message.delivery_mode) == ("cli-1", "report", 2)
    assert message.headers["max-retries"] == 1
    assert message.content_type == "application/json"


def test_publish_without_queue_is_a_clear_error(queue_name: str) -> None:
    """Publishing before any topology exists fails loudly instead of dropping the job."""
    result = run_cli(["publish", "{}"], ricochet_env(make_settings(queue_name)))
    assert result.returncode == 1
    assert "does not exist" in result.stderr


async def test_publish_schedules_with_delay_or_run_at(
    connection: AbstractConnection, channel: AbstractChannel, queue_name: str
) -> None:
    """--delay and --run-at go through the client: a run-at header in UTC, or exit 2 with the
    client's reason and nothing published."""
    env = ricochet_env(make_settings(queue_name))
    assert run_cli(["topology"], env).returncode == 0
    before = dt.datetime.now(dt.UTC)
    delayed = run_cli(["publish", "--message-id", "d", "--delay", "90", "{}"], env)
    assert delayed.returncode == 0, delayed.stderr
    after = dt.datetime.now(dt.UTC)
    paris = dt.timezone(dt.timedelta(hours=1))
    when = (after + dt.timedelta(days=2)).astimezone(paris).replace(microsecond=0)
    at = run_cli(["publish", "--message-id", "a", "--run-at", when.isoformat(), "{}"], env)
    assert at.returncode == 0, at.stderr

    for args, says in [
        (["--delay", "-1"], "delay=-1.0 is negative"),
        (["--delay", str(31 * 86400)], "is over 30 days"),
        (["--run-at", "2027-01-05T10:00:00"], "is naive"),
        (["--run-at", "next tuesday"], "is not an ISO-8601 date-time"),
        (["--delay", "5", "--run-at", "2027-01-05T10:00:00Z"], "delay and run_at are both given"),
    ]:
        refused = run_cli(["publish", *args, "{}"], env)
        assert refused.returncode == 2, refused
        assert says in refused.stderr

    got = {m: await take_waiting(channel, m) for m in ("d", "a")}
    delay = dt.timedelta(seconds=90)
    run_at = dt.datetime.fromisoformat(str(got["d"].headers["run-at"]))
    assert before + delay <= run_at <= after + delay + dt.timedelta(milliseconds=1)
    assert got["a"].headers["run-at"] == when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
