"""Replay against the real broker: filters, dry runs, the retry budget and interruption."""

import asyncio
import signal

import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage
from ricochet.broker.declare import declare
from ricochet.headers import FAILURE_HEADERS
from ricochet.names import Names
from ricochet.ops.replay import replay
from ricochet.ops.selection import Selection

from tests.integration.failures import publish_failed
from tests.recorder import Recorder
from tests.support import (
    StartWorker,
    depth,
    make_settings,
    publish,
    ricochet_env,
    run_cli,
    spawn,
    take,
    wait_for,
)

# message_id -> (type, error)
COPIES = {
    "m1": ("report", ValueError("no rows")),
    "m2": ("mail", KeyError("address")),
    "m3": ("report", KeyError("address")),
    "m4": ("mail", TimeoutError("smtp")),
}


def message_ids(messages: list[AbstractIncomingMessage]) -> list[str]:
    """The messages' ids; the tests publish every job with one."""
    ids = []
    for message in messages:
        assert message.message_id is not None
        ids.append(message.message_id)
    return ids


async def make_copies(connection: AbstractConnection, channel: AbstractChannel, queue: str) -> None:
    await declare(connection, make_settings(queue))
    for message_id, (job_type, error) in COPIES.items():
        await publish_failed(
            channel, queue, message_id, error, job_type=job_type, headers={"tenant": "acme"}
        )


@pytest.mark.parametrize(
    ("selection", "limit", "moved"),
    [
        pytest.param(Selection(), None, ["m1", "m2", "m3", "m4"], id="everything"),
        pytest.param(Selection(reason="KeyError"), None, ["m2", "m3"], id="reason substring"),
        pytest.param(Selection(type="mail"), None, ["m2", "m4"], id="type"),
        pytest.param(Selection(message_id="m3"), None, ["m3"], id="message id"),
        pytest.param(Selection(), 2, ["m1", "m2"], id="limit"),
        pytest.param(Selection(reason="KeyError", type="mail"), None, ["m2"], id="combined"),
        pytest.param(Selection(reason="nothing like it"), None, [], id="no match"),
    ],
)
async def test_replay_moves_what_matches(
    queue_name: str,
    connection: AbstractConnection,
    channel: AbstractChannel,
    selection: Selection,
    limit: int | None,
    moved: list[str],
) -> None:
    """Matching copies go to Q with their body and properties, without failure headers and with
    replay-count 1; the others stay in Q.failed in their order."""
    names = Names(queue_name)
    await make_copies(connection, channel, queue_name)
    result = await replay(connection, names, selection, limit=limit)
    assert [f.message_id for f in result.selected] == moved
    assert result.kept == 4 - len(moved)
    jobs = await take(channel, queue_name, len(moved))
    assert await depth(channel, queue_name) == 0
    assert [m.message_id for m in jobs] == moved
    for job in jobs:
        assert job.body == f'{{"id": "{job.message_id}"}}'.encode()
        assert job.type == COPIES[str(job.message_id)][0]
        assert job.content_type == "application/json"
        assert job.delivery_mode == 2
        headers = dict(job.headers or {})
        assert not set(headers) & set(FAILURE_HEADERS)
        assert headers["tenant"] == "acme"
        assert headers["replay-count"] == 1
        assert "x-death" not in headers
    kept = await take(channel, names.failed, 4 - len(moved))
    assert [m.message_id for m in kept] == [m for m in COPIES if m not in moved]
    assert all(m.headers and m.headers["failed-reason"] for m in kept)


