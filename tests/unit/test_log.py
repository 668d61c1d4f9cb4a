"""Log lines: one JSON object per event, library lines alike; secrets scrubbed from every value."""

import asyncio
import contextvars
import datetime as dt
import io
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from ricochet.handlers.job import Job, bind_log_context
from ricochet.log import configure_logging, redact, url_host


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("amqp://guest:guest@localhost:5672/", "amqp://guest:***@localhost:5672/"),
        ("amqps://u:p@ss@host/vhost", "amqps://u:***@host/vhost"),  # a raw @ in the password
        ("amqp://u:p?#x@host", "amqp://u:***@host"),
        ("amqp://:secret@host/", "amqp://:***@host/"),
        ("amqp://guest@host/", "amqp://guest@host/"),  # no password, nothing to hide
        ("amqp://host/v@x", "amqp://host/v@x"),  # an @ in the path is not user info
        (
            "from amqp://a:one@h1/ to http://b:two@h2/",
            "from amqp://a:***@h1/ to http://b:***@h2/",
        ),
        (
            "OperationalError: postgresql+psycopg://app:hunter2@db:5432/orders failed",
            "OperationalError: postgresql+psycopg://app:***@db:5432/orders failed",
        ),
        (
            "GET https://api.example.com/v1?api_key=abc123&page=2",
            "GET https://api.example.com/v1?api_key=***&page=2",
        ),
        ("/hook?x=1&token=abc123#frag", "/hook?x=1&token=***#frag"),
        ("url='https://h/p?access_token=abc123'", "url='https://h/p?access_token=***'"),
        ("https://h/p?X-Amz-Signature=abc123&sig=def", "https://h/p?X-Amz-Signature=***&sig=***"),
        ("https://h/p?page=2&sort=name", "https://h/p?page=2&sort=name"),  # nothing secret
        ("retry=3 key=value", "retry=3 key=value"),  # not a query string
    ],
)
def test_redact(text: str, expected: str) -> None:
    """Every URL's password becomes ***, up to the last @ before the host; the rest is kept."""
    assert redact(text) == expected


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("https://user:s3cret@hooks.example.com/services/T0", "hooks.example.com"),
        ("amqps://u:p@ss@broker/vhost", "broker"),  # a raw @ in the password
        ("http://hooks.example.com/alert", "hooks.example.com"),
        ("http://admin:s3cret@broker:15672/", "broker:15672"),
        ("http://[::1]:15672/api/", "[::1]:15672"),
        ("https://u:s3cret@[2001:db8::7]/", "[2001:db8::7]"),
        ("https://hooks.example.com?token=s3cret&next=http://other/", "hooks.example.com"),
        ("https://hooks.example.com:8443#s3cret", "hooks.example.com:8443"),
        ("hooks.example.com/services/s3cret", "hooks.example.com"),  # no scheme: host first
        ("", ""),
    ],
)
def test_url_host(url: str, host: str) -> None:
    """Only the host and port of a URL are shown: never its credentials, path, query or fragment."""
    assert url_host(url) == host


@pytest.fixture
def configured() -> Iterator[Callable[[str, str], io.StringIO]]:
    """configure_logging into a fresh stream; structlog and the root logger are put back after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level

    def configure(level: str = "INFO", fmt: str = "json") -> io.StringIO:
        stream = io.StringIO()
        configure_logging(level, fmt, stream)
        return stream

    yield configure
    structlog.reset_defaults()
    root.handlers = handlers
    root.setLevel(level)


def json_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def file_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def in_a_job(call: Callable[[], None]) -> None:
    """Run call in a context of its own with a job's log fields bound, as the worker does."""
    job = Job(
        b"{}",
        headers={},
        message_id="m-1",
        amqp_type="demo",
        attempt=2,
        max_attempts=4,
        queue="mail",
    )

    def run() -> None:
        bind_log_context(job)
        call()

    contextvars.copy_context().run(run)


