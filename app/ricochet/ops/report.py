"""What the commands print: the rows of their tables, and the tables as plain text."""

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ricochet.broker.plan import Binding, Exchange, Plan, QueueSpec
from ricochet.delivery.failed import FailureInfo
from ricochet.handlers.router import Router
from ricochet.names import DELAY_UNIT_MS
from ricochet.ops.failed_queue import CopyDetails
from ricochet.ops.schedules import ScheduleRow
from ricochet.ops.selection import Outcome
from ricochet.ops.waits import Listing, Shown, Waiting, iso

DAY_MS = 86_400_000  # from a day on, durations are shown in days


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces, one line a row."""
    cells = [
        [str(c) for c in header],
        *([("-" if c is None else cell(c)) for c in r] for r in rows),
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def cell(value: object) -> str:
    """A value as one line of plain text: a job's line breaks and other control characters (a
    terminal's escape sequences among them) are shown escaped, as Python writes them, never
    sent to the terminal."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def duration(delay_ms: int | None) -> str:
    """30000 -> '30s', 1500 -> '1.5s', 90 -> '90ms', 1677721600 -> '19.42d' (a day or more)."""
    if delay_ms is None:
        return ""
    if delay_ms < 1000:
        return f"{delay_ms}ms"
    if delay_ms < DAY_MS:
        return f"{delay_ms / 1000:g}s"
    return f"{delay_ms / DAY_MS:.4g}d"


def plan_table(plan: Plan, *others: Plan) -> str:
    """The queues (with arguments), exchanges and bindings of plans: each queue's own, then
    what every ricochet queue of the vhost shares, once."""
    own = [
        _objects_table(
            [each.queues[0], *each.tiers, *each.lanes, *each.queues[1:]],
            each.exchanges,
            each.bindings,
        )
        for each in (plan, *others)
    ]
    shared = _objects_table(plan.shared.queues, plan.shared.exchanges, plan.shared.bindings)
    return "\n\n".join([*own, f"shared by every ricochet queue of the virtual host:\n\n{shared}"])


def _objects_table(
    queues: Sequence[QueueSpec],
    exchanges: Sequence[Exchange],
    bindings: Sequence[Binding],
) -> str:
    queue_rows = table(
        ["queue", "delay", "arguments"],
        [
            (q.name, duration(q.delay_ms), ", ".join(f"{k}={v}" for k, v in q.arguments.items()))
            for q in queues
        ],
    )
    exchange_rows = table(
        ["exchange", "type", "arguments"],
        [
            (name, kind, ", ".join(f"{k}={v}" for k, v in args.items()))
            for name, kind, args in exchanges
        ],
    )
    binding_rows = table(
        ["from exchange", "routing key", "to"],
        [
            (
                b.source,
                b.routing_key or "(any)",
                f"exchange {b.destination}" if b.to_exchange else b.destination,
            )
            for b in bindings
        ],
    )
    return f"{queue_rows}\n\n{exchange_rows}\n\n{binding_rows}"


@dataclass(frozen=True)
class TypePolicy:
    """A job type's retry shape as its handler was registered (None: the worker's)."""

    type: str
    retry_delays_ms: tuple[int, ...] | None
    max_retries: int | None
    timeout_s: float | None

    def as_dict(self) -> dict[str, object]:
        shown = asdict(self)
        shown["retry_delays_ms"] = (
            None if self.retry_delays_ms is None else list(self.retry_delays_ms)
        )
        return shown


def type_policies(handler: Router | Callable[..., Any]) -> list[TypePolicy]:
    """The job types of a router, each with its own ladder, budget and timeout if it has any;
    none for a plain handler (every type is the worker's)."""
    if not isinstance(handler, Router):
        return []
    policies = []
    for job_type in handler.types:
        route = handler.route(job_type)
        assert route is not None
        policies.append(
            TypePolicy(job_type, route.retry_delays_ms, route.max_retries, route.timeout_s)
        )
    return policies


WORKERS = "the worker's"


def types_table(policies: Sequence[TypePolicy]) -> str:
    """One line per job type: its own ladder, max_retries and timeout, or the worker's."""
    if not policies:
        return "job types: the handler takes every type, on the worker's ladder and timeout"
    rows = [
        (
            p.type,
            WORKERS if p.retry_delays_ms is None else ", ".join(map(duration, p.retry_delays_ms)),
            p.max_retries,
            WORKERS if p.timeout_s is None else f"{p.timeout_s:g}s",
        )
        for p in policies
    ]
    return "job types:\n\n" + table(["type", "ladder", "max_retries", "timeout"], rows)


def checks_table(checks: Sequence[tuple[str, str, str]]) -> str:
    """(check, status, detail) rows; each part of a detail ('; ' between) on a line of its own."""
    rows: list[tuple[str, str, str]] = []
    for check, status, detail in checks:
        first, *rest = detail.split("; ")
        rows += [(check, status, first), *(("", "", f"  {part}") for part in rest)]
    return table(["check", "status", "detail"], rows)


REASON_COLUMN_CHARS = 80


