"""The command line: a thin wrapper that builds the settings and runs one command."""

import asyncio
import datetime as dt
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import click

from ricochet.broker.amqp import CONNECTION_ERRORS
from ricochet.broker.cancels import publish_cancel
from ricochet.broker.connection import connect, connection_name
from ricochet.broker.publish import header_value, is_json
from ricochet.broker.record import declare_recorded
from ricochet.broker.topology import Names, plan
from ricochet.client.client import Client
from ricochet.errors import BrokerUnavailable, ConfigError, InvalidJob, RicochetError
from ricochet.handlers.invoker import Invoker, load_handler
from ricochet.headers import MAX_RETRIES
from ricochet.log import configure_logging
from ricochet.monitor.monitor import run_monitor
from ricochet.observe.metrics import Metrics
from ricochet.ops.doctor import run_doctor
from ricochet.ops.failed_queue import discard_failed, list_failed, show_failed
from ricochet.ops.replay import replay as replay_failed
from ricochet.ops.report import (
    checks_table,
    copy_text,
    discard_report,
    failed_list_table,
    plan_table,
    replay_report,
    status_table,
)
from ricochet.ops.scan import under_signals
from ricochet.ops.selection import Outcome, Selection
from ricochet.ops.status import read_status
from ricochet.settings import Settings, load_client_settings, load_settings
from ricochet.worker.worker import run_worker

# A click command function, as its decorators take and give it.
Command = Callable[..., Any]
EXIT_RUNTIME = 1
EXIT_CONFIG = 2


def _datetime(text: str) -> dt.datetime:
    """An ISO-8601 date-time from the command line (the client refuses one without an offset)."""
    try:
        return dt.datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not an ISO-8601 date-time") from None


def _settings(service: bool = False) -> Settings:
    """Settings, and logging configured: services log to stdout, one-shot commands to stderr."""
    try:
        settings = load_settings()
    except ConfigError as error:
        click.echo(f"ricochet: {error}", err=True)
        sys.exit(EXIT_CONFIG)
    configure_logging(
        settings.log_level, settings.log_format, sys.stdout if service else sys.stderr
    )
    return settings


def _run(main: Awaitable[Any]) -> Any:
    """Run a command's coroutine, turning ricochet's errors into exit codes."""
    try:
        return asyncio.run(main)  # type: ignore[arg-type]
    except ConfigError as error:
        click.echo(f"ricochet: {error}", err=True)
        sys.exit(EXIT_CONFIG)
    except (BrokerUnavailable, RicochetError) as error:
        click.echo(f"ricochet: {error}", err=True)
        sys.exit(EXIT_RUNTIME)
    except CONNECTION_ERRORS as error:
        # A command that reads or moves failed copies leaves nothing half done (section 16).
        click.echo(f"ricochet: the connection to the broker was lost: {error!r}", err=True)
        sys.exit(EXIT_RUNTIME)


async def _with_connection(settings: Settings, role: str, fn: Callable[..., Awaitable[Any]]) -> Any:
    connection = await connect(
        settings.amqp_url, connection_name(role, settings.queue), settings.connect_timeout_s
    )
    try:
        return await fn(connection)
    finally:
        await connection.close()


