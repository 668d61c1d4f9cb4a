"""The broker under test, from one place: every test reaches RabbitMQ through BROKER.

`scripts/brokers.sh env NAME` prints the variables for a broker of the matrix; without them the
tests use the machine's own RabbitMQ.

Each test process works in a virtual host of its own (`ricochet-test.WORKER.PID`), made when its
session starts and deleted, with all it holds, when it ends: suites and pytest-xdist workers that
run beside each other on one broker never share a queue, the vhost's own `ricochet.*` objects
(orphans, cancels, the delays' levels, the schedules' lead) included. A test that needs those
objects to itself takes a scratch vhost (`Broker.scratch_vhost`), named after its process's.
"""

import asyncio
import contextlib
import json
import os
import re
import shlex
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from ricochet.broker.management import api_url, authorization, vhost

VHOST_PREFIX = "ricochet-test."
# rabbitmqctl commands that act in one vhost ("/" unless told): run in the tests' own.
VHOST_SCOPED = {
    "set_policy",
    "clear_policy",
    "list_policies",
    "set_parameter",
    "clear_parameter",
    "list_parameters",
    "list_queues",
    "list_exchanges",
    "list_bindings",
    "purge_queue",
    "delete_queue",
}


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
    # True for a broker of the matrix no other run uses at all (RICOCHET_TEST_BROKER_ALONE=1, a
    # run by hand): a fault row may stop and start it.
    alone: bool = False

    @classmethod
    def from_env(cls) -> "Broker":
        shared = cls(
            amqp_url=os.environ.get("RICOCHET_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
            management_url=os.environ.get(
                "RICOCHET_TEST_MANAGEMENT_URL", "http://127.0.0.1:15672/"
            ),
            ctl=tuple(shlex.split(os.environ.get("RICOCHET_TEST_RABBITMQCTL", "rabbitmqctl"))),
            private=os.environ.get("RICOCHET_TEST_BROKER", "local") != "local",
            alone=os.environ.get("RICOCHET_TEST_BROKER_ALONE") == "1",
        )
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        return shared.in_vhost(f"{VHOST_PREFIX}{worker}.{os.getpid()}")

    @property
    def vhost(self) -> str:
        return vhost(self.amqp_url)

    def in_vhost(self, name: str) -> "Broker":
        """The same broker, reached in another vhost."""
        parts = urlsplit(self.amqp_url)
        return replace(self, amqp_url=urlunsplit(parts._replace(path="/" + quote(name, safe=""))))

    def rabbitmqctl(self, *args: str, check: bool = True, timeout_s: float = 60) -> str:
        """Run rabbitmqctl ARGS against this broker's node and return its output; a command
        that acts in one vhost acts in the tests' own unless ARGS name one (-p)."""
        if args and args[0] in VHOST_SCOPED and "-p" not in args:
            args = (args[0], "-p", self.vhost, *args[1:])
        done = subprocess.run(
            [*self.ctl, *args], capture_output=True, text=True, timeout=timeout_s, check=False
        )
        if check and done.returncode != 0:
            raise AssertionError(f"rabbitmqctl {' '.join(args)}: {done.stderr or done.stdout}")
        return done.stdout

    def api(self, method: str, path: str, body: object = None) -> tuple[int, Any]:
        """Call the management API (PATH under its /api/, BODY sent as JSON) with the AMQP URL's
        credentials: the reply's HTTP status and its JSON body (None when empty), whatever the
        status."""
        request = urllib.request.Request(
            api_url(self.management_url) + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={
                "Authorization": authorization(self.management_url, self.amqp_url),
                "Content-Type": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, _decoded(response.read())
        except urllib.error.HTTPError as refused:
            with refused:
                return refused.code, _decoded(refused.read())

    def _done(self, method: str, path: str, body: object = None) -> Any:
        """Call the management API: the reply's body, or AssertionError when it is not a
        success (2xx)."""
        status, reply = self.api(method, path, body)
        if not 200 <= status < 300:
            raise AssertionError(f"{method} {path}: HTTP {status} {reply}")
        return reply

    def open_vhost(self) -> None:
        """Make this broker's vhost, after deleting the vhosts of test processes that no longer
        run (a run killed before its end), their scratch vhosts with them."""
        for found in self._done("GET", "vhosts?columns=name"):
            name = found["name"]
            pid = re.fullmatch(re.escape(VHOST_PREFIX) + r"[\w-]+\.(\d+)(\.\w+)?", name)
            if pid and not _alive(int(pid.group(1))):
                # Another test process starting at the same moment may have deleted it first.
                status, reply = self.api("DELETE", "vhosts/" + quote(name, safe=""))
                assert status < 300 or status == 404, f"DELETE vhost {name}: HTTP {status} {reply}"
        self._make_vhost()

    def close_vhost(self) -> None:
        """Delete this broker's vhost and everything in it."""
        self._done("DELETE", "vhosts/" + quote(self.vhost, safe=""))

    @contextlib.asynccontextmanager
    async def scratch_vhost(self) -> AsyncIterator[str]:
        """A new vhost beside this broker's, for a test that needs the vhost's own objects
        (ricochet.orphans, the cancel store, the delays' levels) to itself: its AMQP URL. Deleted
        after, with all it holds."""
        scratch = self.in_vhost(f"{self.vhost}.{uuid.uuid4().hex[:8]}")
        await asyncio.to_thread(scratch._make_vhost)
        try:
            yield scratch.amqp_url
        finally:
            await asyncio.to_thread(scratch.close_vhost)

    def _make_vhost(self) -> None:
        """Make this broker's vhost, with every permission for the URL's user."""
        where = quote(self.vhost, safe="")
        self._done("PUT", f"vhosts/{where}", {})
        user = quote(urlsplit(self.amqp_url).username or "guest", safe="")
        every = {"configure": ".*", "write": ".*", "read": ".*"}
        self._done("PUT", f"permissions/{where}/{user}", every)


def _decoded(text: bytes) -> Any:
    return json.loads(text) if text else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


BROKER = Broker.from_env()
