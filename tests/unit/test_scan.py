"""A scan's pure parts: where it finds the management API, which tells the failed queue's
delivery limit."""

import pytest
from ricochet.ops.scan import management_url_beside
from yarl import URL


@pytest.mark.parametrize(
    ("amqp", "api"),
    [
        ("amqp://guest:guest@127.0.0.1:5672/", "http://127.0.0.1:15672/"),
        ("amqp://u:p@rabbit/jobs", "http://rabbit:15672/"),
        ("amqp://127.0.0.1:5673/", "http://127.0.0.1:15673/"),
        ("amqps://mq.example.com/", "https://mq.example.com:15671/"),
        ("amqp://[::1]:5672/", "http://[::1]:15672/"),
    ],
)
def test_management_url_beside(amqp: str, api: str) -> None:
    """RabbitMQ's default pairing of ports, 15672 beside 5672 and 15671 (HTTPS) beside 5671; the
    same offset for other ports; never the AMQP URL's credentials or vhost."""
    assert management_url_beside(URL(amqp)) == api