def test_job_line_is_one_json_object(configured: Callable[..., io.StringIO]) -> None:
    """At INFO a job's line is one JSON object: its event, level, a UTC ISO 8601 timestamp, the
    pid of the process that wrote it and the job's message_id, type, attempt, max_attempts and
    queue; nothing below INFO is written."""
    stream = configured("INFO")
    log = structlog.get_logger("test")  # a logger of its own: loggers cache their configuration

    def lines() -> None:
        log.debug("not shown")
        log.info("job succeeded")

    in_a_job(lines)
    (line,) = json_lines(stream)
    stamp = line.pop("timestamp")
    assert line == {
        "event": "job succeeded",
        "level": "info",
        "pid": os.getpid(),
        "message_id": "m-1",
        "type": "demo",
        "attempt": 2,
        "max_attempts": 4,
        "queue": "mail",
    }
    assert stamp.endswith("Z")
    written = dt.datetime.fromisoformat(stamp)
    assert abs(dt.datetime.now(dt.UTC) - written) < dt.timedelta(seconds=60)


def test_job_fields_stay_in_the_jobs_context(configured: Callable[..., io.StringIO]) -> None:
    """A job's fields tag the lines logged in its own context and no other; a field given to
    the line itself wins over the job's."""
    stream = configured()
    log = structlog.get_logger("test")
    in_a_job(lambda: log.info("in the job", attempt=3))
    log.info("outside")
    inside, outside = json_lines(stream)
    assert (inside["message_id"], inside["attempt"]) == ("m-1", 3)
    assert set(outside) == {"event", "level", "timestamp", "pid"}


def test_level_filters_lines(configured: Callable[..., io.StringIO]) -> None:
    """At WARNING an info line is dropped and a warning is written."""
    stream = configured("WARNING")
    log = structlog.get_logger("test")
    log.info("dropped")
    log.warning("kept", jobs=3)
    assert [(line["event"], line["jobs"]) for line in json_lines(stream)] == [("kept", 3)]


def test_values_and_tracebacks_are_scrubbed(configured: Callable[..., io.StringIO]) -> None:
    """A URL's password is scrubbed from the event, from any field and from a traceback."""
    stream = configured()
    log = structlog.get_logger("test")
    log.warning("connecting to amqp://u:s3cret@broker/", broker="amqp://u:s3cret@broker/")
    try:
        raise ConnectionError("postgresql://app:s3cret@db/orders refused")
    except ConnectionError:
        log.exception("job failed")
    text = stream.getvalue()
    assert "s3cret" not in text
    first, failed = json_lines(stream)
    assert first["event"] == "connecting to amqp://u:***@broker/"
    assert first["broker"] == "amqp://u:***@broker/"
    assert failed["level"] == "error"
    assert failed["exception"].startswith("Traceback (most recent call last):")
    assert failed["exception"].endswith("ConnectionError: postgresql://app:***@db/orders refused")


def test_values_json_cannot_hold_are_written_as_their_repr(
    configured: Callable[..., io.StringIO],
) -> None:
    """A field JSON has no type for (an object, bytes, a set) is written as its repr, and the
    line is still one JSON object."""
    stream = configured()
    structlog.get_logger("test").info("odd values", thing=Path("/x"), raw=b"\xff", tags={1})
    (line,) = json_lines(stream)
    assert (line["thing"], line["raw"], line["tags"]) == ("PosixPath('/x')", "b'\\xff'", "{1}")


def test_lines_are_compact_json_in_utf_8(configured: Callable[..., io.StringIO]) -> None:
    """The line's text is compact JSON (no space after "," or ":"), text outside ASCII written
    as itself, nested values and floats kept (what a grep for '"event":"job failed"' relies
    on)."""
    stream = configured()
    structlog.get_logger("test").warning(
        "job failed", error='café ☕ "quoted"\n', counts={1: [1.5, None, True]}, ratio=0.1
    )
    (text,) = stream.getvalue().splitlines()
    assert text == json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False)
    assert '"event":"job failed"' in text
    assert '"error":"café ☕ \\"quoted\\"\\n"' in text
    assert '"counts":{"1":[1.5,null,true]}' in text


