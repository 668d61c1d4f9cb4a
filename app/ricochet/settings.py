"""Settings: every RICOCHET_* environment variable, validated once at start-up."""

import difflib
import ipaddress
import os
import re
from collections.abc import Mapping
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

from ricochet.errors import ConfigError
from ricochet.log import redact, url_host

ENV_PREFIX = "RICOCHET_"
ENV_FILE_VARIABLE = "RICOCHET_ENV_FILE"
MAX_DELAY_MS = 86_400_000
# A console token is typed or pasted by people; this many characters make guessing it hopeless.
TOKEN_MIN_CHARS = 16
MAX_RETRIES = 25
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


# Names ricochet derives from a queue's (broker/topology.py Names): a queue named so would share
# its objects with the queue it derives from.
_DERIVED = re.compile(
    r".+\.(failed|failed\.events|failed\.scan|topology|cancels|dlx|dlx\.first|return"
    r"|retry\.\d+|retry\.\d+\.lanes?(\.\d+)?|delay\.\d+)"
)


def _check_queue(name: str) -> str:
    """A queue name of ricochet's own: not the broker's (amq.), not the shared objects'
    (ricochet.), not one derived from another queue's (a.failed beside a)."""
    if name.startswith(("amq.", "ricochet.")):
        raise ValueError("names beginning with amq. (the broker's) or ricochet. (shared) are taken")
    if _DERIVED.fullmatch(name):
        raise ValueError("the name of an object ricochet derives from another queue's")
    return name


def _check_address(host: str) -> str:
    ipaddress.ip_address(host)  # ValueError when it is not an IPv4 or IPv6 address
    return host


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
        value = value.strip()
        if not value:
            return None
        if not re.fullmatch(r"\d+(\s*,\s*\d+)*", value):
            raise ValueError("not comma-separated integers")
        return tuple(int(part) for part in value.split(","))
    return value


def _check_ladder(delays: tuple[int, ...] | None) -> tuple[int, ...] | None:
    if delays is not None and not (
        1 <= len(delays) <= MAX_RETRIES and all(10 <= d <= MAX_DELAY_MS for d in delays)
    ):
        raise ValueError("out of range")
    return delays


class ClientSettings(BaseSettings):
    """What an application's client reads: the broker and the main queue.

    Other RICOCHET_* variables are the worker's business, so the client ignores them.
    """

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="ignore")

    amqp_url: Annotated[str, _url_of("amqp", "amqps")] = Field(
        "amqp://guest:guest@localhost:5672/",
        json_schema_extra={"allowed": "an amqp:// or amqps:// URL"},
    )
    queue: Annotated[str, AfterValidator(_check_queue)] = Field(
        "jobs",
        pattern=r"^[A-Za-z0-9._-]{1,200}$",
        json_schema_extra={
            "allowed": "1-200 characters of A-Za-z0-9._-, not beginning with amq. or ricochet., "
            "not a name ricochet derives from another queue's (Q.failed, Q.retry.1, ...)"
        },
    )


