"""Logging: structlog, one event per line, with credentials scrubbed from every value."""

import asyncio
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any, TextIO

import orjson
import structlog

# The password runs to the last "@" of the authority: a raw "@" in it must not leave its end.
_CREDENTIALS = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)[^/\s]*@", re.IGNORECASE)
# Query parameters that carry a credential (?api_key=, &token=, &sig=, ...): their values go.
_SECRET_PARAMETERS = re.compile(
    r"([?&;](?:[a-z0-9_.-]*(?:key|token|secret|password|passwd|pwd|auth|signature)"
    r"[a-z0-9_.-]*|sig|code)=)[^&;#\s'\"]+",
    re.IGNORECASE,
)

EventDict = MutableMapping[str, Any]
Processor = Callable[[Any, str, EventDict], Any]

# The fields of the job the current context runs, merged into every line logged in it. One
# variable set once per job: structlog's bind_contextvars sets one variable per field, and its
# merge walks every variable of the context, for every line.
_job_fields: ContextVar[Mapping[str, Any]] = ContextVar(
    "ricochet_job_fields", default=MappingProxyType({})
)


def bind_job_fields(**fields: Any) -> None:
    """Tag every line logged from now on in the current context with these fields."""
    _job_fields.set(fields)


def redact(text: str) -> str:
    """Replace the password of any URL, and credential query values, in text with ***."""
    # Every string of every log line passes here; most hold no URL, and a substring test is
    # far cheaper than the regex.
    if "://" in text:
        text = _CREDENTIALS.sub(r"\1***@", text)
    if "=" in text:
        text = _SECRET_PARAMETERS.sub(r"\1***", text)
    return text


def url_host(url: str) -> str:
    """The host and port of a URL, without its user part, path, query or fragment.

    All that a log line or an error message shows of a URL whose credentials, or token in the
    path or query (a webhook's), must stay out of them. Never raises, so it can show a URL that
    failed validation: without a scheme, the text is read as starting with the host.
    """
    authority = url.partition("://")[2] if "://" in url else url
    return re.split(r"[/?#]", authority, maxsplit=1)[0].rpartition("@")[2]


def merge_job_fields(_logger: Any, _name: str, event: EventDict) -> EventDict:
    """The processor that adds the current job's fields to a line (tests capture them too)."""
    for key, value in _job_fields.get().items():
        event.setdefault(key, value)
    return event


class _UtcTimestamp:
    """Stamps each event as structlog's TimeStamper(fmt="iso", utc=True) does
    (2026-11-24T05:23:20.123456Z), writing the date and time of day once a second: a datetime
    built and formatted for every line was one of the line's dearest steps."""

    def __init__(self) -> None:
        self._second: tuple[int, str] = (-1, "")  # one tuple: a thread reads both or neither

    def __call__(self, _logger: Any, _name: str, event: EventDict) -> EventDict:
        now_s, now_ns = divmod(time.time_ns(), 1_000_000_000)
        second, text = self._second
        if now_s != second:
            text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now_s))
            self._second = (now_s, text)
        event["timestamp"] = f"{text}.{now_ns // 1000:06d}Z"
        return event


def _process_id(pid: int) -> Processor:
    """Stamps each event with the pid of the process that logs it (read once: each process of a
    worker configures its own logging when it starts)."""

    def add(_logger: Any, _name: str, event: EventDict) -> EventDict:
        event["pid"] = pid
        return event

    return add


def _redact_values(_logger: Any, _name: str, event: EventDict) -> EventDict:
    # Runs after exceptions are formatted, so a URL inside a traceback is scrubbed too. The
    # substring tests are redact's own, here to spare most values the call.
    for key, value in event.items():
        if isinstance(value, str) and ("://" in value or "=" in value):
            event[key] = redact(value)
    return event


