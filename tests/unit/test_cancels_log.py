"""The cancel log: cancels keyed by queue, the covering rule decided by the store's order (not
two clocks), and the snapshot that lets a worker start without reading the whole store."""

import json
import tracemalloc
import zlib

import pytest
from ricochet.broker import cancel_log
from ricochet.broker.cancel_log import (
    CancelLog,
    Snapshot,
    decode_snapshot,
    encode_snapshot,
    snapshot_mismatch,
)
from ricochet.headers import FRESH_ID

KEPT_S = 31 * 86_400
NOW = 1_800_000_000.0


def published(at: float | None):  # type: ignore[no-untyped-def]
    return lambda: at


def test_a_cancel_never_covers_another_queues_job_of_the_same_id() -> None:
    """A cancel names its queue: queue b's job with the id that a's cancel names runs."""
    log = CancelLog(KEPT_S)
    log.add_cancel("a", "job", offset=5, at_s=NOW, now_s=NOW)
    assert log.covers("a", "job", FRESH_ID, published(None))
    assert not log.covers("b", "job", FRESH_ID, published(None))
    assert not log.covers("a.b", "job", FRESH_ID, published(None))


def test_queue_and_id_cannot_run_into_each_other() -> None:
    """('a', 'b.c') and ('a.b', 'c') are two keys, whatever characters the id holds."""
    log = CancelLog(KEPT_S)
    log.add_cancel("a", "b.c", offset=1, at_s=NOW, now_s=NOW)
    log.add_cancel("a", "b\x00c", offset=2, at_s=NOW, now_s=NOW)
    assert not log.covers("a.b", "c", FRESH_ID, published(None))
    assert log.covers("a", "b\x00c", FRESH_ID, published(None))


@pytest.mark.parametrize("skew_s", [-5.0, 0.0, 5.0, 3600.0])
def test_a_client_job_waiting_before_the_cancel_is_covered_whatever_its_clock(
    skew_s: float,
) -> None:
    """A job of the client whose wait was recorded before the cancel (or that never recorded
    one) is covered, whatever timestamp its producer's clock gave it."""
    log = CancelLog(KEPT_S)
    log.add_wait("q", "x", "t1", offset=3)
    log.add_cancel("q", "x", offset=7, at_s=NOW, now_s=NOW)
    assert log.covers("q", "x", "t1", published(NOW + skew_s))
    assert log.covers("q", "x", "t0", published(NOW + skew_s))  # no wait recorded: before it


@pytest.mark.parametrize("skew_s", [-5.0, 0.0, 5.0])
def test_a_client_job_enqueued_after_the_cancel_runs_whatever_its_clock(skew_s: float) -> None:
    """cancel(x), then enqueue(x) again: the new job's wait is recorded after the cancel in the
    store, so the cancel does not cover it, even with its timestamp in the same second or before."""
    log = CancelLog(KEPT_S)
    log.add_cancel("q", "x", offset=7, at_s=NOW, now_s=NOW)
    log.add_wait("q", "x", "t2", offset=8)
    assert not log.covers("q", "x", "t2", published(NOW + skew_s))
    # A second cancel, after that wait, covers it again.
    log.add_cancel("q", "x", offset=9, at_s=NOW + 1, now_s=NOW + 1)
    assert log.covers("q", "x", "t2", published(NOW + skew_s))


def test_waits_of_ids_never_cancelled_are_not_kept() -> None:
    """A wait recorded before any cancel of its id is as if there were none: memory stays with
    the cancels."""
    log = CancelLog(KEPT_S)
    for n in range(100):
        log.add_wait("q", f"id{n}", "t", offset=n)
    assert log.waits_kept() == 0


def test_a_fresh_id_is_covered_by_any_cancel() -> None:
    """An id the client made up cannot have been cancelled before its job: any cancel of it
    follows its enqueue."""
    log = CancelLog(KEPT_S)
    log.add_cancel("q", "x", offset=1, at_s=NOW - 10, now_s=NOW)
    assert log.covers("q", "x", FRESH_ID, published(NOW + 60))


@pytest.mark.parametrize(
    ("published_at", "covered"),
    [(NOW - 1, True), (NOW, True), (NOW + 1, False), (None, True)],
)
def test_a_job_of_another_producer_keeps_the_timestamp_rule(
    published_at: float | None, covered: bool
) -> None:
    """A job without the client's header (another producer) is covered when it was published
    before the cancel or in its second, or carries no timestamp."""
    log = CancelLog(KEPT_S)
    log.add_cancel("q", "x", offset=1, at_s=NOW, now_s=NOW)
    assert log.covers("q", "x", None, published(published_at)) is covered


def test_cancels_past_the_kept_time_are_forgotten() -> None:
    log = CancelLog(KEPT_S)
    log.add_cancel("q", "old", offset=1, at_s=NOW - KEPT_S - 1, now_s=NOW)
    log.add_cancel("q", "aging", offset=2, at_s=NOW - KEPT_S + 10, now_s=NOW)
    log.add_cancel("q", "new", offset=3, at_s=NOW - 5, now_s=NOW)
    assert len(log) == 2
    log.prune(NOW + 20)
    assert len(log) == 1
    assert log.covers("q", "new", FRESH_ID, published(None))


def test_a_cancel_stamped_ahead_holds_no_pruning() -> None:
    """One cancel stamped a year ahead by its producer's clock, then 100,000 on time: the one
    ahead counts from when it was read, and 40 days on none is kept."""
    log = CancelLog(KEPT_S)
    log.add_cancel("q", "ahead", offset=0, at_s=NOW + 365 * 86_400, now_s=NOW)
    for i in range(1, 100_001):
        log.add_cancel("q", f"id-{i}", offset=i, at_s=NOW, now_s=NOW)
    log.prune(NOW + 40 * 86_400)
    assert len(log) == 0


