"""`ricochet worker` with RICOCHET_PROCESSES: a parent of N worker processes behind one port."""

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet.processes.liveness import LATE_S

from tests.handlers import wedge_marker
from tests.integration.test_worker_http import Samples, scrape
from tests.support import (
    answers,
    consumers,
    depth,
    free_port,
    journal,
    log_events,
    make_settings,
    publish,
    ricochet_env,
    run_cli,
    spawn,
    wait_for,
)

WEDGED_LINE = "worker process stopped making progress: killing it"


def start(
    queue: str, tmp_path: Path, processes: int | str, **overrides: object
) -> tuple["subprocess.Popen[str]", int]:
    """`ricochet worker` in a session of its own (a terminal's process group), its HTTP port."""
    port = free_port()
    overrides = {"handler": "tests.handlers:fault", **overrides}
    settings = make_settings(queue, processes=processes, http_port=port, **overrides)
    env = ricochet_env(settings, TEST_JOURNAL=str(tmp_path / "journal"))
    return spawn(["worker"], env, tmp_path / "worker.log", start_new_session=True), port


def lines(tmp_path: Path) -> list[dict[str, Any]]:
    return log_events((tmp_path / "worker.log").read_text())


def done(tmp_path: Path) -> set[str]:
    """The ids of the jobs whose handler completed."""
    return {message_id for event, message_id, _ in journal(tmp_path / "journal") if event == "done"}


def worker_pids(parent: "subprocess.Popen[str]") -> list[int]:
    """The parent's worker processes (multiprocessing's resource tracker is none of them)."""
    found = []
    for child in psutil.Process(parent.pid).children():
        # One just killed is a zombie until the parent reaps it: no longer one of them.
        with contextlib.suppress(psutil.ZombieProcess, psutil.NoSuchProcess):
            if "spawn_main" in " ".join(child.cmdline()):
                found.append(child.pid)
    return found


async def test_two_processes_share_the_queue_behind_one_port(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel, tmp_path: Path
) -> None:
    """Two worker processes, each with its own connection, consume the queue; /readyz is ready
    once both consume; /metrics counts every job of both once; every line names its pid."""
    worker, port = start(queue_name, tmp_path, 2)
    await wait_for(lambda: answers(port, "/readyz", 200), 30, "/readyz 200")
    assert await consumers(connection, queue_name) == 2
    pids = worker_pids(worker)
    assert len(pids) == 2
    for n in range(40):
        await publish(channel, queue_name, json.dumps({"sleep_s": 0.05}), message_id=f"job-{n}")
    await wait_for(lambda: len(journal(tmp_path / "journal")) == 80, 30, "40 jobs done")

    samples = await scrape(port)
    done = frozenset({("queue", queue_name), ("outcome", "succeeded")})
    assert samples[("ricochet_jobs_total", done)] == 40
    assert samples[("ricochet_worker_processes", frozenset())] == 2
    assert samples[("ricochet_ready", frozenset({("queue", queue_name)}))] == 1
    assert samples[("ricochet_worker_consuming", frozenset({("queue", queue_name)}))] == 1
    handled_by = {line["pid"] for line in lines(tmp_path) if line["event"] == "job succeeded"}
    assert handled_by == set(pids)  # both processes ran jobs, and said so
    assert {line["pid"] for line in lines(tmp_path)} == {worker.pid, *pids}

    worker.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(worker.wait, 30) == 0
    assert not any(psutil.pid_exists(pid) for pid in pids)


async def test_ctrl_c_to_the_process_group_counts_once(
    queue_name: str, channel: AbstractChannel, tmp_path: Path
) -> None:
    """A terminal's Ctrl-C reaches the parent and every process: each process still drains,
    finishing the jobs it runs (one signal, not two), and the parent exits 0."""
    worker, port = start(queue_name, tmp_path, 2, prefetch=2, shutdown_timeout_s=20)
    await wait_for(lambda: answers(port, "/readyz", 200), 30, "/readyz 200")
    for n in range(4):
        await publish(channel, queue_name, json.dumps({"sleep_s": 2}), message_id=f"slow-{n}")
    path = tmp_path / "journal"
    await wait_for(lambda: len(journal(path)) == 4, 20, "four jobs started")
    os.killpg(worker.pid, signal.SIGINT)
    assert await asyncio.to_thread(worker.wait, 30) == 0
    assert sorted(m for event, m, _ in journal(path) if event == "done") == [
        f"slow-{n}" for n in range(4)
    ]
    assert not any(
        line["event"] == "second signal: exiting without waiting for jobs"
        for line in lines(tmp_path)
    )
    assert await depth(channel, queue_name) == 0


