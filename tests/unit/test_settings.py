"""Settings: defaults, bounds, and the one-line error naming variable, value and range."""

from pathlib import Path

import pytest
from ricochet.errors import ConfigError
from ricochet.settings import Settings, load_settings, option_name, variable_name


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("RICOCHET_"):
            monkeypatch.delenv(key)


def test_a_setting_is_named_by_its_variable_and_its_option() -> None:
    assert variable_name("alert_failed_threshold") == "RICOCHET_ALERT_FAILED_THRESHOLD"
    assert option_name("log_level") == "--log-level"


def test_defaults() -> None:
    """With nothing set, the SPEC's defaults apply."""
    s = load_settings()
    assert s.amqp_url == "amqp://guest:guest@localhost:5672/"
    assert (s.queue, s.queue_type, s.max_retries) == ("jobs", "quorum", 3)
    assert (s.retry_delay_ms, s.retry_delay_multiplier, s.retry_delay_max_ms) == (
        30000,
        2.0,
        3600000,
    )
    assert (s.prefetch, s.handler_timeout_s, s.shutdown_timeout_s) == (32, 300, 30)
    assert (s.log_level, s.log_format, s.http_port) == ("INFO", "json", 8000)
    assert s.alert_webhook_url is None
    assert (s.alert_failed_threshold, s.alert_interval_s) == (10, 60)
    assert s.management_url == "http://localhost:15672/"


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("RICOCHET_MAX_RETRIES", "26", "RICOCHET_MAX_RETRIES='26' is invalid: allowed 0-25"),
        ("RICOCHET_MAX_RETRIES", "-1", "allowed 0-25"),
        ("RICOCHET_MAX_RETRIES", "three", "RICOCHET_MAX_RETRIES='three' is invalid"),
        ("RICOCHET_RETRY_DELAY_MS", "9", "allowed 10-86400000"),
        ("RICOCHET_RETRY_DELAY_MULTIPLIER", "0.5", "allowed 1.0-10.0"),
        ("RICOCHET_PREFETCH", "0", "allowed 1-65535"),
        ("RICOCHET_PREFETCH", "65536", "allowed 1-65535"),
        ("RICOCHET_HANDLER_TIMEOUT_S", "0", "allowed > 0"),
        ("RICOCHET_SHUTDOWN_TIMEOUT_S", "-1", "allowed >= 0"),
        ("RICOCHET_HTTP_PORT", "70000", "allowed 0-65535"),
        ("RICOCHET_ALERT_FAILED_THRESHOLD", "0", "allowed >= 1"),
        ("RICOCHET_ALERT_INTERVAL_S", "0.5", "allowed >= 1"),
        ("RICOCHET_PAUSE_FAILURE_RATIO", "1.5", "allowed 0.0-1.0"),
        ("RICOCHET_PAUSE_FAILURE_RATIO", "-0.1", "allowed 0.0-1.0"),
        ("RICOCHET_PAUSE_MIN_JOBS", "0", "allowed >= 1"),
        ("RICOCHET_PAUSE_WINDOW_S", "0", "allowed 1-3600"),
        ("RICOCHET_PAUSE_S", "3601", "allowed 1-3600"),
        ("RICOCHET_QUEUE", "jobs/1", "allowed 1-200 characters of A-Za-z0-9._-"),
        ("RICOCHET_QUEUE", "q" * 201, "allowed 1-200 characters"),
        # SPEC 18: the shared objects' prefix, the broker's, and names derived from a queue's.
        ("RICOCHET_QUEUE", "ricochet.jobs", "not beginning with amq. or ricochet."),
        ("RICOCHET_QUEUE", "amq.jobs", "not beginning with amq. or ricochet."),
        ("RICOCHET_QUEUE", "jobs.failed", "not a name ricochet derives"),
        ("RICOCHET_QUEUE", "jobs.failed.events", "not a name ricochet derives"),
        ("RICOCHET_QUEUE", "jobs.retry.3", "not a name ricochet derives"),
        ("RICOCHET_QUEUE", "jobs.retry.1.lane.2", "not a name ricochet derives"),
        ("RICOCHET_QUEUE", "jobs.delay.7", "not a name ricochet derives"),
        ("RICOCHET_QUEUE", "jobs.topology", "not a name ricochet derives"),
        ("RICOCHET_QUEUE_TYPE", "stream", "allowed one of quorum, classic"),
        ("RICOCHET_LOG_FORMAT", "xml", "allowed one of json, console"),
        ("RICOCHET_LOG_LEVEL", "LOUD", "allowed one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
        ("RICOCHET_HANDLER", "ricochet.handlers.example", "allowed module.path:attribute"),
        ("RICOCHET_AMQP_URL", "http://broker/", "allowed an amqp:// or amqps:// URL"),
        ("RICOCHET_ALERT_WEBHOOK_URL", "ftp://x/", "allowed an http:// or https:// URL"),
        ("RICOCHET_MANAGEMENT_URL", "amqp://x/", "allowed an http:// or https:// URL"),
        ("RICOCHET_RETRY_DELAY_MAX_MS", "86400001", "allowed >= RICOCHET_RETRY_DELAY_MS"),
    ],
)
def test_out_of_range(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    """An invalid value gives one line naming the variable, the value and the allowed range."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    text = str(caught.value)
    assert message in text
    assert text.startswith(f"{variable}=")
    assert "\n" not in text


def test_max_delay_below_first_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cap may not be below the first delay."""
    monkeypatch.setenv("RICOCHET_RETRY_DELAY_MS", "5000")
    monkeypatch.setenv("RICOCHET_RETRY_DELAY_MAX_MS", "4000")
    with pytest.raises(
        ConfigError, match=r"RICOCHET_RETRY_DELAY_MAX_MS='4000' is invalid: allowed >="
    ):
        load_settings()


def test_password_never_in_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """An invalid broker URL is echoed without its password."""
    monkeypatch.setenv("RICOCHET_AMQP_URL", "amqp://user:s3cret@host:notaport/")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "s3cret" not in str(caught.value)
    assert "user:***@" in str(caught.value)


@pytest.mark.parametrize(
    ("variable", "url", "shown"),
    [
        # No scheme: redact() cannot see a URL.
        ("RICOCHET_AMQP_URL", "guest:s3cret@localhost", "***@localhost"),
        # A raw @ in the password.
        ("RICOCHET_AMQP_URL", "amqp://guest:s3cr@t@host:x/", "amqp://guest:***@host:x/"),
        ("RICOCHET_MANAGEMENT_URL", "admin:s3cret@localhost:15672", "***@localhost:15672"),
        ("RICOCHET_MANAGEMENT_URL", "http://admin:s3cret@host:x/", "http://admin:***@host:x/"),
    ],
)
def test_password_never_in_error_of_a_malformed_url(
    monkeypatch: pytest.MonkeyPatch, variable: str, url: str, shown: str
) -> None:
    """A broker or management URL too malformed to parse is shown without its password."""
    monkeypatch.setenv(variable, url)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "s3cr" not in str(caught.value)
    assert str(caught.value).startswith(f"{variable}={shown!r} is invalid")


def test_first_delay_above_the_default_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """A first delay above the default cap names the cap with the value it has, its default."""
    monkeypatch.setenv("RICOCHET_RETRY_DELAY_MS", "7200000")
    with pytest.raises(
        ConfigError,
        match=r"^RICOCHET_RETRY_DELAY_MAX_MS='3600000' is invalid: allowed >= RICOCHET_RETRY",
    ):
        load_settings()


def test_unknown_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """A misspelt RICOCHET_ variable is an error with a suggestion, not silently ignored."""
    monkeypatch.setenv("RICOCHET_MAX_RETRY", "5")
    with pytest.raises(
        ConfigError, match=r"RICOCHET_MAX_RETRY is not a ricochet setting.*RICOCHET_MAX_RETRIES"
    ):
        load_settings()


def test_env_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """RICOCHET_ENV_FILE names a file of settings; the environment wins over it."""
    env_file = tmp_path / "ricochet.env"
    env_file.write_text("# comment\nRICOCHET_QUEUE=from-file\nRICOCHET_MAX_RETRIES=5\n")
    monkeypatch.setenv("RICOCHET_ENV_FILE", str(env_file))
    monkeypatch.setenv("RICOCHET_MAX_RETRIES", "1")
    s = load_settings()
    assert (s.queue, s.max_retries) == ("from-file", 1)


def test_env_file_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A missing env file, or a bad value or unknown name inside one, is a ConfigError."""
    monkeypatch.setenv("RICOCHET_ENV_FILE", str(tmp_path / "missing.env"))
    with pytest.raises(ConfigError, match="no such file"):
        load_settings()
    env_file = tmp_path / "bad.env"
    env_file.write_text("RICOCHET_PREFETCH=0\n")
    monkeypatch.setenv("RICOCHET_ENV_FILE", str(env_file))
    with pytest.raises(ConfigError, match="RICOCHET_PREFETCH='0' is invalid: allowed 1-65535"):
        load_settings()
    env_file.write_text("RICOCHET_PREFETCHES=3\n")
    with pytest.raises(ConfigError, match="RICOCHET_PREFETCHES is not a ricochet setting"):
        load_settings()


def test_log_level_case_insensitive(monkeypatch: pytest.MonkeyPatch) -> None:
    """Level names are accepted in any case; an empty webhook URL means unset."""
    monkeypatch.setenv("RICOCHET_LOG_LEVEL", "debug")
    monkeypatch.setenv("RICOCHET_ALERT_WEBHOOK_URL", "")
    s = load_settings()
    assert s.log_level == "DEBUG"
    assert s.alert_webhook_url is None


def test_settings_are_frozen() -> None:
    """Settings are plain data built once: nothing changes them later."""
    s = Settings()
    with pytest.raises(ValueError, match="frozen"):
        s.queue = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://hooks.example.com:x/services/T0/B0/s3cret", "https://hooks.example.com:x/***"),
        ("ftp://hooks.example.com/alert?token=s3cret", "ftp://hooks.example.com/***"),
        ("ftp://hooks.example.com/?token=s3cret&to=http://x/", "ftp://hooks.example.com/***"),
        ("hooks.example.com/services/s3cret", "hooks.example.com/***"),
        ("https://user:s3cret@:x/", "https://:x/***"),
    ],
)
def test_webhook_token_never_in_error(
    monkeypatch: pytest.MonkeyPatch, url: str, shown: str
) -> None:
    """An invalid webhook URL is shown by its scheme and host only: its path, query and user
    part (where webhook tokens live) are never echoed."""
    monkeypatch.setenv("RICOCHET_ALERT_WEBHOOK_URL", url)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "s3cret" not in str(caught.value)
    assert str(caught.value).startswith(f"RICOCHET_ALERT_WEBHOOK_URL={shown!r} is invalid")


@pytest.mark.parametrize(
    "name",
    [name for name, field in Settings.model_fields.items() if field.annotation is float],
)
@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "Infinity"])
def test_floats_are_finite(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    """No duration or multiplier may be infinite or NaN: a timeout of inf never fires, and
    NaN slips past every bound."""
    variable = variable_name(name)
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=rf"^{variable}='{value}' is invalid: allowed"):
        load_settings()


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "::1", "::"])
def test_http_host_is_an_address(monkeypatch: pytest.MonkeyPatch, host: str) -> None:
    """RICOCHET_HTTP_HOST takes an IPv4 or IPv6 address; loopback unless set."""
    assert load_settings().http_host == "127.0.0.1"
    monkeypatch.setenv("RICOCHET_HTTP_HOST", host)
    assert load_settings().http_host == host


def test_http_host_is_not_a_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host name is refused: which interfaces it means depends on the resolver."""
    monkeypatch.setenv("RICOCHET_HTTP_HOST", "localhost")
    with pytest.raises(ConfigError, match=r"^RICOCHET_HTTP_HOST='localhost' is invalid"):
        load_settings()


@pytest.mark.parametrize("token", ["short", "sixteen chars ok", "é" * 20, "x" * 15])
def test_console_token_is_checked_and_never_shown(
    monkeypatch: pytest.MonkeyPatch, token: str
) -> None:
    """A console token too short, or with spaces or characters a person cannot type reliably,
    stops the process; the message names the variable and the rule, never the token."""
    monkeypatch.setenv("RICOCHET_CONSOLE_TOKEN", token)
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert str(error.value) == (
        "RICOCHET_CONSOLE_TOKEN='***' is invalid: allowed at least 16 printable characters, "
        "no spaces"
    )


def test_console_token_is_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """A good token is kept, and prints as stars in a repr or a dump of the settings; unset or
    empty, the console is read-only."""
    monkeypatch.setenv("RICOCHET_CONSOLE_TOKEN", "s3cret-s3cret-s3cret")
    s = load_settings()
    assert s.console_token is not None
    assert s.console_token.get_secret_value() == "s3cret-s3cret-s3cret"
    assert "s3cret" not in repr(s)
    assert "s3cret" not in str(s.model_dump())
    monkeypatch.setenv("RICOCHET_CONSOLE_TOKEN", "")
    assert load_settings().console_token is None


@pytest.mark.parametrize(
    ("environ", "retries", "ladder"),
    [
        ({"RICOCHET_RETRY_DELAYS_MS": "1000,5000, 5000"}, 3, (1000, 5000, 5000)),
        ({"RICOCHET_RETRY_DELAYS_MS": "10"}, 1, (10,)),
        ({"RICOCHET_RETRY_DELAYS_MS": "250", "RICOCHET_MAX_RETRIES": "1"}, 1, (250,)),
        ({"RICOCHET_RETRY_DELAYS_MS": ""}, 3, None),  # unset, as an empty value in an env file
        ({"RICOCHET_RETRY_DELAYS_MS": ",".join(["86400000"] * 25)}, 25, (86_400_000,) * 25),
    ],
)
def test_an_explicit_ladder_sets_the_budget(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], retries: int, ladder: object
) -> None:
    """RICOCHET_RETRY_DELAYS_MS gives the tiers' delays, and the budget is their number (a
    RICOCHET_MAX_RETRIES that says the same is no conflict)."""
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    s = load_settings()
    assert (s.max_retries, s.retry_delays_ms) == (retries, ladder)