def test_a_cancel_stamped_ahead_covers_no_job_published_after_it_was_read() -> None:
    """Another producer's job is covered when published by the cancel's time: a cancel stamped
    ahead reaches as far as the moment it was read, not its producer's clock."""
    log = CancelLog(KEPT_S)
    log.add_cancel("q", "m", offset=0, at_s=NOW + 86_400, now_s=NOW)
    assert log.covers("q", "m", None, published(NOW))
    assert not log.covers("q", "m", None, published(NOW + 60))


def test_a_snapshot_gives_back_the_log_and_the_offsets_it_covers() -> None:
    """encode then decode: every cancel, every kept wait, the next offset of the store and of
    each old per-queue store read."""
    log = CancelLog(KEPT_S)
    for n in range(1000):
        log.add_cancel(f"q{n % 3}", f"id-{n}", offset=n, at_s=NOW - n, now_s=NOW)
    log.add_cancel("q0", "legacy", offset=-1, at_s=NOW - 50, now_s=NOW)
    log.add_wait("q0", "id-0", "t", offset=2000)
    anchor = (1999, "f" * 32)
    data = encode_snapshot(Snapshot(log.entries(), log.wait_entries(), 2001, {"q1": 17}, anchor))
    snapshot = decode_snapshot(data)
    assert snapshot is not None
    assert (snapshot.next_offset, snapshot.legacy, snapshot.anchor) == (2001, {"q1": 17}, anchor)
    copy = CancelLog(KEPT_S)
    copy.load(snapshot, now_s=NOW)
    assert len(copy) == len(log)
    assert not copy.covers("q0", "id-0", "t", published(None))
    assert copy.covers("q0", "id-0", "u", published(None))
    assert copy.covers("q0", "legacy", None, published(NOW - 60))
    assert not copy.covers("q1", "id-0", FRESH_ID, published(None))
    assert copy.covers("q1", "id-1", FRESH_ID, published(None))


def test_a_snapshot_is_compact() -> None:
    """100,000 cancels of uuid-like ids fit in a few megabytes."""
    log = CancelLog(KEPT_S)
    for n in range(100_000):
        log.add_cancel("jobs", f"{n:032x}", offset=n, at_s=NOW - n, now_s=NOW)
    data = encode_snapshot(Snapshot(log.entries(), log.wait_entries(), 100_000, {}))
    assert len(data) < 3_500_000


@pytest.mark.parametrize("data", [b"", b"junk", b"\x78\x9c" + b"\x00" * 8])
def test_an_unreadable_snapshot_is_none(data: bytes) -> None:
    """A snapshot that cannot be read is passed over (the store is then read from its start)."""
    assert decode_snapshot(data) is None


def test_a_snapshot_that_would_inflate_past_its_bound_is_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A small message that decompresses to far more than SNAPSHOT_MAX_BYTES (64 MiB of spaces
    in 64 KB, against a bound of 1 MiB here) is passed over without being inflated whole."""
    bomb = zlib.compress(b" " * (64 << 20), 9)
    assert len(bomb) < 100_000
    monkeypatch.setattr(cancel_log, "SNAPSHOT_MAX_BYTES", 1 << 20)
    tracemalloc.start()
    try:
        assert decode_snapshot(bomb) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


def test_a_snapshot_up_to_its_bound_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound is on what the snapshot decompresses to: one of exactly that size is read, one
    a byte longer is not."""
    log = CancelLog(KEPT_S)
    log.add_cancel("q", "id", offset=0, at_s=NOW, now_s=NOW)
    data = encode_snapshot(Snapshot(log.entries(), log.wait_entries(), 1, {}))
    size = len(zlib.decompress(data))
    monkeypatch.setattr(cancel_log, "SNAPSHOT_MAX_BYTES", size)
    assert decode_snapshot(data) is not None
    monkeypatch.setattr(cancel_log, "SNAPSHOT_MAX_BYTES", size - 1)
    assert decode_snapshot(data) is None


@pytest.mark.parametrize(
    ("snapshot", "reason"),
    [
        (Snapshot([("q", "m", 5, 0)], [], 10, {}, (9, "a")), None),
        (Snapshot([], [], 10**9, {}, (9, "a")), "ahead of the store"),
        (Snapshot([("q", "m", 10, 0)], [], 10, {}, (9, "a")), "a cancel at or past its offset"),
        (Snapshot([], [], 10, {}), "no anchor before its offset"),
        (Snapshot([], [], 10, {}, (10, "a")), "no anchor before its offset"),
        (Snapshot([], [], 10, {}, (-1, "a")), "no anchor before its offset"),
    ],
)
def test_a_snapshot_is_checked_against_the_stores_end(
    snapshot: Snapshot, reason: str | None
) -> None:
    """Against a store whose next record gets offset 100: what a snapshot claims must be of it."""
    assert snapshot_mismatch(snapshot, 100) == reason


@pytest.mark.parametrize("anchor", [[1], ["x", "y"], 5, [1, 2, 3]])
def test_a_snapshot_with_an_unreadable_anchor_is_none(anchor: object) -> None:
    document = {"v": 1, "next": 1, "legacy": {}, "cancels": {}, "waits": [], "anchor": anchor}
    data = zlib.compress(json.dumps(document).encode())
    assert decode_snapshot(data) is None