@dataclass(frozen=True)
class QueueStatus:
    """One queue as the broker reports it; messages is None when the queue does not exist."""

    name: str
    role: str
    delay_ms: int | None
    messages: int | None
    consumers: int | None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def roles(plan: Plan) -> list[tuple[str, str, int | None]]:
    """(name, role, delay_ms) of every queue in the plan, in the order a job meets them; a tier's
    delay is the one the broker applies."""
    n = plan.names
    lanes = [
        (spec.name, f"tier {k} lane {i}", plan.applied_delay_ms(spec))
        for k in range(1, len(plan.tiers) + 1)
        for i, spec in enumerate(plan.lanes_of(k), start=1)
    ]
    return [
        (n.queue, "main", None),
        *(
            (spec.name, f"tier {k}", plan.applied_delay_ms(spec))
            for k, spec in enumerate(plan.tiers, start=1)
        ),
        *lanes,
        (n.failed, "failed", None),
        (n.events, "failed events", None),
        *(
            (spec.name, f"{SHARED_ROLE} delay level {k}", 2**k * DELAY_UNIT_MS)
            for k, spec in enumerate(plan.shared.delays)
        ),
        *(
            (spec.name, f"{SHARED_ROLE} {role}", None)
            for spec, role in (
                (plan.shared.orphans, "orphans"),
                (plan.shared.cancel_store, "cancels"),
                (plan.shared.cancel_snapshot, "cancels snapshot"),
                (plan.shared.schedule_store, "schedules"),
            )
        ),
    ]


# The role of what every ricochet queue of the vhost shares (the delays' levels, the orphans).
SHARED_ROLE = "shared"


def _shown(rows: Sequence[QueueStatus]) -> list[tuple[object, ...]]:
    """The queue's own rows, then the shared levels on one line (their jobs summed), then the
    other shared queues."""
    own = [r for r in rows if not r.role.startswith(SHARED_ROLE)]
    levels = [r for r in rows if r.role.startswith(f"{SHARED_ROLE} delay level")]
    others = [r for r in rows if r.role.startswith(SHARED_ROLE) and r not in levels]
    shown: list[tuple[object, ...]] = [
        (s.name, s.role, duration(s.delay_ms), s.messages, s.consumers) for s in own
    ]
    if levels:
        counts = [r.messages for r in levels]
        total = None if None in counts else sum(c or 0 for c in counts)
        first, last = levels[0], levels[-1]
        shown.append(
            (
                f"{first.name}-{last.name.rsplit('.', 1)[1]}",
                f"{SHARED_ROLE} delay levels",
                f"{duration(first.delay_ms)}-{duration(last.delay_ms)}",
                total,
                None,
            )
        )
    shown += [(s.name, s.role, duration(s.delay_ms), s.messages, s.consumers) for s in others]
    return shown


def status_table(rows: Sequence[QueueStatus]) -> str:
    """Depth and consumers per queue; missing queues show as '-'."""
    text = table(["queue", "role", "delay", "messages", "consumers"], _shown(rows))
    failed = sum(s.messages or 0 for s in rows if s.role == "failed")
    if failed:
        # Reading reasons means taking every copy off the queue; status stays read-only.
        text += (
            f"\n\n{failed} failed jobs: 'ricochet replay --dry-run --group-by reason' "
            "counts them by reason without moving any"
        )
    return text


def _short(text: str | None) -> str | None:
    if text is None or len(text) <= REASON_COLUMN_CHARS:
        return text
    return text[: REASON_COLUMN_CHARS - 3] + "..."


def failures_table(failures: Sequence[FailureInfo]) -> str:
    """One line per failed copy: message_id, type, reason (shortened), failed_at."""
    return table(
        ["message_id", "type", "reason", "failed_at"],
        [(f.message_id, f.type, _short(f.reason), f.failed_at) for f in failures],
    )


def selection_report(result: Outcome, group_by: str | None, summary: str) -> str:
    """The selected copies, one line each or counted by a field, then the summary."""
    parts = []
    if group_by:
        counts = result.count_by(group_by).most_common()
        parts.append(table(["count", group_by], [(n, _short(v)) for v, n in counts]))
    elif result.selected:
        parts.append(failures_table(result.selected))
    if result.interrupted:
        summary += "; stopped early by a signal"
    parts.append(summary)
    return "\n\n".join(parts)


def replay_report(result: Outcome, dry_run: bool, group_by: str | None, queue: str) -> str:
    """What replay moved (or would move), optionally counted by a field, and the summary."""
    verb = "would move" if dry_run else "moved"
    summary = f"{verb} {len(result.selected)} to {queue}, kept {result.kept} (of {result.depth})"
    return selection_report(result, group_by, summary)


def discard_report(result: Outcome, dry_run: bool, group_by: str | None) -> str:
    """What failed discard removed (or would remove), and the summary."""
    verb = "would discard" if dry_run else "discarded"
    summary = f"{verb} {len(result.selected)}, kept {result.kept} (of {result.depth})"
    return selection_report(result, group_by, summary)