async def test_dry_run_lists_and_moves_nothing(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """`replay --dry-run` prints what would move (id, type, reason, failed_at), and counts per
    reason with --group-by; every copy stays in Q.failed, in order."""
    names = Names(queue_name)
    await make_copies(connection, channel, queue_name)
    env = ricochet_env(make_settings(queue_name))
    listed = run_cli(["replay", "--dry-run", "--type", "report"], env)
    grouped = run_cli(["replay", "--dry-run", "--group-by", "reason", "--reason", "Error"], env)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["message_id", "type", "reason", "failed_at"]
    assert [line.split()[:2] for line in lines[1:3]] == [["m1", "report"], ["m3", "report"]]
    assert "ValueError: no rows" in lines[1]
    assert "+00:00" in lines[1]
    assert lines[-1] == f"would move 2 to {queue_name}, kept 2 (of 4)"
    assert grouped.returncode == 0, grouped.stderr
    assert "count  reason" in grouped.stdout
    assert "2      KeyError: 'address'" in grouped.stdout
    assert "1      TimeoutError: smtp" in grouped.stdout
    assert await depth(channel, queue_name) == 0
    kept = await take(channel, names.failed, 4)
    assert [m.message_id for m in kept] == list(COPIES)


async def test_replayed_job_starts_over_with_its_full_budget(
    queue_name: str, connection: AbstractConnection, start_worker: StartWorker
) -> None:
    """A job that used all its attempts comes back at attempt 1 and gets every retry again,
    then lands in Q.failed once more with replay-count 1."""
    recorder = Recorder()
    await start_worker(recorder, max_retries=2)
    channel = await connection.channel(publisher_confirms=True)
    await publish(channel, queue_name, '{"fail": "always"}', message_id="j1")
    names = Names(queue_name)

    async def failed_after(attempts: int) -> bool:
        return len(recorder.seen["j1"]) == attempts and await depth(channel, names.failed) == 1

    await wait_for(lambda: failed_after(3), 20, "the job to use its budget")
    result = await replay(connection, names, Selection(message_id="j1"))
    assert len(result.selected) == 1
    await wait_for(lambda: failed_after(6), 20, "the replayed job to use its budget again")
    assert recorder.attempts("j1") == [1, 2, 3, 1, 2, 3]
    assert {a.max_attempts for a in recorder.seen["j1"]} == {3}
    assert recorder.seen["j1"][3].headers["replay-count"] == 1
    copy = (await take(channel, names.failed, 1))[0]
    assert copy.headers is not None
    assert copy.headers["retry-count"] == 2
    assert copy.headers["failed-kind"] == "exhausted"
    assert copy.headers["replay-count"] == 1
    await channel.close()


async def test_interrupted_replay_loses_and_duplicates_nothing(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """SIGINT in the middle of `ricochet replay` stops it cleanly: every job is in exactly one of
    Q and Q.failed, none twice, and the summary says it stopped early."""
    total = 1500
    names = Names(queue_name)
    await declare(connection, make_settings(queue_name))
    ids = [f"m{i:04d}" for i in range(total)]
    for start in range(0, total, 100):
        await asyncio.gather(
            *(publish_failed(channel, queue_name, i, ValueError("x")) for i in ids[start:][:100])
        )
    proc = spawn(["replay"], ricochet_env(make_settings(queue_name)))
    try:

        async def underway() -> bool:
            return await depth(channel, queue_name) >= 50 or proc.poll() is not None

        await wait_for(underway, 30, "the replay to get going")
        proc.send_signal(signal.SIGINT)
        out, err = await asyncio.to_thread(proc.communicate, timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    summary = out.splitlines()[-1]
    assert summary.endswith("stopped early by a signal"), summary
    moved = await depth(channel, queue_name)
    assert 50 <= moved < total
    assert summary.startswith(f"moved {moved} to {queue_name}, kept {total - moved}")
    in_main = message_ids(await take(channel, queue_name, moved))
    in_failed = message_ids(await take(channel, names.failed, total - moved))
    assert await depth(channel, queue_name) == 0
    assert await depth(channel, names.failed) == 0
    assert sorted(in_main + in_failed) == ids
    assert in_main == ids[:moved]


async def test_a_copy_at_the_largest_replay_count_moves_with_the_others(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel
) -> None:
    """A replay-count at the largest signed 64-bit integer (a counter AMQP cannot carry one past)
    stays there when replayed, and every other copy moves with it."""
    names = Names(queue_name)
    await declare(connection, make_settings(queue_name))
    ids = [f"m{i}" for i in range(11)]
    for message_id in ids:
        count = {"replay-count": 2**63 - 1} if message_id == "m5" else {}
        await publish_failed(channel, queue_name, message_id, ValueError("x"), headers=count)
    result = await replay(connection, names, Selection())
    assert [f.message_id for f in result.selected] == ids
    jobs = await take(channel, queue_name, len(ids))
    assert message_ids(jobs) == ids
    counts = {m.message_id: (m.headers or {})["replay-count"] for m in jobs}
    assert counts == {i: 2**63 - 1 if i == "m5" else 1 for i in ids}
    assert await depth(channel, names.failed) == 0
