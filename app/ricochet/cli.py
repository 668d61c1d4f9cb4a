"""The command line: a thin wrapper that builds the settings and runs one command."""

import asyncio
import datetime as dt
import json
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import click
from aio_pika.abc import AbstractConnection

from ricochet import ladders
from ricochet.broker.amqp import CONNECTION_ERRORS
from ricochet.broker.cancels import publish_cancel
from ricochet.broker.connection import connect, connection_name
from ricochet.broker.journal import now_ms, write_entries
from ricochet.broker.plan import plan
from ricochet.broker.publish import header_value, is_json
from ricochet.broker.record import declare_recorded
from ricochet.client.client import Client
from ricochet.client.message import cancelled_id
from ricochet.errors import BrokerUnavailable, ConfigError, InvalidJob, RicochetError
from ricochet.handlers.invoker import Invoker, load_handler
from ricochet.handlers.router import Router
from ricochet.headers import MAX_RETRIES, RETRY_DELAYS
from ricochet.log import configure_logging, url_host
from ricochet.names import Names
from ricochet.observe.metrics import Metrics
from ricochet.ops.ask_monitor import MonitorUnanswered, job_from_monitor, waiting_from_monitor
from ricochet.ops.checks import worst_first
from ricochet.ops.doctor import run_doctor
from ricochet.ops.failed_queue import discard_failed, list_failed, show_failed
from ricochet.ops.jobs import (
    STATES,
    JobFilter,
    Read,
    decode_cursor,
    moved_entries,
    page,
    read_jobs,
)
from ricochet.ops.migrate import migrate as run_migrate
from ricochet.ops.queues import held_queues
from ricochet.ops.reference import setting_rows, settings_text
from ricochet.ops.replay import replay as replay_failed
from ricochet.ops.report import (
    QueueStatus,
    TypePolicy,
    checks_table,
    copy_text,
    discard_report,
    failed_list_table,
    job_text,
    jobs_table,
    plan_table,
    replay_report,
    schedules_table,
    status_table,
    type_policies,
    types_table,
    waiting_summary,
    waiting_table,
    waiting_text,
)
from ricochet.ops.scan import under_signals
from ricochet.ops.schedules import read_schedules
from ricochet.ops.selection import Outcome, Selection
from ricochet.ops.status import read_status
from ricochet.ops.waiting import list_waiting, show_waiting
from ricochet.ops.waits import Listing, iso
from ricochet.processes.cpus import process_count
from ricochet.settings import (
    Settings,
    allowed,
    load_settings,
    option_name,
    queue_problem,
    variable_name,
)

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


def _settings(
    service: bool = False, queue: str | None = None, options: Mapping[str, str] | None = None
) -> Settings:
    """Settings (with the queue a command was given in place of RICOCHET_QUEUE, and the options
    in place of their variables), and logging configured: services log to stdout, one-shot
    commands to stderr."""
    if queue is not None and (problem := queue_problem(queue)):
        click.echo(f"ricochet: --queue {queue!r} is invalid: {problem}", err=True)
        sys.exit(EXIT_CONFIG)
    try:
        settings = load_settings(options)
    except ConfigError as error:
        click.echo(f"ricochet: {error}", err=True)
        sys.exit(EXIT_CONFIG)
    # A command says itself what went wrong: a library's error line (aiormq's, on a refused
    # connection) would only repeat it.
    configure_logging(
        settings.log_level,
        settings.log_format,
        sys.stdout if service else sys.stderr,
        logging.WARNING if service else logging.CRITICAL,
    )
    return settings if queue is None else settings.model_copy(update={"queue": queue})


_queue = click.option(
    "--queue", metavar="Q", default=None, help="The queue (default: RICOCHET_QUEUE)."
)
_all_queues = click.option(
    "--all",
    "all_queues",
    is_flag=True,
    help="Every ricochet queue the broker holds (read through the management API).",
)


def _each_queue(settings: Settings, all_queues: bool) -> list[Settings]:
    """The settings once per queue a command covers: the one given, or with --all each one
    the vhost holds."""
    if not all_queues:
        return [settings]
    names = _run(held_queues(settings))
    return [settings.model_copy(update={"queue": name}) for name in names]