@pytest.mark.parametrize("value", ["5", "a,b", "1000,", "1000;2000", ",".join(["100"] * 26), "-10"])
def test_an_explicit_ladder_out_of_range(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """A ladder of anything but 1-25 integers of 10-86400000 ms is named with the range."""
    monkeypatch.setenv("RICOCHET_RETRY_DELAYS_MS", value)
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert str(error.value) == (
        f"RICOCHET_RETRY_DELAYS_MS={value!r} is invalid: allowed 1-25 comma-separated integers, "
        "each 10-86400000"
    )


@pytest.mark.parametrize(
    ("other", "value"),
    [
        ("RICOCHET_MAX_RETRIES", "3"),
        ("RICOCHET_RETRY_DELAY_MS", "30000"),
        ("RICOCHET_RETRY_DELAY_MULTIPLIER", "2.0"),
        ("RICOCHET_RETRY_DELAY_MAX_MS", "3600000"),
    ],
)
def test_a_ladder_and_the_formula_conflict(
    monkeypatch: pytest.MonkeyPatch, other: str, value: str
) -> None:
    """A ladder set with a setting of the formula (or another budget) names both variables."""
    monkeypatch.setenv("RICOCHET_RETRY_DELAYS_MS", "1000,2000")
    monkeypatch.setenv(other, value)
    with pytest.raises(ConfigError) as error:
        load_settings()
    assert "RICOCHET_RETRY_DELAYS_MS" in str(error.value)
    assert other in str(error.value)


@pytest.mark.parametrize(
    ("value", "ok"),
    [("0", True), ("0.5", True), ("1", True), ("1.01", False), ("-0.1", False), ("nan", False)],
)
def test_jitter_range(monkeypatch: pytest.MonkeyPatch, value: str, ok: bool) -> None:
    """RICOCHET_RETRY_JITTER is a share of the delay, 0.0-1.0."""
    monkeypatch.setenv("RICOCHET_RETRY_JITTER", value)
    if ok:
        assert load_settings().retry_jitter == float(value)
        return
    with pytest.raises(ConfigError, match=r"RICOCHET_RETRY_JITTER=.* is invalid: allowed"):
        load_settings()


def test_queues_each_with_its_own_prefetch(monkeypatch: pytest.MonkeyPatch) -> None:
    """RICOCHET_QUEUES gives the worker's queues, each with its prefetch or RICOCHET_PREFETCH;
    unset, the worker's one queue is RICOCHET_QUEUE."""
    assert [(s.queue, s.prefetch) for s in load_settings().per_queue()] == [("jobs", 32)]
    monkeypatch.setenv("RICOCHET_PREFETCH", "7")
    monkeypatch.setenv("RICOCHET_QUEUES", " thumbnails=1, email=5 ,sync")
    settings = load_settings()
    assert settings.queue == "jobs"  # still the commands' and clients' queue
    assert settings.queue_names == ("thumbnails", "email", "sync")
    assert [(s.queue, s.prefetch) for s in settings.per_queue()] == [
        ("thumbnails", 1),
        ("email", 5),
        ("sync", 7),
    ]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "set but empty"),
        (" ", "set but empty"),
        ("a,,b", "entry '': 1-200 characters of A-Za-z0-9._- are allowed"),
        ("a,b,a", "entry 'a': the queue is listed twice"),
        ("a=0", "entry 'a=0': a prefetch is an integer 1-65535"),
        ("a=65536", "a prefetch is an integer 1-65535"),
        ("a=x", "a prefetch is an integer 1-65535"),
        ("a=", "a prefetch is an integer 1-65535"),
        ("ricochet.mine", "entry 'ricochet.mine': names beginning with amq."),
        ("amq.q", "names beginning with amq."),
        ("a,a.failed", "entry 'a.failed': the name of an object ricochet derives"),
        ("a b", "1-200 characters of A-Za-z0-9._- are allowed"),
        ("x" * 201, "1-200 characters of A-Za-z0-9._- are allowed"),
        (",".join(f"q{i}" for i in range(65)), "65 entries, more than 64"),
    ],
)
def test_queues_refused_naming_the_entry(
    monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    """A bad RICOCHET_QUEUES is one line naming the variable and the bad entry."""
    monkeypatch.setenv("RICOCHET_QUEUES", value)
    with pytest.raises(ConfigError, match=r"^RICOCHET_QUEUES is invalid: ") as error:
        load_settings()
    assert message in str(error.value)