def _take_copies(
    settings: Settings,
    role: str,
    command: str,
    take: Callable[..., Awaitable[Outcome]],
    selection: Selection,
    limit: int | None,
    dry_run: bool,
) -> Outcome:
    """take() (replay, or discard) the selected failed copies, or with dry_run list them, on a
    connection named for its role, under Ctrl-C: a first signal ends it after the copy in hand."""
    names = Names(settings.queue)
    return _run(  # type: ignore[no-any-return]
        _with_connection(
            settings,
            role,
            lambda c: under_signals(
                lambda stop: take(
                    c,
                    names,
                    selection,
                    limit=limit,
                    dry_run=dry_run,
                    stop=stop,
                    management_url=settings.management_url,
                ),
                names,
                command,
            ),
        )
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ricochet")
def main() -> None:
    """ricochet: background jobs from RabbitMQ, retried with backoff by the broker itself.

    Settings come from RICOCHET_* environment variables (see the README).
    """


@main.command()
def worker() -> None:
    """Declare the topology, then consume the main queue and run the handler."""
    settings = _settings(service=True)
    try:
        invoker = Invoker(load_handler(settings.handler), settings.handler_timeout_s)
    except ConfigError as error:
        click.echo(f"ricochet: {error}", err=True)
        sys.exit(EXIT_CONFIG)
    _run(run_worker(settings, invoker, Metrics(settings.queue)))


@main.command()
def monitor() -> None:
    """Log and alert on every failed job; never takes anything out of the failed queue."""
    settings = _settings(service=True)
    _run(run_monitor(settings, Metrics(settings.queue)))


def _filters(*, kind: bool = True) -> Callable[[Command], Command]:
    """The options that select failed copies (replay has no --kind: a copy's kind is why it
    failed, and replay is for the jobs that may now succeed whatever it was)."""
    kind_option = click.option(
        "--kind",
        type=click.Choice(["exhausted", "permanent", "poison"]),
        help="Only copies that failed this way.",
    )
    options = [
        click.option("--reason", help="Only copies whose failed-reason contains TEXT."),
        click.option("--type", "job_type", help="Only copies of this job type."),
        *([kind_option] if kind else []),
        click.option("--message-id", help="Only the copy (or copies) with this message id."),
        click.option("--limit", type=click.IntRange(min=1), help="At most N copies."),
    ]

    def decorate(fn: Command) -> Command:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate


_group_by = click.option(
    "--group-by",
    type=click.Choice(["reason", "type", "kind"]),
    help="Print counts per reason, type or kind instead of one line per copy.",
)


@main.command()
@_filters(kind=False)
@click.option("--dry-run", is_flag=True, help="List what would move; move nothing.")
@_group_by
def replay(
    reason: str | None,
    job_type: str | None,
    message_id: str | None,
    limit: int | None,
    dry_run: bool,
    group_by: str | None,
) -> None:
    """Move failed copies back to the main queue with a fresh retry budget."""
    settings = _settings()
    selection = Selection(reason=reason, type=job_type, message_id=message_id)
    result = _take_copies(settings, "replay", "replay", replay_failed, selection, limit, dry_run)
    click.echo(replay_report(result, dry_run, group_by, settings.queue))


@main.group()
def failed() -> None:
    """Look at the failed queue's copies, and discard the ones that must never run.

    list and show take nothing from the queue: every copy they read goes back, in its order.
    """


@failed.command("list")
@_filters()
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line instead.")
def failed_list(
    reason: str | None,
    job_type: str | None,
    kind: str | None,
    message_id: str | None,
    limit: int | None,
    as_json: bool,
) -> None:
    """One line per failed copy: message_id, type, kind, retry_count, failed_at, reason."""
    settings = _settings()
    names = Names(settings.queue)
    selection = Selection(reason=reason, type=job_type, kind=kind, message_id=message_id)
    result = _run(
        _with_connection(
            settings,
            "failed",
            lambda c: list_failed(
                c, names, selection, limit=limit, management_url=settings.management_url
            ),
        )
    )
    if as_json:
        for failure in result.selected:
            click.echo(json.dumps(failure.as_dict()))
    else:
        click.echo(failed_list_table(result.selected))
    click.echo(f"{len(result.selected)} of {result.depth} copies in {names.failed}", err=True)


@failed.command("show")
@click.argument("message_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def failed_show(message_id: str, as_json: bool) -> None:
    """Everything about one failed copy: properties, headers, traceback and body."""
    settings = _settings()
    names = Names(settings.queue)
    found = _run(
        _with_connection(
            settings,
            "failed",
            lambda c: show_failed(c, names, message_id, management_url=settings.management_url),
        )
    )
    if not found:
        click.echo(f"ricochet: no copy with message_id {message_id!r} in {names.failed}", err=True)
        sys.exit(EXIT_RUNTIME)
    if as_json:
        for details in found:
            click.echo(json.dumps(details.as_dict(), indent=2))
    else:
        click.echo("\n\n".join(copy_text(d) for d in found))
    if len(found) > 1:
        click.echo(f"{len(found)} copies have this message_id", err=True)


@failed.command("discard")
@_filters()
@click.option("--dry-run", is_flag=True, help="List what would be discarded; remove nothing.")
@click.option("--yes", is_flag=True, help="Really remove the matching copies, for good.")
@_group_by
def failed_discard(
    reason: str | None,
    job_type: str | None,
    kind: str | None,
    message_id: str | None,
    limit: int | None,
    dry_run: bool,
    yes: bool,
    group_by: str | None,
) -> None:
    """Remove the matching failed copies for good; the others stay, in their order."""
    if not (yes or dry_run):
        click.echo(
            "ricochet: failed discard removes copies for good and removed nothing: add --yes "
            "to remove them, or --dry-run to list them first",
            err=True,
        )
        sys.exit(EXIT_CONFIG)
    selection = Selection(reason=reason, type=job_type, kind=kind, message_id=message_id)
    result = _take_copies(
        _settings(), "failed", "failed discard", discard_failed, selection, limit, dry_run
    )
    click.echo(discard_report(result, dry_run, group_by))


@main.command()
@click.option("--dry-run", is_flag=True, help="Print the plan without touching the broker.")
def topology(dry_run: bool) -> None:
    """Declare the queues, exchanges and bindings, and print them."""
    settings = _settings()
    if dry_run:
        click.echo(plan_table(plan(settings)))
        if settings.queue_type == "quorum":
            click.echo(
                "\nOn RabbitMQ 4.0 and later, the queues ricochet consumes from (the main and the "
                "failed queues) also get x-delivery-limit=-1: no delivery limit drops a job."
            )
        return
    declared = _run(_with_connection(settings, "topology", lambda c: declare_recorded(c, settings)))
    click.echo(plan_table(declared))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def status(as_json: bool) -> None:
    """Depth and consumers of the main queue, each tier, and the failed queues."""
    settings = _settings()
    rows = _run(_with_connection(settings, "status", lambda c: read_status(c, settings)))
    if as_json:
        click.echo(json.dumps({"queues": [r.as_dict() for r in rows]}, indent=2))
    else:
        click.echo(status_table(rows))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def doctor(as_json: bool) -> None:
    """Check the broker's queues, exchanges, bindings and policies against the settings.

    Read-only, through the management API (RICOCHET_MANAGEMENT_URL). Exit 1 when a check fails.
    """
    settings = _settings()
    checks = _run(run_doctor(settings))
    ok = all(c.status != "fail" for c in checks)
    if as_json:
        click.echo(json.dumps({"ok": ok, "checks": [c.as_dict() for c in checks]}, indent=2))
    else:
        click.echo(checks_table([(c.check, c.status, c.detail) for c in checks]))
    sys.exit(0 if ok else EXIT_RUNTIME)


@main.command()
@click.option("--type", "job_type", help="AMQP type property (Router dispatch).")
@click.option("--message-id", help="Message id (default: a new UUID).")
@click.option("--header", "headers", multiple=True, metavar="K=V", help="Application header.")
@click.option(
    "--delay", type=float, metavar="SECONDS", help="Run it no earlier than SECONDS from now."
)
@click.option(
    "--run-at",
    type=_datetime,
    metavar="ISO-8601",
    help="Run it no earlier than this time, with a UTC offset or Z (2026-11-24T10:00:00Z).",
)
@click.argument("payload")
def publish(
    job_type: str | None,
    message_id: str | None,
    headers: tuple[str, ...],
    delay: float | None,
    run_at: dt.datetime | None,
    payload: str,
) -> None:
    """Publish one persistent job with PAYLOAD as its body."""
    parsed: dict[str, Any] = {}
    for item in headers:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not K=V", param_hint="--header")
        parsed[key] = header_value(value)
    # The client sets max-retries from its own argument, and checks it there.
    max_retries = parsed.pop(MAX_RETRIES, None)
    settings = _settings()
    client = Client(settings.amqp_url, settings.queue, connect_timeout_s=settings.connect_timeout_s)

    async def enqueue() -> str:
        try:
            return await client.enqueue(
                job_type,
                payload.encode(),
                content_type="application/json" if is_json(payload) else "text/plain",
                message_id=message_id,
                max_retries=max_retries,
                headers=parsed,
                delay=delay,
                run_at=run_at,
            )
        finally:
            await client.close()

    try:
        sent = _run(enqueue())
    except InvalidJob as error:
        click.echo(f"ricochet: {error}", err=True)
        sys.exit(EXIT_CONFIG)
    click.echo(sent)


@main.command()
@click.argument("message_id")
@click.option("--queue", default=None, help="the job's queue (default: RICOCHET_QUEUE)")
def cancel(message_id: str, queue: str | None) -> None:
    """Cancel the job MESSAGE_ID of the queue: while it waits (scheduled, in a retry tier, or
    after a RetryLater) it never runs again; an unknown or finished job, or a job of another
    queue with the same id, is left as it is."""
    settings = _settings()
    try:
        names = Names(load_client_settings(settings.amqp_url, queue).queue)
    except ConfigError as error:
        click.echo(f"ricochet: {error}", err=True)
        sys.exit(EXIT_CONFIG)
    _run(_with_connection(settings, "cancel", lambda c: publish_cancel(c, names, message_id)))
    click.echo(f"cancelled {message_id}")