def _run(main: Awaitable[Any]) -> Any:
    """Run a command's coroutine, turning ricochet's errors into exit codes.

    The long-running services (worker, its processes' parent, monitor) are imported by their
    commands only: the console's templates and the processes' supervision are a quarter of a
    short command's start, paid on every call of a script."""
    try:
        return asyncio.run(main)  # type: ignore[arg-type]
    except (ConfigError, InvalidJob) as error:  # settings or arguments out of bounds
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
    connection = await connect(settings.amqp_url, connection_name(role, settings.queue), 0)
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
    event: str,
) -> Outcome:
    """take() (replay, or discard) the selected failed copies, or with dry_run list them, on a
    connection named for its role, under Ctrl-C: a first signal ends it after the copy in hand.
    What it took is written to the journal as event (replayed, discarded)."""
    names = Names(settings.queue)

    async def taken(connection: AbstractConnection) -> Outcome:
        began_ms = now_ms()
        outcome: Outcome = await under_signals(
            lambda stop: take(
                connection,
                names,
                selection,
                limit=limit,
                dry_run=dry_run,
                stop=stop,
                management_url=settings.management_url,
            ),
            names,
            command,
        )
        if not dry_run and settings.journal == "on":
            moved = moved_entries(names.queue, outcome.selected, event, began_ms)
            await write_entries(connection, moved)
        return outcome

    return _run(_with_connection(settings, role, taken))  # type: ignore[no-any-return]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ricochet-jobs")
def main() -> None:
    """ricochet: background jobs from RabbitMQ, retried with backoff by the broker itself.

    Settings come from RICOCHET_* environment variables: `ricochet settings` lists them.
    """
    # RICOCHET_HANDLER names a module of the folder ricochet runs in, as uvicorn's, Celery's
    # and Dramatiq's app do; a console script's path starts with its own folder instead. The
    # worker's processes inherit the path.
    if (here := os.getcwd()) not in sys.path:
        sys.path.insert(0, here)


# The settings a person types most, which `ricochet worker` takes as options too.
WORKER_OPTIONS = {
    "handler": "MODULE:ATTR",
    "queues": "Q[=N],...",
    "processes": "N|auto",
    "prefetch": "N",
    "log_level": "LEVEL",
}


def _setting_options(fn: Command) -> Command:
    """An option per WORKER_OPTIONS setting, its help naming the variable it overrides and what
    it allows (the words of settings.py)."""
    for name, metavar in reversed(WORKER_OPTIONS.items()):
        field = Settings.model_fields[name]
        fn = click.option(
            option_name(name),
            name,
            metavar=metavar,
            help=f"Overrides {variable_name(name)} ({allowed(field)}).",
        )(fn)
    return fn


@main.command()
@_setting_options
def worker(**options: str | None) -> None:
    """Declare the topology, then consume the main queue (or RICOCHET_QUEUES) and run the
    handler (in RICOCHET_PROCESSES worker processes)."""
    given = {name: value for name, value in options.items() if value is not None}
    settings = _settings(service=True, options=given)
    processes = process_count(settings.processes)
    if processes > 1:
        from ricochet.processes.parent import run_processes  # see _run

        sys.exit(run_processes(settings, processes))
    try:
        invoker = Invoker(load_handler(settings.handler), settings.handler_timeout_s)
    except ConfigError as error:
        click.echo(f"ricochet: {error}", err=True)
        sys.exit(EXIT_CONFIG)
    from ricochet.worker.worker import run_worker  # see _run

    _run(run_worker(settings, invoker, Metrics(*settings.queue_names)))


@main.command("settings")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def settings_reference(as_json: bool) -> None:
    """Every setting: its variable, default, what it allows and what it means (read from the
    environment, or from the file RICOCHET_ENV_FILE names; the environment wins)."""
    rows = setting_rows()
    if as_json:
        click.echo(json.dumps([row.as_dict() for row in rows], indent=2))
    else:
        click.echo(settings_text(rows))


@main.command()
def monitor() -> None:
    """Log and alert on every failed job; never takes anything out of the failed queue."""
    settings = _settings(service=True)
    from ricochet.monitor.monitor import run_monitor  # see _run

    _run(run_monitor(settings, Metrics(*settings.queue_names)))


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
@_queue
def replay(
    queue: str | None,
    reason: str | None,
    job_type: str | None,
    message_id: str | None,
    limit: int | None,
    dry_run: bool,
    group_by: str | None,
) -> None:
    """Move failed copies back to the main queue with a fresh retry budget."""
    settings = _settings(queue=queue)
    selection = Selection(reason=reason, type=job_type, message_id=message_id)
    result = _take_copies(
        settings, "replay", "replay", replay_failed, selection, limit, dry_run, "replayed"
    )
    click.echo(replay_report(result, dry_run, group_by, settings.queue))


