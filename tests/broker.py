"""The broker under test, from one place: every test reaches RabbitMQ through BROKER.

`scripts/brokers.sh env NAME` prints the variables for a broker of the matrix; without them the
tests use the machine's own RabbitMQ.
"""

import os
import shlex
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Broker:
    """How the tests reach one RabbitMQ node: AMQP, the management API (no credentials in the
    URL: they are the AMQP URL's), and its rabbitmqctl."""

    amqp_url: str
    management_url: str
    # The rabbitmqctl command line for this node (a chroot's own, for a broker of the matrix).
    ctl: tuple[str, ...]
    # True for a broker that exists for this test run alone, which faults may disturb.
    private: bool = False

    @classmethod
    def from_env(cls) -> "Broker":
        return cls(
            amqp_url=os.environ.get("RICOCHET_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
            management_url=os.environ.get(
                "RICOCHET_TEST_MANAGEMENT_URL", "http://127.0.0.1:15672/"
            ),
            ctl=tuple(shlex.split(os.environ.get("RICOCHET_TEST_RABBITMQCTL", "rabbitmqctl"))),
            private=os.environ.get("RICOCHET_TEST_BROKER", "local") != "local",
        )

    def rabbitmqctl(self, *args: str, check: bool = True, timeout_s: float = 60) -> str:
        """Run rabbitmqctl ARGS against this broker's node and return its output."""
        done = subprocess.run(
            [*self.ctl, *args], capture_output=True, text=True, timeout=timeout_s, check=False
        )
        if check and done.returncode != 0:
            raise AssertionError(f"rabbitmqctl {' '.join(args)}: {done.stderr or done.stdout}")
        return done.stdout


BROKER = Broker.from_env()