class Settings(ClientSettings):
    """Every setting of ricochet; built once by the CLI and passed down."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid")

    queue_type: Literal["quorum", "classic"] = "quorum"
    max_retries: int = Field(3, ge=0, le=MAX_RETRIES)
    retry_delay_ms: int = Field(30_000, ge=10, le=MAX_DELAY_MS)
    # Floats are finite: an infinite timeout would never fire, and NaN compares false to all.
    retry_delay_multiplier: float = Field(2.0, ge=1.0, le=10.0, allow_inf_nan=False)
    retry_delay_max_ms: int = Field(
        3_600_000,
        le=MAX_DELAY_MS,
        json_schema_extra={"allowed": f">= RICOCHET_RETRY_DELAY_MS and <= {MAX_DELAY_MS}"},
    )
    # An explicit ladder: tier k waits its k-th delay, and the budget is the number of delays.
    retry_delays_ms: Annotated[
        tuple[int, ...] | None, NoDecode, BeforeValidator(_ladder), AfterValidator(_check_ladder)
    ] = Field(
        None,
        json_schema_extra={
            "allowed": f"1-{MAX_RETRIES} comma-separated integers, each 10-{MAX_DELAY_MS}"
        },
    )
    retry_jitter: float = Field(0.0, ge=0.0, le=1.0, allow_inf_nan=False)
    handler: Annotated[str, AfterValidator(_check_handler)] = Field(
        "ricochet.handlers.example:router", json_schema_extra={"allowed": "module.path:attribute"}
    )
    prefetch: int = Field(32, ge=1, le=65535)
    handler_timeout_s: float = Field(300.0, gt=0, allow_inf_nan=False)
    shutdown_timeout_s: float = Field(30.0, ge=0, allow_inf_nan=False)
    connect_timeout_s: float = Field(60.0, gt=0, allow_inf_nan=False)
    log_level: Annotated[LogLevel, BeforeValidator(lambda v: str(v).upper())] = "INFO"
    log_format: Literal["json", "console"] = "json"
    # Loopback unless told otherwise: outside a container the endpoints are for this machine.
    # The image sets 0.0.0.0, where Prometheus and the orchestrator reach them from outside.
    http_host: Annotated[str, AfterValidator(_check_address)] = Field(
        "127.0.0.1",
        json_schema_extra={"allowed": "an IPv4 or IPv6 address (0.0.0.0: every interface)"},
    )
    http_port: int = Field(8000, ge=0, le=65535)
    alert_webhook_url: Annotated[
        str | None, BeforeValidator(_empty_is_none), _url_of("http", "https")
    ] = Field(None, json_schema_extra={"allowed": "an http:// or https:// URL"})
    alert_failed_threshold: int = Field(10, ge=1)
    alert_interval_s: float = Field(60.0, ge=1, allow_inf_nan=False)
    management_url: Annotated[str, _url_of("http", "https")] = Field(
        "http://localhost:15672/", json_schema_extra={"allowed": "an http:// or https:// URL"}
    )
    pause_failure_ratio: float = Field(0.0, ge=0.0, le=1.0)
    pause_min_jobs: int = Field(20, ge=1)
    pause_window_s: float = Field(30.0, ge=1, le=3600)
    pause_s: float = Field(30.0, ge=1, le=3600)
    # The failed-jobs console's replay and discard forms work only when it is set, and only for a
    # request that carries it in the form; unset, the console is read-only.
    console_token: Annotated[
        SecretStr | None, BeforeValidator(_empty_is_none), AfterValidator(_check_token)
    ] = Field(
        None,
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

    @model_validator(mode="after")
    def _max_delay_not_below_first(self) -> "Settings":
        if self.retry_delay_max_ms < self.retry_delay_ms:
            raise ValueError("retry_delay_max_ms below retry_delay_ms")
        return self


def _conflict(name: str, other: str) -> PydanticCustomError:
    a, b = (ENV_PREFIX + n.upper() for n in (name, other))
    return PydanticCustomError("conflict", f"{a} and {b} conflict: set one of them, not both")


def _allowed(field: FieldInfo) -> str:
    """The allowed range of a field, as the error message states it."""
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


def _describe(error: ValidationError, model: type[ClientSettings] = Settings) -> str:
    """One line naming the variable, the value and the allowed range."""
    first = error.errors()[0]
    if first["type"] == "conflict":
        return str(first["msg"])
    if first["type"] == "extra_forbidden":
        return f"{str(first['loc'][0]).upper()} is not a ricochet setting"
    # The cross-field check has no location: it is about the cap on the delays.
    name = str(first["loc"][0]) if first["loc"] else "retry_delay_max_ms"
    field = model.model_fields[name]
    value = first["input"]
    if isinstance(value, dict):
        # The cap left at its default can still be below a first delay that was set.
        value = value.get(name, field.default)
    allowed = _allowed(field)
    if first["type"] == "finite_number":
        allowed = f"a finite number, {allowed}"
    return f"{ENV_PREFIX}{name.upper()}={_shown(name, str(value))!r} is invalid: allowed {allowed}"


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
    known = [ENV_PREFIX + name.upper() for name in Settings.model_fields]
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


def load_settings() -> Settings:
    """Build the settings from the environment (and RICOCHET_ENV_FILE), or raise ConfigError."""
    unknown = _unknown_variable(os.environ)
    if unknown:
        raise ConfigError(unknown)
    env_file = _env_file()
    try:
        return Settings(_env_file=env_file)
    except ValidationError as error:
        raise ConfigError(_describe(error)) from None


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