@main.group()
def failed() -> None:
    """Look at the failed queue's copies, and discard the ones that must never run.

    list and show take nothing from the queue: every copy they read goes back, in its order.
    """


@failed.command("list")
@_filters()
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line instead.")
@_queue
def failed_list(
    queue: str | None,
    reason: str | None,
    job_type: str | None,
    kind: str | None,
    message_id: str | None,
    limit: int | None,
    as_json: bool,
) -> None:
    """One line per failed copy: message_id, type, kind, retry_count, failed_at, reason."""
    settings = _settings(queue=queue)
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
@_queue
def failed_show(queue: str | None, message_id: str, as_json: bool) -> None:
    """Everything about one failed copy: properties, headers, traceback and body."""
    settings = _settings(queue=queue)
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
@_queue
def failed_discard(
    queue: str | None,
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
        _settings(queue=queue),
        "failed",
        "failed discard",
        discard_failed,
        selection,
        limit,
        dry_run,
        "discarded",
    )
    click.echo(discard_report(result, dry_run, group_by))


def _type_policies(settings: Settings) -> list[TypePolicy] | None:
    """The job types of RICOCHET_HANDLER with their own retry shape, when it is set: its module
    is imported, as the worker does. None when it is not set, or cannot be imported (said on
    stderr: the command goes on without them)."""
    if "handler" not in settings.model_fields_set:
        return None
    try:
        return type_policies(load_handler(settings.handler))
    except ConfigError as error:
        click.echo(f"ricochet: job types not shown: {error}", err=True)
        return None


def _echo_types(policies: list[TypePolicy] | None) -> None:
    if policies is not None:
        click.echo(f"\n{types_table(policies)}")


@main.command()
@click.option("--dry-run", is_flag=True, help="Print the plan without touching the broker.")
def topology(dry_run: bool) -> None:
    """Declare the queues, exchanges and bindings (of every queue of RICOCHET_QUEUES), and
    print them, with the job types of RICOCHET_HANDLER (when set) that have a ladder or timeout
    of their own."""
    settings = _settings()
    policies = _type_policies(settings)
    each = settings.per_queue()
    if dry_run:
        click.echo(plan_table(*(plan(queue) for queue in each)))
        if settings.queue_type == "quorum":
            click.echo(
                "\nOn RabbitMQ 4.0 and later, the queues ricochet consumes from (the main and the "
                "failed queues) also get x-delivery-limit=-1: no delivery limit drops a job."
            )
        _echo_types(policies)
        return
    declared = [
        _run(_with_connection(queue, "topology", lambda c, q=queue: declare_recorded(c, q)))
        for queue in each
    ]
    click.echo(plan_table(*declared))
    _echo_types(policies)