def failed_list_table(failures: Sequence[FailureInfo]) -> str:
    """failed list: one line per copy."""
    return table(
        ["message_id", "type", "kind", "retry_count", "failed_at", "reason"],
        [(f.message_id, f.type, f.kind, f.retry_count, f.failed_at, f.reason) for f in failures],
    )


def _properties_and_headers(properties: Mapping[str, Any], headers: Mapping[str, Any]) -> list[str]:
    """A shown message's properties, then its headers, a line each after a blank line."""
    return [
        "",
        "properties:",
        *(f"  {k}: {cell(v)}" for k, v in properties.items()),
        "",
        "headers:",
        *(f"  {cell(k)}: {cell(v)}" for k, v in headers.items()),
    ]


def copy_text(details: CopyDetails) -> str:
    """failed show: one copy, its failure first, then properties, headers, traceback and body.
    Every line but the body's is one line of plain text (see cell)."""
    f = details.failure
    lines = [
        f"message_id:  {cell(f.message_id)}",
        f"type:        {cell(f.type)}",
        f"kind:        {cell(f.kind)}",
        f"retry_count: {f.retry_count}",
        f"failed_at:   {cell(f.failed_at)}",
        f"reason:      {cell(f.reason)}",
        *_properties_and_headers(details.properties, details.other_headers),
    ]
    if details.traceback is not None:
        lines += ["", "traceback:", *(f"  {cell(line)}" for line in details.traceback.splitlines())]
    lines += ["", f"body ({details.body_encoding}):", details.body]
    return "\n".join(lines)


def schedules_table(rows: Sequence[ScheduleRow]) -> str:
    """`ricochet schedules`: one line per schedule."""
    return table(
        ["name", "job_type", "queue", "rule", "timezone", "next_at", "last_at"],
        [
            [r.name, r.job_type, r.queue, r.rule, r.timezone, r.next_at or "-", r.last_at or "-"]
            for r in rows
        ],
    )


def waiting_table(rows: Sequence[Waiting]) -> str:
    """waiting list: one line per waiting job, soonest due first."""
    return table(
        ["message_id", "type", "attempt", "due_at", "cancelled", "reason"],
        [
            (w.message_id, w.type, w.attempt, iso(w.due_at), "yes" if w.cancelled else "", w.reason)
            for w in rows
        ],
    )


def waiting_summary(found: Listing, queue: str) -> str:
    """waiting list's last line (on stderr): how many, how many more unrecorded and where, and
    what was read."""
    unrecorded = "".join(
        f", {count} unrecorded in {place}" for place, count in found.unrecorded.items()
    )
    incomplete = "" if found.complete else " (not read to its end)"
    return f"{len(found.rows)} waiting jobs of {queue}{unrecorded}; read {found.read}{incomplete}"


def waiting_text(shown: Shown) -> str:
    """waiting show: one job, its row first, then where it waits, properties, headers, body.
    Every line but the body's is one line of plain text (see cell)."""
    w = shown.waiting
    lines = [
        f"message_id: {cell(w.message_id)}",
        f"type:       {cell(w.type)}",
        f"queue:      {cell(w.queue)}",
        f"attempt:    {w.attempt} (the next)",
        f"due_at:     {iso(w.due_at)}",
        f"reason:     {cell(w.reason)}",
        f"waits in:   {cell(w.place)}",
        *_properties_and_headers(shown.properties, shown.headers),
        "",
        f"body ({shown.body_encoding}):",
        shown.body,
    ]
    return "\n".join(lines)


def jobs_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """jobs: one line per job, newest first."""
    header = ["message_id", "queue", "type", "state", "attempt", "at", "duration_s", "reason"]
    return table(
        header, [[row[name] for name in header[:-1]] + [_short(row["reason"])] for row in rows]
    )


def job_text(shown: dict[str, Any]) -> str:
    """job: where the job is now, then each attempt, its result and progress (from the JSON of
    `ricochet job --json`, as read back or as the monitor's index answers)."""
    lines = [
        f"message_id:  {cell(shown['message_id'])}",
        f"queue:       {cell(shown['queue'])}",
        f"type:        {cell(shown['type'] or '-')}",
        f"state:       {shown['state']}",
    ]
    if shown["due_at"]:
        lines.append(f"due_at:      {shown['due_at']}")
    for attempt in shown["attempts"]:
        ended = attempt["outcome"] or "running"
        took = "" if attempt["duration_s"] is None else f" in {attempt['duration_s']:g} s"
        line = f"attempt {attempt['attempt']}:   {attempt['started_at'] or '-'} {ended}{took}"
        if attempt["reason"]:
            line += f": {cell(_short(attempt['reason']))}"
        lines.append(line)
    notes = {k: v for k, v in shown.items() if k.startswith("result_") and k != "result_withheld"}
    if shown.get("result_withheld"):
        lines.append("result:      withheld: the monitor shows it with the console token")
    elif notes:
        lines.append(f"result:      not recorded ({cell(notes)})")
    elif shown["result"] is not None:
        lines.append(f"result:      {cell(json.dumps(shown['result']))}")
    if shown["progress"] is not None:
        lines.append(f"progress:    {cell(json.dumps(shown['progress']))}")
    return "\n".join(lines)
