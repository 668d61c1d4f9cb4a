"""Settings: every RICOCHET_* environment variable, validated once at start-up."""

import difflib
import ipaddress
import os
import re
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from annotated_types import Ge, Gt, Le
from pydantic import (
    AfterValidator,
    AnyUrl,
    BeforeValidator,
    Field,
    SecretStr,
    TypeAdapter,
    UrlConstraints,
    ValidationError,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from ricochet import ladders, rates
from ricochet.errors import ConfigError
from ricochet.ladders import MAX_DELAY_MS, MAX_RETRIES
from ricochet.log import redact, url_host
from ricochet.names import refusal
from ricochet.priority import DEFAULT as DEFAULT_PRIORITY

ENV_PREFIX = "RICOCHET_"
ENV_FILE_VARIABLE = "RICOCHET_ENV_FILE"
# A console token is typed or pasted by people; this many characters make guessing it hopeless.
TOKEN_MIN_CHARS = 16
MAX_PROCESSES = 256
# The settings of the formula that an explicit ladder (RICOCHET_RETRY_DELAYS_MS) replaces.
FORMULA_SETTINGS = ("retry_delay_ms", "retry_delay_multiplier", "retry_delay_max_ms")

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


def _url_of(*schemes: str) -> AfterValidator:
    """Checks a URL with pydantic's URL type: one of these schemes, a host, a numeric port.

    The setting keeps the URL as written: the clients (aio-pika, aiohttp) parse it themselves.
    """
    url_type = Annotated[AnyUrl, UrlConstraints(allowed_schemes=list(schemes), host_required=True)]
    parse = TypeAdapter(url_type).validate_python

    def check(url: str | None) -> str | None:
        if url is not None:  # an unset webhook
            parse(url)
        return url

    return AfterValidator(check)


def _check_handler(ref: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*", ref):
        raise ValueError("not of the form module.path:attribute")
    return ref


def _check_queue(name: str) -> str:
    reason = refusal(name)
    if reason is not None:
        raise ValueError(reason)
    return name


# What RICOCHET_QUEUE (and any queue a worker consumes or a schedule names) may be.
QUEUE_PATTERN = r"^[A-Za-z0-9._-]{1,200}$"


def check_queue_name(name: object) -> str:
    """A queue name as RICOCHET_QUEUE allows it; ValueError saying why it is refused."""
    if not isinstance(name, str) or not re.fullmatch(QUEUE_PATTERN, name):
        raise ValueError("1-200 characters of A-Za-z0-9._- are allowed")
    return _check_queue(name)


# RICOCHET_QUEUES: at most this many queues for one worker.
MAX_QUEUES = 64


def _queues(value: Any) -> Any:
    """RICOCHET_QUEUES as written ("mail,thumbs=1") into (name, prefetch or None) pairs: each
    bad entry is named, since a list of 64 is hard to search by eye."""
    if not isinstance(value, str):
        return value
    entries = value.split(",")
    if not value.strip():
        raise PydanticCustomError("queues", "set but empty")
    if len(entries) > MAX_QUEUES:
        raise PydanticCustomError("queues", f"{len(entries)} entries, more than {MAX_QUEUES}")
    parsed: list[tuple[str, int | None]] = []
    for entry in (e.strip() for e in entries):
        name, equals, prefetch = (part.strip() for part in entry.partition("="))
        reason = _bad_entry(name, bool(equals), prefetch, [n for n, _ in parsed])
        if reason:
            raise PydanticCustomError("queues", f"entry {entry!r}: {reason}")
        parsed.append((name, int(prefetch) if equals else None))
    return tuple(parsed)


def _rate_limits(value: Any) -> Any:
    """RICOCHET_RATE_LIMITS as written into a limit per type (ricochet.rates)."""
    if not isinstance(value, str):
        return value
    try:
        return rates.parse_limits(value)
    except ValueError as error:
        raise PydanticCustomError("rate_limits", str(error)) from None


def queue_problem(name: object) -> str | None:
    """What makes name no queue of ricochet's, or None (pure)."""
    try:
        check_queue_name(name)
    except ValueError as error:
        return str(error)
    return None


def _bad_entry(name: str, equals: bool, prefetch: str, seen: list[str]) -> str | None:
    """What is wrong with one RICOCHET_QUEUES entry, or None (pure)."""
    problem = queue_problem(name)
    if problem:
        return problem
    if name in seen:
        return "the queue is listed twice"
    if equals and not (prefetch.isdigit() and 1 <= int(prefetch) <= 65535):
        return "a prefetch is an integer 1-65535"
    return None


def _check_address(host: str) -> str:
    ipaddress.ip_address(host)  # ValueError when it is not an IPv4 or IPv6 address
    return host


# The failed-kind header's values (delivery/retry.py FailureKind, which a test holds this to).
FAILED_KINDS = ("exhausted", "permanent", "poison")
# The monitor relaunches failed copies no more often than this (0 turns it off).
RELAUNCH_MIN_INTERVAL_S = 10


def _kinds(value: Any) -> Any:
    """RICOCHET_RELAUNCH_KINDS as written ("exhausted,poison") into its kinds."""
    if isinstance(value, str):
        value = tuple(part.strip() for part in value.split(","))
    return value


def _check_kinds(kinds: tuple[str, ...]) -> tuple[str, ...]:
    if not kinds or not set(kinds) <= set(FAILED_KINDS) or len(set(kinds)) != len(kinds):
        raise ValueError("not comma-separated failed kinds")
    return kinds


def _check_relaunch_interval(interval_s: float) -> float:
    if interval_s != 0 and interval_s < RELAUNCH_MIN_INTERVAL_S:
        raise ValueError("below the shortest interval")
    return interval_s


def _check_token(token: SecretStr | None) -> SecretStr | None:
    if token is not None and not re.fullmatch(
        rf"[!-~]{{{TOKEN_MIN_CHARS},}}", token.get_secret_value()
    ):
        raise ValueError("too short, or not printable ASCII without spaces")
    return token


def _empty_is_none(value: Any) -> Any:
    return None if value == "" else value


def _ladder(value: Any) -> Any:
    """RICOCHET_RETRY_DELAYS_MS as written ("1000,5000,5000") into its integers."""
    if isinstance(value, str):
        return ladders.parse(value) if value.strip() else None
    return value


def _check_ladder(delays: tuple[int, ...] | None) -> tuple[int, ...] | None:
    return None if delays is None else ladders.checked(delays)


class ClientSettings(BaseSettings):
    """What an application's client reads: the broker and the main queue.

    Other RICOCHET_* variables are the worker's business, so the client ignores them.
    """

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="ignore")

    amqp_url: Annotated[str, _url_of("amqp", "amqps")] = Field(
        "amqp://guest:guest@localhost:5672/",
        description="broker; its password never appears in logs (nor any URL password or "
        "`?api_key=`, `token=`... value in logs, failed-copy headers, replay output or alerts)",
        json_schema_extra={"allowed": "an amqp:// or amqps:// URL"},
    )
    queue: Annotated[str, AfterValidator(_check_queue)] = Field(
        "jobs",
        pattern=QUEUE_PATTERN,
        description="main queue; every other name derives from it (what the vhost's queues "
        "share begins with `ricochet.`)",
        json_schema_extra={
            "allowed": "1-200 characters of A-Za-z0-9._-, not beginning with amq. or ricochet., "
            "not a name ricochet derives from another queue's (Q.failed, Q.retry.1, ...)"
        },
    )
    journal: Literal["on", "off"] = Field(
        "on",
        description="write every change of a job's state (by workers, and each enqueue by the "
        "client) to the vhost's `ricochet.journal` stream, which `ricochet job`, `ricochet "
        "jobs` and `ricochet waiting` read",
    )
    key_lanes: int = Field(
        16,
        ge=1,
        le=256,
        description="the lanes a queue's jobs with a key are spread over, declared (by the "
        "client or a worker) with the queue's first such job: jobs of one key run one at a "
        "time, in their order, and "
        "so do the jobs of keys that share a lane; lanes run in parallel, each a queue of its "
        "own. Needs the `rabbitmq_consistent_hash_exchange` plugin, which RabbitMQ ships "
        "(see [One job per key at a time](enqueueing.md#one-job-per-key-at-a-time))",
    )


class Settings(ClientSettings):
    """Every setting of ricochet; built once by the CLI and passed down.

    Each field's description is its meaning in the documentation's settings reference, which is
    made from these fields (docs/hooks/settings_reference.py)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid")

    queue_type: Literal["quorum", "classic"] = Field(
        "quorum", description="type of the queues ricochet declares"
    )
    max_priority: int = Field(
        0,
        ge=0,
        le=9,
        description="the x-max-priority of a classic queue ricochet declares, so that its "
        "backlog is delivered by priority (0: none; 1-4 would count a job sent without a "
        "priority, 4, as high as any, and are refused; quorum queues take none: RabbitMQ 4.x "
        "orders them by priority without it). RabbitMQ cannot add it to an existing queue: "
        "`ricochet topology` says how to declare the queue again "
        "(see [Priority](enqueueing.md#priority))",
        json_schema_extra={"allowed": "0, or 5-9"},
    )
    max_retries: int = Field(
        3,
        ge=0,
        le=MAX_RETRIES,
        description="retries after the first attempt (= number of tiers)",
    )
    retry_delay_ms: int = Field(30_000, ge=10, le=MAX_DELAY_MS, description="delay of tier 1")
    # Floats are finite: an infinite timeout would never fire, and NaN compares false to all.
    retry_delay_multiplier: float = Field(
        2.0, ge=1.0, le=10.0, allow_inf_nan=False, description="growth factor per tier"
    )
    retry_delay_max_ms: int = Field(
        3_600_000,
        le=MAX_DELAY_MS,
        description="cap on any tier's delay",
        json_schema_extra={"allowed": f">= RICOCHET_RETRY_DELAY_MS and <= {MAX_DELAY_MS}"},
    )
    # An explicit ladder: tier k waits its k-th delay, and the budget is the number of delays.
    retry_delays_ms: Annotated[
        tuple[int, ...] | None, NoDecode, BeforeValidator(_ladder), AfterValidator(_check_ladder)
    ] = Field(
        None,
        description="explicit tier delays (linear, fixed or any ladder, e.g. "
        "`30000,60000,90000,120000`) instead of the formula; the budget is their number. Set "
        "with `RICOCHET_MAX_RETRIES` (another number) or a `RICOCHET_RETRY_DELAY*` setting it "
        "exits 2 naming both",
        json_schema_extra={
            "allowed": f"1-{MAX_RETRIES} comma-separated integers, each 10-{MAX_DELAY_MS}"
        },
    )
    retry_jitter: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="spread of each tier's wait: a job waits between d x (1 - jitter) and d, so "
        "jobs failing together do not come back together. Needs the `rabbitmq_random_exchange` "
        "plugin, which RabbitMQ ships (`rabbitmq-plugins enable rabbitmq_random_exchange`; the "
        "compose stack enables it)",
    )
    handler: Annotated[str, AfterValidator(_check_handler)] = Field(
        "ricochet.handlers.example:router",
        description="the job handler",
        json_schema_extra={"allowed": "module.path:attribute"},
    )
    prefetch: int = Field(
        32,
        ge=1,
        le=65535,
        description="unacked deliveries, so concurrent jobs, of each worker process",
    )
    # Worker processes of `ricochet worker`: 1 is the worker itself, more a parent running them.
    processes: Annotated[int, Field(ge=1, le=MAX_PROCESSES)] | Literal["auto"] = Field(
        1,
        union_mode="left_to_right",
        description="worker processes that `ricochet worker` runs: more than 1 is a parent "
        "running that many, for handlers that burn CPU "
        "(see [Worker processes](deploying.md#worker-processes))",
        json_schema_extra={
            "allowed": f"1-{MAX_PROCESSES}, or auto (the CPUs this process may use, cgroup "
            "quotas included)"
        },
    )
    # The queues one worker consumes, each with its own prefetch (None: RICOCHET_PREFETCH).
    queues: Annotated[
        tuple[tuple[str, int | None], ...] | None, NoDecode, BeforeValidator(_queues)
    ] = Field(
        None,
        description="the queues this worker consumes, each with its own prefetch (default "
        "`RICOCHET_PREFETCH`), which applies per worker process; unset, the worker consumes "
        "`RICOCHET_QUEUE`. Names as for `RICOCHET_QUEUE`, none twice; a prefetch is 1-65535; "
        "set but empty is invalid",
        json_schema_extra={
            "allowed": f"1-{MAX_QUEUES} comma-separated entries NAME or NAME=PREFETCH"
        },
    )
    rate_limits: Annotated[
        dict[str, rates.Limit] | None, NoDecode, BeforeValidator(_rate_limits)
    ] = Field(
        None,
        description="rate limits per job type, shared by every worker and process of the vhost "
        "(a token bucket of at most BURST tokens, default 1, refilled at N per second, minute "
        "or hour); a type's handler may give its own (`rate=`, `burst=`), and workers that "
        "disagree apply the lowest "
        "(see [Rate limits](handlers.md#rate-limits))",
        json_schema_extra={
            "allowed": "comma-separated TYPE=N/s, TYPE=N/m or TYPE=N/h, each "
            "with :BURST or not; N and BURST 1-10000"
        },
    )
    handler_timeout_s: float = Field(
        300.0,
        gt=0,
        allow_inf_nan=False,
        description="longer counts as a transient failure",
    )
    shutdown_timeout_s: float = Field(
        30.0, ge=0, allow_inf_nan=False, description="drain time after SIGTERM/SIGINT"
    )
    connect_timeout_s: float = Field(
        60.0,
        gt=0,
        allow_inf_nan=False,
        description="how long a starting `worker` or `monitor` waits for the broker before "
        "exit 1 (the other commands ask once, and say within 10 s that it does not answer)",
    )
    result_max_bytes: int = Field(
        4096,
        ge=0,
        le=1_000_000,
        description="the largest handler return value (as JSON) the journal records; a larger "
        "one is recorded as truncated, with its size",
    )
    log_level: Annotated[LogLevel, BeforeValidator(lambda v: str(v).upper())] = Field(
        "INFO", description="the lowest level of the log lines written"
    )
    log_format: Literal["json", "console"] = Field(
        "json", description="one JSON object per line, or human-readable"
    )
    # Loopback unless told otherwise: outside a container the endpoints are for this machine.
    # The image sets 0.0.0.0, where Prometheus and the orchestrator reach them from outside.
    http_host: Annotated[str, AfterValidator(_check_address)] = Field(
        "127.0.0.1",
        description="where the HTTP endpoints listen (the image sets `0.0.0.0`)",
        json_schema_extra={"allowed": "an IPv4 or IPv6 address (0.0.0.0: every interface)"},
    )
    http_port: int = Field(
        8000,
        ge=0,
        le=65535,
        description="`/metrics`, `/healthz`, `/readyz` (and the monitor's console); 0 turns "
        "them off",
    )
    alert_webhook_url: Annotated[
        str | None, BeforeValidator(_empty_is_none), _url_of("http", "https")
    ] = Field(
        None,
        description="where the monitor POSTs alerts",
        json_schema_extra={"allowed": "an http:// or https:// URL"},
    )
    alert_failed_threshold: int = Field(
        10, ge=1, description="failed-queue depth that raises an alert"
    )
    alert_interval_s: float = Field(
        60.0,
        ge=1,
        allow_inf_nan=False,
        description="depth-check period; minimum spacing of repeated alerts of one kind",
    )
    monitor_url: Annotated[
        str | None, BeforeValidator(_empty_is_none), _url_of("http", "https")
    ] = Field(
        None,
        description="the monitor's HTTP address (`http://monitor:8000/`): `ricochet job` and "
        "`ricochet waiting` ask its index of the journal instead of reading the journal back "
        "(the compose stack sets it); unset, or when the monitor does not answer, they read "
        "the journal",
        json_schema_extra={"allowed": "an http:// or https:// URL"},
    )
    management_url: Annotated[str, _url_of("http", "https")] = Field(
        "http://localhost:15672/",
        description="management API that `ricochet doctor` reads, and that a start asks before "
        "it deletes a quorum tier whose delay changed or that is no longer wanted; credentials "
        "from it, else from `RICOCHET_AMQP_URL`",
        json_schema_extra={"allowed": "an http:// or https:// URL"},
    )
    pause_failure_ratio: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="pause when this share of the jobs finished in the window failed "
        "transiently; 0 turns pausing off (see [Pausing on failure spikes]"
        "(pausing.md))",
    )
    pause_min_jobs: int = Field(
        20, ge=1, description="... and at least this many jobs finished in it"
    )
    pause_window_s: float = Field(30.0, ge=1, le=3600, description="the sliding window")
    pause_s: float = Field(
        30.0,
        ge=1,
        le=3600,
        description="how long a pause lasts before the worker takes jobs again",
    )
    relaunch_interval_s: Annotated[float, AfterValidator(_check_relaunch_interval)] = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description="the monitor relaunches failed copies this often (0: never): those of "
        "RICOCHET_RELAUNCH_KINDS replayed fewer than RICOCHET_RELAUNCH_MAX times, with every "
        "guarantee of `ricochet replay`",
        json_schema_extra={"allowed": f"0 (off), or >= {RELAUNCH_MIN_INTERVAL_S}"},
    )
    relaunch_kinds: Annotated[
        tuple[str, ...], NoDecode, BeforeValidator(_kinds), AfterValidator(_check_kinds)
    ] = Field(
        ("exhausted",),
        description="the failed kinds the monitor relaunches",
        json_schema_extra={"allowed": "comma-separated: " + ", ".join(FAILED_KINDS)},
    )
    relaunch_max: int = Field(
        3,
        ge=1,
        le=1000,
        description="a copy replayed this many times (its replay-count) is left for a person",
    )
    # The console's replay, discard and cancel forms work only when it is set, and only for a
    # request that carries it in the form; unset, the console is read-only.
    console_token: Annotated[
        SecretStr | None, BeforeValidator(_empty_is_none), AfterValidator(_check_token)
    ] = Field(
        None,
        description="a secret: the [console](console.md)'s replay, discard "
        "and cancel forms work only for a request that carries it; unset, the console is "
        "read-only. Never logged or shown",
        json_schema_extra={
            "allowed": f"at least {TOKEN_MIN_CHARS} printable characters, no spaces"
        },
    )

    @model_validator(mode="before")
    @classmethod
    def _ladder_or_formula(cls, values: Any) -> Any:
        """With an explicit ladder the budget is its length, and the formula's settings are
        not used: setting one of them too is a conflict, named, rather than silently ignored."""
        if not isinstance(values, dict) or values.get("retry_delays_ms") in (None, ""):
            return values
        try:
            ladder = _check_ladder(_ladder(values["retry_delays_ms"]))
        except ValueError:
            return values  # the field's own check says what is wrong with it
        if not isinstance(ladder, tuple):
            return values
        for name in FORMULA_SETTINGS:
            if name in values:
                raise _conflict("retry_delays_ms", name)
        if "max_retries" in values and str(values["max_retries"]).strip() != str(len(ladder)):
            raise _conflict("retry_delays_ms", "max_retries")
        return {**values, "max_retries": len(ladder)}

    @property
    def queue_names(self) -> tuple[str, ...]:
        """The queues the worker consumes: RICOCHET_QUEUES' names, else RICOCHET_QUEUE."""
        return (self.queue,) if self.queues is None else tuple(n for n, _ in self.queues)

    def per_queue(self) -> tuple["Settings", ...]:
        """These settings once per queue the worker consumes (RICOCHET_QUEUES, else
        RICOCHET_QUEUE), each with that queue and its prefetch: whatever reads a queue's
        settings serves that queue alone."""
        if self.queues is None:
            return (self,)
        return tuple(
            self.model_copy(update={"queue": name, "prefetch": prefetch or self.prefetch})
            for name, prefetch in self.queues
        )

    @model_validator(mode="after")
    def _max_delay_not_below_first(self) -> "Settings":
        if self.retry_delay_max_ms < self.retry_delay_ms:
            raise ValueError("retry_delay_max_ms below retry_delay_ms")
        return self

    @model_validator(mode="after")
    def _max_priority_on_classic_queues(self) -> "Settings":
        if 0 < self.max_priority <= DEFAULT_PRIORITY:
            raise PydanticCustomError(
                "conflict",
                f"{variable_name('max_priority')}={self.max_priority} would count the priority"
                f" of a job sent without one ({DEFAULT_PRIORITY}) as high as any: set"
                f" {DEFAULT_PRIORITY + 1}-9, or 0 for none",
            )
        if self.max_priority and self.queue_type != "classic":
            raise PydanticCustomError(
                "conflict",
                f"{variable_name('max_priority')} is for classic queues: quorum queues refuse"
                " x-max-priority (RabbitMQ 4.x orders them by priority without it); set"
                f" {variable_name('queue_type')}=classic or leave it 0",
            )
        return self


def _conflict(name: str, other: str) -> PydanticCustomError:
    a, b = (variable_name(n) for n in (name, other))
    return PydanticCustomError("conflict", f"{a} and {b} conflict: set one of them, not both")


def allowed(field: FieldInfo) -> str:
    """The allowed range of a field, as the error message and the settings reference state it."""
    extra = field.json_schema_extra
    if isinstance(extra, dict) and "allowed" in extra:
        return str(extra["allowed"])
    args = getattr(field.annotation, "__args__", ())
    if args and all(isinstance(a, str) for a in args):
        return "one of " + ", ".join(args)
    ge = next((m.ge for m in field.metadata if isinstance(m, Ge)), None)
    le = next((m.le for m in field.metadata if isinstance(m, Le)), None)
    gt = next((m.gt for m in field.metadata if isinstance(m, Gt)), None)
    if ge is not None:
        return f"{ge}-{le}" if le is not None else f">= {ge}"
    return f"> {gt}"


def option_name(name: str) -> str:
    """The command-line option that sets a setting (`ricochet worker --prefetch`)."""
    return "--" + name.replace("_", "-")


def variable_name(name: str) -> str:
    """The environment variable that sets a setting (RICOCHET_PREFETCH)."""
    return ENV_PREFIX + name.upper()


def _describe(
    error: ValidationError,
    model: type[ClientSettings] = Settings,
    options: Collection[str] = (),
) -> str:
    """One line naming the variable (or the option, for a setting among options), the value and
    the allowed range."""
    first = error.errors()[0]
    if first["type"] == "conflict":
        return str(first["msg"])
    if first["type"] == "queues":
        source = option_name("queues") if "queues" in options else variable_name("queues")
        return f"{source} is invalid: {first['msg']}"
    if first["type"] == "extra_forbidden":
        return f"{str(first['loc'][0]).upper()} is not a ricochet setting"
    # The cross-field check has no location: it is about the cap on the delays.
    name = str(first["loc"][0]) if first["loc"] else "retry_delay_max_ms"
    field = model.model_fields[name]
    value = first["input"]
    if isinstance(value, dict):
        # The cap left at its default can still be below a first delay that was set.
        value = value.get(name, field.default)
    allowed_text = allowed(field)
    if first["type"] == "finite_number":
        allowed_text = f"a finite number, {allowed_text}"
    shown = _shown(name, str(value))
    if name in options:
        return f"{option_name(name)} {shown!r} is invalid: allowed {allowed_text}"
    return f"{variable_name(name)}={shown!r} is invalid: allowed {allowed_text}"


def _shown(name: str, value: str) -> str:
    """A value as the error message shows it: never with a URL's password or a webhook's token."""
    if name == "console_token":
        return "***"  # a secret: not a character of it in any message
    if name == "alert_webhook_url":
        # A webhook's path or query is often its token: only the host it points at is shown.
        scheme = value.partition("://")[0] + "://" if "://" in value else ""
        return f"{scheme}{url_host(value)}/***"
    shown = redact(value)
    if name.endswith("_url") and shown == value and "@" in value:
        # Not a URL that redact() recognises (no scheme, say): hide all of its user part.
        shown = "***@" + value.rpartition("@")[2]
    return shown


def _unknown_variable(environ: Mapping[str, str]) -> str | None:
    known = [variable_name(name) for name in Settings.model_fields]
    for key in sorted(environ):
        if key.startswith(ENV_PREFIX) and key not in known and key != ENV_FILE_VARIABLE:
            hint = difflib.get_close_matches(key, known, n=1)
            return f"{key} is not a ricochet setting" + (
                f" (did you mean {hint[0]}?)" if hint else ""
            )
    return None


def _env_file() -> str | None:
    env_file = os.environ.get(ENV_FILE_VARIABLE)
    if env_file and not Path(env_file).is_file():
        raise ConfigError(f"{ENV_FILE_VARIABLE}={env_file!r} is invalid: no such file")
    return env_file or None


def load_settings(options: Mapping[str, str] | None = None) -> Settings:
    """Build the settings from the environment (and RICOCHET_ENV_FILE), each of options (by
    setting name, as a command line gave them) overriding its variable; or raise ConfigError."""
    unknown = _unknown_variable(os.environ)
    if unknown:
        raise ConfigError(unknown)
    env_file = _env_file()
    given: dict[str, Any] = dict(options or {})
    try:
        return Settings(_env_file=env_file, **given)
    except ValidationError as error:
        raise ConfigError(_describe(error, options=given)) from None


def load_client_settings(amqp_url: str | None, queue: str | None) -> ClientSettings:
    """The client's settings: the values given, else the environment's (and RICOCHET_ENV_FILE's);
    ConfigError when one is invalid."""
    given: dict[str, Any] = {
        name: value
        for name, value in (("amqp_url", amqp_url), ("queue", queue))
        if value is not None
    }
    env_file = _env_file()
    try:
        return ClientSettings(_env_file=env_file, **given)
    except ValidationError as error:
        raise ConfigError(_describe(error, ClientSettings)) from None