async def test_second_signal_exits_at_once(
    queue_name: str, channel: AbstractChannel, tmp_path: Path
) -> None:
    """A second SIGTERM makes every process exit without waiting for its jobs, which go back
    to the queue."""
    worker, port = start(queue_name, tmp_path, 2, prefetch=1, shutdown_timeout_s=60)
    await wait_for(lambda: answers(port, "/readyz", 200), 30, "/readyz 200")
    for n in range(2):
        await publish(channel, queue_name, json.dumps({"sleep_s": 60}), message_id=f"long-{n}")
    await wait_for(lambda: len(journal(tmp_path / "journal")) == 2, 20, "both jobs started")
    worker.send_signal(signal.SIGTERM)
    await wait_for(lambda: answers(port, "/readyz", 503), 10, "/readyz 503 while draining")
    worker.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(worker.wait, 15) == 0
    await wait_for(lambda: depth(channel, queue_name), 10, "the two jobs back in the queue")
    assert await depth(channel, queue_name) == 2


async def test_a_process_that_dies_is_started_again(
    queue_name: str, connection: AbstractConnection, tmp_path: Path
) -> None:
    """kill -9 of one worker process: /readyz says 503 until another has taken its place and
    consumes; the restart is logged and counted."""
    worker, port = start(queue_name, tmp_path, 2)
    await wait_for(lambda: answers(port, "/readyz", 200), 30, "/readyz 200")
    victim, survivor = worker_pids(worker)
    os.kill(victim, signal.SIGKILL)
    await wait_for(lambda: answers(port, "/readyz", 503), 10, "/readyz 503")
    await wait_for(lambda: answers(port, "/readyz", 200), 30, "/readyz 200 again")
    assert await consumers(connection, queue_name) == 2
    assert survivor in worker_pids(worker)
    assert victim not in worker_pids(worker)
    samples = await scrape(port)
    assert samples[("ricochet_worker_process_restarts_total", frozenset())] == 1
    [died] = [line for line in lines(tmp_path) if line["event"].startswith("worker process died")]
    assert (died["child_pid"], died["signal"], died["restart_in_s"]) == (victim, "SIGKILL", 0)
    assert await answers(port, "/healthz", 200)  # one death is no crash loop


async def test_a_wedged_process_is_killed_and_replaced(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel, tmp_path: Path
) -> None:
    """A sync handler that holds the GIL in C (its process's event loop stops): the parent
    sees it within the handler timeout + 10 s, answers /readyz 503 meanwhile, kills the process
    and starts another; the job goes back to the queue and completes there, and so does every
    other job."""
    timeout_s = 2
    worker, port = start(
        queue_name, tmp_path, 2, handler="tests.handlers:wedging", handler_timeout_s=timeout_s
    )
    await wait_for(lambda: answers(port, "/readyz", 200), 30, "/readyz 200")
    marker = wedge_marker(str(tmp_path / "journal"), "wedge")
    await publish(channel, queue_name, json.dumps({"wedge_s": 60}), message_id="wedge")
    await wait_for(lambda: marker.exists() and marker.read_text(), 20, "the process wedged")
    wedged_at = time.monotonic()
    victim = int(marker.read_text())
    await wait_for(lambda: answers(port, "/readyz", 503), LATE_S + 2, "/readyz 503")
    assert victim in worker_pids(worker)  # not ready while it is silent, before its kill
    for n in range(20):
        await publish(channel, queue_name, json.dumps({"sleep_s": 0.05}), message_id=f"job-{n}")
    await wait_for(
        lambda: victim not in worker_pids(worker), timeout_s + 10, "the wedged process gone"
    )
    gone_s = time.monotonic() - wedged_at
    every_job = {"wedge", *(f"job-{n}" for n in range(20))}
    await wait_for(lambda: done(tmp_path) >= every_job, 30, "every job done, the wedged too")
    await wait_for(lambda: answers(port, "/readyz", 200), 30, "/readyz 200 again")
    assert gone_s < timeout_s + 10
    assert await consumers(connection, queue_name) == 2
    [seen_wedged] = [line for line in lines(tmp_path) if line["event"] == WEDGED_LINE]
    assert seen_wedged["child_pid"] == victim
    [died] = [line for line in lines(tmp_path) if line["event"].startswith("worker process died")]
    assert (died["child_pid"], died["signal"]) == (victim, "SIGKILL")
    samples = await scrape(port)
    assert samples[("ricochet_worker_process_restarts_total", frozenset())] == 1
    worker.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(worker.wait, 30) == 0