@main.command()
@click.option("--dry-run", is_flag=True, help="Say what would be moved, moving nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def migrate(dry_run: bool, as_json: bool) -> None:
    """Move what an earlier ricochet left in the vhost (per-queue cancel stores and delay
    levels), so that no worker's start reads them again (docs/deploying.md, "Upgrading from an
    earlier ricochet").

    Refuses while a worker of an earlier version is connected. Old levels that still hold jobs
    stay (they pass them on when due): exit 1 then, and run it again once they are empty.
    """
    steps = _run(run_migrate(_settings(), dry_run))
    done = all(step.done for step in steps)
    if as_json:
        shown = {"done": done, "dry_run": dry_run, "steps": [s.as_dict() for s in steps]}
        click.echo(json.dumps(shown, indent=2))
    elif not steps:
        click.echo("nothing of an earlier ricochet in this vhost (dry run: nothing written)")
    else:
        status = "would" if dry_run else "done"
        rows = [(f"{s.what} {s.name}", status if s.done else "kept", s.detail) for s in steps]
        click.echo(checks_table(rows))
    sys.exit(0 if done else EXIT_RUNTIME)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@_queue
@_all_queues
def status(queue: str | None, all_queues: bool, as_json: bool) -> None:
    """Depth and consumers of the main queue, each tier, and the failed queues (with --all, of
    every ricochet queue; what the queues share, once); with RICOCHET_HANDLER set, its job types
    and which have a ladder or timeout of their own."""
    settings = _settings(queue=queue)
    policies = _type_policies(settings)
    covered = _each_queue(settings, all_queues)

    async def read_each(connection: AbstractConnection) -> dict[str, QueueStatus]:
        rows: dict[str, QueueStatus] = {}  # by name: what the queues share, once
        for each in covered:
            read = await read_status(connection, each)
            rows.update((row.name, row) for row in read if row.name not in rows)
        return rows

    rows = _run(_with_connection(settings, "status", read_each))
    if as_json:
        shown: dict[str, Any] = {"queues": [r.as_dict() for r in rows.values()]}
        if policies is not None:
            shown["types"] = [p.as_dict() for p in policies]
        click.echo(json.dumps(shown, indent=2))
    else:
        click.echo(status_table(list(rows.values())))
        _echo_types(policies)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@_queue
@_all_queues
def doctor(queue: str | None, all_queues: bool, as_json: bool) -> None:
    """Check the broker's queues, exchanges, bindings and policies against the settings (with
    --all, for every ricochet queue; a finding the queues share, once).

    Read-only, through the management API (RICOCHET_MANAGEMENT_URL). Failures first, then
    warnings, then what passes. Exit 1 when a check fails.
    """
    checks = []
    for settings in _each_queue(_settings(queue=queue), all_queues):
        checks += [c for c in _run(run_doctor(settings)) if c not in checks]
    checks = worst_first(checks)
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
@_queue
def publish(
    queue: str | None,
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
    # The client sets max-retries and retry-delays-ms from its own arguments, and checks them
    # there; the ladder is written as on the wire.
    max_retries = parsed.pop(MAX_RETRIES, None)
    retry_delays = parsed.pop(RETRY_DELAYS, None)
    if retry_delays is not None:
        try:
            retry_delays = ladders.parse(str(retry_delays))
        except ValueError as error:
            raise click.BadParameter(f"{RETRY_DELAYS}: {error}", param_hint="--header") from None
    settings = _settings(queue=queue)
    client = Client(settings.amqp_url, settings.queue, connect_timeout_s=0)

    async def enqueue() -> str:
        try:
            return await client.enqueue(
                job_type,
                payload.encode(),
                content_type="application/json" if is_json(payload) else "text/plain",
                message_id=message_id,
                max_retries=max_retries,
                retry_delays_ms=retry_delays,
                headers=parsed,
                delay=delay,
                run_at=run_at,
            )
        finally:
            await client.close()

    click.echo(_run(enqueue()))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line instead.")
def schedules(as_json: bool) -> None:
    """The recurring jobs of RICOCHET_HANDLER's Router (its module is imported, as the worker
    does): each one's rule, next occurrence and the last its queue's leader enqueued."""
    settings = _settings()
    try:
        handler = load_handler(settings.handler)
    except ConfigError as error:
        click.echo(f"ricochet: {error}", err=True)
        sys.exit(EXIT_CONFIG)
    registered = handler.schedules if isinstance(handler, Router) else []
    rows = _run(
        _with_connection(
            settings,
            "schedules",
            lambda c: read_schedules(c, registered, settings.queue, time.time_ns() // 1_000_000),
        )
    )
    if as_json:
        for row in rows:
            click.echo(json.dumps(row.as_dict()))
    else:
        click.echo(schedules_table(rows))


@main.command()
@click.argument("message_id")
@_queue
def cancel(message_id: str, queue: str | None) -> None:
    """Cancel the job MESSAGE_ID of the queue: one that waits (scheduled, in a retry tier, or
    after a RetryLater) or is still in the queue never runs (again); one running sees
    job.cancelled. An unknown or finished job, or a job of another queue with the same id, is
    left as it is."""
    try:
        message_id = cancelled_id(message_id)
    except InvalidJob as error:
        raise click.BadParameter(str(error), param_hint="MESSAGE_ID") from None
    settings = _settings(queue=queue)
    names = Names(settings.queue)
    _run(_with_connection(settings, "cancel", lambda c: publish_cancel(c, names, message_id)))
    click.echo(f"cancelled {message_id}")


def _waiting_filters(fn: Command) -> Command:
    for option in reversed(
        [
            _queue,
            click.option("--type", "job_type", help="Only jobs of this type."),
            click.option("--message-id", help="Only the job with this message_id."),
            click.option("--limit", type=click.IntRange(min=1), help="The N due soonest."),
            click.option("--json", "as_json", is_flag=True, help="One JSON object per line."),
        ]
    ):
        fn = option(fn)
    return fn


@main.group(invoke_without_command=True)
@_waiting_filters
@click.pass_context
def waiting(
    ctx: click.Context,
    queue: str | None,
    job_type: str | None,
    message_id: str | None,
    limit: int | None,
    as_json: bool,
) -> None:
    """The jobs RabbitMQ holds for a later attempt (`waiting list`, the default, or `show`)."""
    if ctx.invoked_subcommand is None:
        _list_waiting(queue, job_type, message_id, limit, as_json)


def _before_subcommand(ctx: click.Context) -> dict[str, Any]:
    """A `waiting` subcommand's parameters, each option not given after the subcommand taken
    from before it (`ricochet waiting --queue jobs show ID`)."""
    before = _group_params(ctx)
    return {name: value or before.get(name) for name, value in ctx.params.items()}


def _group_params(ctx: click.Context) -> dict[str, Any]:
    """The options given to `waiting` itself, before its subcommand."""
    return ctx.parent.params if ctx.parent is not None else {}


@waiting.command("list")
@_waiting_filters
@click.pass_context
def waiting_list(
    ctx: click.Context,
    queue: str | None,
    job_type: str | None,
    message_id: str | None,
    limit: int | None,
    as_json: bool,
) -> None:
    """One line per waiting job (scheduled, in a retry tier, waiting out a RetryLater), soonest
    due first: message_id, type, the next attempt, when it is due, the last failure's reason.
    Looking takes nothing: every job stays where it waits."""
    _list_waiting(**_before_subcommand(ctx))


def _list_waiting(
    queue: str | None,
    job_type: str | None,
    message_id: str | None,
    limit: int | None,
    as_json: bool,
) -> None:
    settings = _settings(queue=queue)
    filters = {"type": job_type, "message_id": message_id, "limit": limit}
    found = _waiting_from_monitor(settings, filters) if settings.monitor_url else None
    if found is None:
        found = _run(
            _with_connection(
                settings,
                "waiting",
                lambda c: list_waiting(
                    c, settings, job_type=job_type, message_id=message_id, limit=limit
                ),
            )
        )
    if as_json:
        for row in found.rows:
            click.echo(json.dumps(row.as_row()))
    else:
        click.echo(waiting_table(found.rows))
    click.echo(waiting_summary(found, settings.queue), err=True)


def _waiting_from_monitor(settings: Settings, filters: dict[str, Any]) -> Listing | None:
    """The waiting jobs as the monitor lists them from its index; None when it does not answer,
    said on stderr, for the journal to be read back instead."""
    assert settings.monitor_url is not None
    query = {"queue": settings.queue} | {k: str(v) for k, v in filters.items() if v is not None}
    try:
        found: Listing = _run(waiting_from_monitor(settings.monitor_url, query))
        return found
    except MonitorUnanswered as error:
        _unanswered(settings.monitor_url, error)
        return None


def _unanswered(monitor_url: str, error: MonitorUnanswered) -> None:
    """Say on stderr that the monitor did not answer, and that the journal is read instead."""
    where = f"the monitor at {url_host(monitor_url)}"
    click.echo(f"ricochet: {where} did not answer ({error}): reading the journal", err=True)


@waiting.command("show")
@click.argument("message_id")
@_queue
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.pass_context
def waiting_show(ctx: click.Context, message_id: str, queue: str | None, as_json: bool) -> None:
    """Everything about one waiting job: when it is due, why, where it waits, its properties,
    headers and body. Exit 1 when no job with that id waits."""
    if any(_group_params(ctx).get(name) for name in ("job_type", "message_id", "limit")):
        raise click.UsageError("--type, --message-id and --limit choose rows of `waiting list`")
    given = _before_subcommand(ctx)
    queue, as_json = given["queue"], given["as_json"]
    settings = _settings(queue=queue)
    found = _run(
        _with_connection(settings, "waiting", lambda c: show_waiting(c, settings, message_id))
    )
    if not found:
        click.echo(
            f"ricochet: no waiting job of {settings.queue} with message_id {message_id!r}",
            err=True,
        )
        sys.exit(EXIT_RUNTIME)
    if as_json:
        for shown in found:
            click.echo(json.dumps(shown.as_dict(), indent=2))
    else:
        click.echo("\n\n".join(waiting_text(shown) for shown in found))


def _since(text: str) -> dt.timedelta:
    """A duration from the command line: 90s, 30m, 1h, 2d."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
    number, unit = text[:-1], text[-1:]
    if unit not in units or not number.isdigit() or int(number) == 0:
        raise click.BadParameter(f"{text!r} is not a duration like 90s, 30m, 1h or 2d")
    return dt.timedelta(seconds=int(number) * units[unit])


_since_option = click.option(
    "--since",
    "since",
    default="1h",
    show_default=True,
    metavar="DURATION",
    callback=lambda _ctx, _param, value: _since(value),
    help="How far back to read the journal (90s, 30m, 1h, 2d).",
)


def _read_journal(settings: Settings, since: dt.timedelta, message_id: str | None) -> Read:
    start = dt.datetime.now(dt.UTC) - since
    read: Read = _run(_with_connection(settings, "jobs", lambda c: read_jobs(c, start, message_id)))
    if not read.complete:
        click.echo(
            "ricochet: the journal did not answer to the end: what was read is shown", err=True
        )
    return read


@main.command()
@click.argument("message_id")
@_queue
@_since_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def job(message_id: str, queue: str | None, since: dt.timedelta, as_json: bool) -> None:
    """Where the job MESSAGE_ID is now and what happened to it, from the journal: its state,
    each attempt, its result and progress. Asks the monitor's index when RICOCHET_MONITOR_URL
    is set, else reads the journal back --since. Exit 1 when the journal knows no such job."""
    settings = _settings()
    if settings.monitor_url is not None and _job_from_monitor(settings, message_id, queue, as_json):
        return
    read = _read_journal(settings, since, message_id)
    found = [j for j in read.jobs.values() if queue is None or j.queue == queue]
    read_back = f"read the journal since {iso(read.since)}"
    if not found:
        click.echo(f"ricochet: no job {message_id!r} in the journal ({read_back})", err=True)
        sys.exit(EXIT_RUNTIME)
    found.sort(key=lambda j: j.last_at_ms)
    _echo_job(found[-1].as_dict(now_ms()), as_json)
    others = [j.queue for j in found[:-1]]
    if others:
        click.echo(f"also in {', '.join(others)} (--queue chooses)", err=True)
    click.echo(read_back, err=True)


def _echo_job(shown: dict[str, Any], as_json: bool) -> None:
    click.echo(json.dumps(shown, indent=2) if as_json else job_text(shown))


def _job_from_monitor(
    settings: Settings, message_id: str, queue: str | None, as_json: bool
) -> bool:
    """Print the job as the monitor's index knows it; False when the monitor does not answer or
    knows no such job (it may be older than the index's entries, or not read yet), said on
    stderr, for the journal to be read back instead."""
    assert settings.monitor_url is not None
    token = settings.console_token.get_secret_value() if settings.console_token else None
    where = f"the monitor at {url_host(settings.monitor_url)}"
    try:
        shown = _run(job_from_monitor(settings.monitor_url, message_id, queue, token))
    except MonitorUnanswered as error:
        _unanswered(settings.monitor_url, error)
        return False
    if shown is None:
        click.echo(f"ricochet: {where} knows no job {message_id!r}: reading the journal", err=True)
        return False
    complete = shown.pop("complete")
    _echo_job(shown, as_json)
    if not complete:
        click.echo(f"{where} is still reading the journal: older entries may be missing", err=True)
    return True


@main.command()
@_queue
@click.option("--type", "job_type", help="Only jobs of this type.")
@click.option("--state", type=click.Choice(STATES), help="Only jobs in this state.")
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--before", metavar="CURSOR", help="The page after the one that gave CURSOR.")
@_since_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line instead.")
def jobs(
    queue: str | None,
    job_type: str | None,
    state: str | None,
    limit: int,
    before: str | None,
    since: dt.timedelta,
    as_json: bool,
) -> None:
    """Recent jobs from the journal, newest first, a page at a time (--before takes the cursor
    the last page gave)."""
    try:
        cursor = None if before is None else decode_cursor(before)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--before") from None
    settings = _settings()
    read = _read_journal(settings, since, None)
    now_ms = time.time_ns() // 1_000_000
    shown, next_cursor = page(
        read.jobs.values(), JobFilter(queue, job_type, state), now_ms, limit, cursor
    )
    rows = [job.row(now_ms) for job in shown]
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        click.echo(json.dumps({"next": next_cursor}))
        return
    click.echo(jobs_table(rows))
    more = f"; the next page: --before {next_cursor}" if next_cursor else ""
    click.echo(f"{len(rows)} jobs, read the journal since {iso(read.since)}{more}", err=True)
