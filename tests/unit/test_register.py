"""What a register's readers take from it: the user a URL authenticates as, and a topology record
that is not one (pure)."""

import pytest
from ricochet.broker.record import parsed_record
from ricochet.broker.register import amqp_user
from structlog.testing import capture_logs


@pytest.mark.parametrize(
    ("url", "user"),
    [
        ("amqp://guest:guest@127.0.0.1:5672/", "guest"),
        ("amqp://127.0.0.1/", "guest"),
        ("amqps://ricochet%40prod:secret@mq.example/vh", "ricochet@prod"),
    ],
)
def test_the_user_is_the_urls_or_amqps_default(url: str, user: str) -> None:
    assert amqp_user(url) == user


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b'"text"', b"[" * 100_000])
def test_a_record_that_is_not_a_json_object_is_passed_over(body: bytes) -> None:
    with capture_logs() as logs:
        assert parsed_record("q.topology", body) is None
    assert [x["event"] for x in logs] == ["topology record unreadable: the settings given are used"]


def test_a_record_is_read() -> None:
    assert parsed_record("q.topology", b'{"queue": "q"}') == {"queue": "q"}