def test_values_orjson_refuses_are_still_written(configured: Callable[..., io.StringIO]) -> None:
    """An integer past 64 bits or a lone surrogate (a file name read with surrogateescape) still
    makes one JSON line of the same shape, never an error in the code that logged it."""
    stream = configured()
    structlog.get_logger("test").warning("odd", big=2**70, path="caf\udce9")
    (text,) = stream.getvalue().splitlines()
    assert '"event":"odd"' in text
    assert (json.loads(text)["big"], json.loads(text)["path"]) == (2**70, "caf\udce9")


def test_library_lines_are_the_same_json(configured: Callable[..., io.StringIO]) -> None:
    """A library's warning through the standard library (aiormq, asyncio) is a JSON line of the
    same shape, scrubbed, with its logger's name and the job's fields when a job logged it; a
    library's info line is not written."""
    stream = configured()
    library = logging.getLogger("aiormq.connection")
    library.info("chatter")
    in_a_job(lambda: library.warning("lost %s", "amqp://u:s3cret@broker/"))
    (line,) = json_lines(stream)
    assert "s3cret" not in stream.getvalue()
    stamp = line.pop("timestamp")
    assert line == {
        "event": "lost amqp://u:***@broker/",
        "level": "warning",
        "pid": os.getpid(),
        "logger": "aiormq.connection",
        "message_id": "m-1",
        "type": "demo",
        "attempt": 2,
        "max_attempts": 4,
        "queue": "mail",
    }
    assert dt.datetime.fromisoformat(stamp).tzinfo == dt.UTC


def test_library_exception_carries_its_traceback(configured: Callable[..., io.StringIO]) -> None:
    """A library's logged exception is written with its traceback, scrubbed."""
    stream = configured()
    try:
        raise OSError("amqp://u:s3cret@broker/ unreachable")
    except OSError:
        logging.getLogger("asyncio").exception("Task exception was never retrieved")
    (line,) = json_lines(stream)
    assert line["level"] == "error"
    assert line["exception"].endswith("OSError: amqp://u:***@broker/ unreachable")


def test_console_format_is_readable(configured: Callable[..., io.StringIO]) -> None:
    """RICOCHET_LOG_FORMAT=console writes one plain line per event, job fields and library
    lines included, scrubbed."""
    stream = configured("INFO", "console")
    log = structlog.get_logger("test")
    in_a_job(lambda: log.info("job succeeded", broker="amqp://u:s3cret@broker/"))
    logging.getLogger("aiormq.connection").warning("connection lost")
    first, second = stream.getvalue().splitlines()
    assert not first.startswith("{")
    assert "job succeeded" in first
    assert "message_id=m-1" in first
    assert "broker=amqp://u:***@broker/" in first
    assert "connection lost" in second
    assert "[aiormq.connection]" in second
    assert "s3cret" not in stream.getvalue()


async def test_lines_reach_the_file_before_the_loop_waits(tmp_path: Path) -> None:
    """Lines logged in a turn of the event loop are in the file by the loop's next turn; a line
    logged outside a running loop (a thread) is in it at once."""
    path = tmp_path / "worker.log"
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    with path.open("w") as stream:
        configure_logging("INFO", "json", stream)
        try:
            log = structlog.get_logger("test")
            log.info("first")
            log.info("second")
            await asyncio.sleep(0)
            assert [line["event"] for line in file_lines(path)] == ["first", "second"]
            await asyncio.to_thread(log.info, "from a thread")
            assert file_lines(path)[-1]["event"] == "from a thread"
        finally:
            structlog.reset_defaults()
            root.handlers = handlers
            root.setLevel(level)