def _orjson_text(event: EventDict, **options: Any) -> str:
    """The event as orjson writes it (compact, UTF-8), or as the standard library does for a
    value orjson refuses (an integer past 64 bits, a lone surrogate, tables nested past 254
    levels): a log call never raises for what it was given."""
    try:
        return orjson.dumps(event, option=orjson.OPT_NON_STR_KEYS, **options).decode()
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(event, separators=(",", ":"), **options)


class _LineWriter:
    """Writes each event's line to the stream at once, and flushes the stream once per turn of
    the event loop writing it, before the loop next waits: a flush is a write(2) to the stream's
    file, dearer than the rest of the write, and a loop turn often settles many jobs. Outside a
    running loop (a thread, before the loop starts, after it ends) each line is flushed at once.
    A process killed outright (SIGKILL) loses the lines of the turn it was in."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._flush_due_on: asyncio.AbstractEventLoop | None = None  # a flush scheduled there

    def msg(self, message: str) -> None:
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        with self._lock:
            self._stream.write(message + "\n")
            if loop is None:
                self._stream.flush()
                return
            if self._flush_due_on is loop:
                return
            # A loop that closed before its flush ran leaves this set: the next loop's line
            # schedules its own.
            self._flush_due_on = loop
        loop.call_soon(self._flush)

    def _flush(self) -> None:
        with self._lock:
            self._flush_due_on = None
            self._stream.flush()

    # Every method name a bound logger may call, as structlog's own loggers have.
    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


class _Logger:
    """A ricochet module's logger. Once logging is configured (by ricochet, run as a command;
    or by the application, with structlog), structlog's; until then, as a library in an
    application's process, the standard library's logger of the same name: it writes only
    where the application's logging does, and nothing when it configured none."""

    def __init__(self, name: str) -> None:
        self._structlog = structlog.get_logger(name)
        self._library = structlog.wrap_logger(
            logging.getLogger(name),
            processors=[
                structlog.stdlib.filter_by_level,
                merge_job_fields,
                structlog.processors.format_exc_info,
                _redact_values,
                structlog.processors.KeyValueRenderer(key_order=["event"]),
            ],
            wrapper_class=structlog.stdlib.BoundLogger,
        )

    def __getattr__(self, method: str) -> Any:
        if not structlog.is_configured():
            return getattr(self._library, method)
        found = getattr(self._structlog, method)
        if structlog.get_config()["cache_logger_on_first_use"]:
            # As structlog's own logger does once used: its later lines skip this lookup.
            setattr(self, method, found)
        return found


def get_logger(name: str) -> Any:
    """The logger of a ricochet module: structlog's once logging is configured (by ricochet or
    by the application), the standard library's logger of the same name until then."""
    return _Logger(name)


# As a library ricochet writes nothing unless the application configured logging: without a
# handler of its own, the standard library would print its warnings to stderr.
logging.getLogger("ricochet").addHandler(logging.NullHandler())


def configure_logging(
    level: str, fmt: str, stream: TextIO = sys.stdout, libraries_level: int = logging.WARNING
) -> None:
    """Configure structlog, and the stdlib loggers of libraries (from libraries_level up), to
    write one line per event."""
    # structlog's JSONRenderer writes a value JSON has no type for as its repr.
    renderer: Processor = (
        structlog.processors.JSONRenderer(serializer=_orjson_text)
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    writer = _LineWriter(stream)
    before: list[Processor] = [
        merge_job_fields,
        structlog.contextvars.merge_contextvars,  # what a handler binds of its own
        structlog.processors.add_log_level,
        _UtcTimestamp(),
        _process_id(os.getpid()),
    ]
    after: list[Processor] = [structlog.processors.format_exc_info, _redact_values]
    structlog.configure(
        processors=[*before, *after, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=lambda *_: writer,  # one for the stream: its lock keeps lines whole
        cache_logger_on_first_use=True,
    )
    # Libraries (aiormq, aiohttp) log through the standard library: same format, same stream.
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*before, structlog.stdlib.add_logger_name],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                *after,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(max(logging.getLevelName(level), libraries_level))
