"""The monitor relaunches failed jobs on a timer (SPEC 22, RICOCHET_RELAUNCH_*): the copies of
the kinds chosen, replayed fewer times than the maximum, go back to the queue as a replay sends
them; the others stay in the failed queue."""

from pathlib import Path

from aio_pika.abc import AbstractChannel, AbstractConnection
from ricochet.broker.declare import declare
from ricochet.names import Names

from tests.support import (
    depth,
    make_settings,
    publish,
    ricochet_env,
    spawn,
    take,
    wait_for,
)


def failed_copy(kind: str, replays: int | None) -> dict[str, object]:
    headers: dict[str, object] = {
        "failed-kind": kind,
        "failed-reason": "ConnectionError: the API was down",
        "failed-at": "2026-11-26T18:00:00+00:00",
        "retry-count": 3,
        "original-queue": "q",
    }
    if replays is not None:
        headers["replay-count"] = replays
    return headers


async def test_the_monitor_relaunches_the_chosen_failed_copies(
    queue_name: str, connection: AbstractConnection, channel: AbstractChannel, tmp_path: Path
) -> None:
    """exhausted copies replayed 0 and 2 times go back (replay-count 1 and 3, the failure
    headers gone); one replayed 3 times and a permanent one stay, and nothing is doubled."""
    settings = make_settings(
        queue_name, relaunch_interval_s=10, relaunch_kinds="exhausted", relaunch_max=3
    )
    await declare(connection, settings)
    names = Names(queue_name)
    copies = {
        "fresh": failed_copy("exhausted", None),
        "twice": failed_copy("exhausted", 2),
        "thrice": failed_copy("exhausted", 3),
        "permanent": failed_copy("permanent", None),
    }
    for message_id, headers in copies.items():
        await publish(channel, names.failed, b"{}", headers=headers, message_id=message_id)
    monitor = spawn(["monitor"], ricochet_env(settings), tmp_path / "monitor.log")
    try:
        log_path = tmp_path / "monitor.log"
        await wait_for(lambda: "failed jobs relaunched" in log_path.read_text(), 30, "a relaunch")
        relaunched = await take(channel, names.queue, 2)
    finally:
        monitor.terminate()
        assert monitor.wait(30) == 0
    by_id = {m.message_id: m.headers for m in relaunched}
    assert set(by_id) == {"fresh", "twice"}
    assert (by_id["fresh"]["replay-count"], by_id["twice"]["replay-count"]) == (1, 3)
    assert not any(name.startswith("failed-") for h in by_id.values() for name in h)
    assert await depth(channel, names.queue) == 0
    left = {m.message_id for m in await take(channel, names.failed, 2)}
    assert left == {"thrice", "permanent"}
    assert await depth(channel, names.failed) == 0
    log = (tmp_path / "monitor.log").read_text()
    assert '"failed jobs relaunched"' in log
    assert log.count('"event":"replayed"') == 2
