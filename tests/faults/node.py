"""Private RabbitMQ nodes for the fault suite, so that a stopped app, an alarm or a cluster never
touches the broker the other tests use. Each node has its own name, ports and data directory."""

import json
import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tests.broker import Broker
from tests.support import ROOT

START_TIMEOUT_S = 90
# Node data must belong to the user the broker runs as (the server script switches to it).
BROKER_USER = "rabbitmq"


def ctl(node: str, *args: str, timeout_s: float = 60, check: bool = True) -> str:
    """Run `rabbitmqctl -n node ARGS` and return its output."""
    done = subprocess.run(
        ["rabbitmqctl", "-n", node, "-q", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if check and done.returncode != 0:
        raise AssertionError(
            f"rabbitmqctl {' '.join(args)} on {node}: {done.stderr or done.stdout}"
        )
    return done.stdout


@dataclass
class Node:
    """One RabbitMQ node of our own: AMQP on 127.0.0.1:amqp_port."""

    short_name: str
    amqp_port: int
    base: Path

    @property
    def name(self) -> str:
        return f"{self.short_name}@localhost"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/"

    @property
    def broker(self) -> Broker:
        """The node as the tests' broker (it has no management plugin)."""
        return Broker(self.url, "", ("rabbitmqctl", "-n", self.name), private=True)

    @property
    def home(self) -> Path:
        return self.base / self.short_name

    def _env(self) -> dict[str, str]:
        home = self.home
        return {
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_PORT": str(self.amqp_port),
            "RABBITMQ_DIST_PORT": str(self.amqp_port + 20000),
            "RABBITMQ_CONFIG_FILE": str(home / "rabbitmq"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(home / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(home / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(home / "data"),
            "RABBITMQ_LOG_BASE": str(home / "log"),
            "RABBITMQ_PID_FILE": str(home / "pid"),
        }

    def start(self) -> "Node":
        """Start the node with no data (stopping a leftover of an earlier run first) and wait
        until it runs."""
        self.stop()
        home = self.home
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
        (home / "rabbitmq.conf").write_text(
            f"listeners.tcp.local = 127.0.0.1:{self.amqp_port}\n"
            # A 2-core machine: the broker must not take alarms for the tests' own load.
            "vm_memory_high_watermark.relative = 0.4\n"
            "disk_free_limit.absolute = 50MB\n"
        )
        # The random exchange spreads jittered retries over their lanes, the consistent-hash
        # exchange the jobs with a key over their key lanes.
        (home / "enabled_plugins").write_text(
            "[rabbitmq_random_exchange,rabbitmq_consistent_hash_exchange].\n"
        )
        # The compose broker's: a dead-letter held at a restart (stop_app, a cluster's node
        # stopped) is tried again after 5 s, not 3 minutes.
        shutil.copy(ROOT / "config" / "advanced.config", home / "advanced.config")
        shutil.chown(self.base, BROKER_USER, BROKER_USER)
        for path in [home, *home.iterdir()]:
            shutil.chown(path, BROKER_USER, BROKER_USER)
        return self.restart()

    def restart(self) -> "Node":
        """Start the stopped node again on the data it had, and wait until it runs."""
        env = {**_base_env(), **self._env()}
        subprocess.run(["rabbitmq-server", "-detached"], env=env, check=True, timeout=60)
        self.wait_running()
        return self

    def wait_running(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            # await_startup fails at once while the node is not yet registered with epmd.
            probe = subprocess.run(
                ["rabbitmqctl", "-n", self.name, "-q", "await_startup", "--timeout", "30"],
                capture_output=True,
                text=True,
                check=False,
            )
            if probe.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"node {self.name} did not start: {probe.stderr}")
            time.sleep(0.5)

    def stop(self) -> None:
        """Stop the whole node if it runs."""
        ctl(self.name, "stop", check=False)

    def discard(self) -> None:
        """Stop the node and remove its data."""
        self.stop()
        shutil.rmtree(self.home, ignore_errors=True)

    def ctl(self, *args: str, timeout_s: float = 60) -> str:
        return ctl(self.name, *args, timeout_s=timeout_s)

    def running_nodes(self) -> set[str]:
        """The nodes of this node's cluster that run, as this node sees them."""
        status = json.loads(self.ctl("cluster_status", "--formatter", "json"))
        return set(status["running_nodes"])

    def join(self, other: "Node") -> None:
        """Make this (fresh) node a member of other's cluster."""
        self.ctl("stop_app")
        self.ctl("join_cluster", other.name)
        self.ctl("start_app")
        self.wait_running()


def start_cluster(base: Path, names: list[str], ports: list[int]) -> list[Node]:
    """Start fresh nodes (at once: each takes seconds to boot) and join the others to the first."""
    nodes = [Node(name, port, base) for name, port in zip(names, ports, strict=True)]
    with ThreadPoolExecutor(len(nodes)) as pool:
        list(pool.map(Node.start, nodes))
    for node in nodes[1:]:
        node.join(nodes[0])
    return nodes


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RABBITMQ_")}


def node_base() -> Path:
    """A directory for node data that the broker's user may write to."""
    path = Path(tempfile.mkdtemp(prefix="ricochet-nodes-"))
    path.chmod(0o755)
    return path