def series(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """The samples of one metric, by their labels."""
    return {labels: value for (sample, labels), value in samples.items() if sample == name}


async def test_jobs_in_flight_count_every_process(
    queue_name: str, channel: AbstractChannel, tmp_path: Path
) -> None:
    """Six jobs running in two processes: ricochet_jobs_in_flight reads 6, and 0 once done."""
    worker, port = start(queue_name, tmp_path, 2, prefetch=3)
    await wait_for(lambda: answers(port, "/readyz", 200), 30, "/readyz 200")
    for n in range(6):
        await publish(channel, queue_name, json.dumps({"sleep_s": 6}), message_id=f"slow-{n}")
    await wait_for(lambda: len(journal(tmp_path / "journal")) == 6, 20, "six jobs started")
    in_flight = frozenset({("queue", queue_name)})

    async def reads(value: float) -> bool:
        return series(await scrape(port), "ricochet_jobs_in_flight") == {in_flight: value}

    await wait_for(lambda: reads(6), 3, "6 jobs in flight")
    await wait_for(lambda: len(journal(tmp_path / "journal")) == 12, 20, "six jobs done")
    await wait_for(lambda: reads(0), 3, "no job in flight")
    worker.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(worker.wait, 30) == 0


async def test_the_leader_killed_leaves_no_series(queue_name: str, tmp_path: Path) -> None:
    """kill -9 of the process that leads the schedules: once the other leads, one
    ricochet_schedules_leading series reads 1, and none is left of the dead process."""
    worker, port = start(queue_name, tmp_path, 2, handler="tests.handlers:ticks")
    await wait_for(lambda: answers(port, "/readyz", 200), 30, "/readyz 200")

    def leaders() -> list[int]:
        return [line["pid"] for line in lines(tmp_path) if line["event"] == "leading schedules"]

    await wait_for(leaders, 30, "a process leading")
    [dead] = leaders()
    leading = {frozenset({("queue", queue_name)}): 1.0}
    assert series(await scrape(port), "ricochet_schedules_leading") == leading
    os.kill(dead, signal.SIGKILL)
    await wait_for(lambda: len(leaders()) == 2, 30, "another process leading")
    await wait_for(lambda: len(worker_pids(worker)) == 2, 30, "the dead process replaced")
    samples = await scrape(port)
    assert series(samples, "ricochet_schedules_leading") == leading
    assert not any(("pid", str(dead)) in labels for _, labels in samples)
    worker.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(worker.wait, 30) == 0


async def test_one_process_is_the_worker_itself(queue_name: str, tmp_path: Path) -> None:
    """RICOCHET_PROCESSES=1 (the default) runs no parent: the worker is the one process."""
    worker, port = start(queue_name, tmp_path, 1)
    await wait_for(lambda: answers(port, "/readyz", 200), 30, "/readyz 200")
    assert psutil.Process(worker.pid).children() == []
    worker.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(worker.wait, 30) == 0


def test_a_process_stopped_by_invalid_configuration_stops_the_parent(
    queue_name: str, tmp_path: Path
) -> None:
    """A handler that cannot be imported stops its process with exit 2, and then the parent
    with exit 2, naming the setting: starting it again would fail the same way."""
    settings = make_settings(queue_name, processes=2, handler="tests.no_such_module:handle")
    done = run_cli(["worker"], ricochet_env(settings), timeout_s=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "RICOCHET_HANDLER='tests.no_such_module:handle' is invalid" in done.stdout


def test_invalid_processes_exit_2() -> None:
    """RICOCHET_PROCESSES outside 1-256 (or auto) stops the command before anything starts."""
    settings = make_settings("unused")
    done = run_cli(["worker"], {**ricochet_env(settings), "RICOCHET_PROCESSES": "0"})
    assert done.returncode == 2
    assert "RICOCHET_PROCESSES='0' is invalid: allowed 1-256, or auto" in done.stderr
