"""Logging: structlog, one event per line, with credentials scrubbed from every value."""

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

# The password runs to the last "@" of the authority: a raw "@" in it must not leave its end.
_CREDENTIALS = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)[^/\s]*@", re.IGNORECASE)
# Query parameters that carry a credential (?api_key=, &token=, &sig=, ...): their values go.
_SECRET_PARAMETERS = re.compile(
    r"([?&;](?:[a-z0-9_.-]*(?:key|token|secret|password|passwd|pwd|auth|signature)"
    r"[a-z0-9_.-]*|sig|code)=)[^&;#\s'\"]+",
    re.IGNORECASE,
)


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


def _redact_values(
    _logger: Any, _name: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    # Runs after exceptions are formatted, so a URL inside a traceback is scrubbed too.
    for key, value in event.items():
        if isinstance(value, str):
            event[key] = redact(value)
    return event


def configure_logging(level: str, fmt: str, stream: TextIO = sys.stdout) -> None:
    """Configure structlog, and the stdlib loggers of libraries, to write one line per event."""
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    before: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    after: list[Any] = [structlog.processors.format_exc_info, _redact_values]
    structlog.configure(
        processors=[*before, *after, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(stream),
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
    root.setLevel(max(logging.getLevelName(level), logging.WARNING))
