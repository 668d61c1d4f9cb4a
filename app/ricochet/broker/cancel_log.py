"""The cancels a worker honours, kept compactly, and the snapshot of them kept in the broker (pure).

A cancel names its queue and its message_id. Which jobs of that id it covers is decided by the
cancel store's own order (its stream offsets), not by comparing two clocks:

- A job the client enqueued carries an incarnation token (headers.INCARNATION), and a wait
  record naming that token is written to the store as it is enqueued, before the job. A cancel
  covers the job unless its wait record comes after the cancel in the store: a job enqueued
  before the cancel is covered, whether it waits, runs or retries then (a retry records
  nothing: a cancel made while its job ran covers the retry), and a job enqueued again after
  the cancel returned (whose wait is recorded after it) runs.
- A job whose id the client made up (FRESH_ID) is covered by any cancel of that id: no cancel
  can have come before it.
- A job of another producer (no token) keeps the timestamp rule: covered when its AMQP
  timestamp is not after the cancel's second, or when it has none.
"""

import json
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ricochet.headers import FRESH_ID

# A cancel read from an old per-queue store has no offset in the shared one: it comes before all.
BEFORE_ALL = -1
# Seconds since the epoch fit 33 bits until the year 2242: (offset, time) go in one int.
_TIME_BITS = 33
_TIME_MASK = (1 << _TIME_BITS) - 1
SNAPSHOT_VERSION = 1
# The most a snapshot may decompress to: about 2.5 million cancels of uuid-like ids, five times
# the most a start is sized for. Anyone who may publish in the vhost can write a snapshot; one
# that would grow past this (a small message that inflates to gigabytes) is passed over, and the
# store is read from its start.
SNAPSHOT_MAX_BYTES = 128 * 1024 * 1024


def _key(queue: str, message_id: str) -> str:
    # A NUL cannot be in a queue name (the broker refuses it), so no two pairs share a key.
    return f"{queue}\x00{message_id}"


def _pack(offset: int, at_s: float) -> int:
    return ((offset - BEFORE_ALL) << _TIME_BITS) | (int(at_s) & _TIME_MASK)


def _offset(packed: int) -> int:
    return (packed >> _TIME_BITS) + BEFORE_ALL


def _at_s(packed: int) -> int:
    return packed & _TIME_MASK


# A cancel as the snapshot keeps it: queue, message_id, offset in the store, time (epoch s).
Entry = tuple[str, str, int, int]
# A wait recorded after a cancel of its id: queue, message_id, token, offset in the store.
Wait = tuple[str, str, str, int]


@dataclass(frozen=True)
class Snapshot:
    """The live cancels once the store was read up to next_offset (exclusive), and the next
    offset of each old per-queue store read into them. anchor: a record read before next_offset,
    (its offset, its id), that ties the snapshot to the stream it was read from (one deleted and
    declared again numbers its records from 0 anew)."""

    entries: list[Entry]
    waits: list[Wait]
    next_offset: int
    legacy: dict[str, int]
    anchor: tuple[int, str] | None = None


class CancelLog:
    """The cancels made within the kept time, oldest first, and the waits recorded after a
    cancel of their id. A cancel older than the kept time cannot concern a job still waiting,
    so it is forgotten: memory follows the live cancels, one int per (queue, message_id)."""

    def __init__(self, kept_s: float) -> None:
        self._kept_s = kept_s
        # key -> packed (offset, time); insertion order is the order of time, for pruning.
        self._cancels: dict[str, int] = {}
        # key -> {token: offset of its newest wait}, only for keys with a cancel.
        self._waits: dict[str, dict[str, int]] = {}

    def add_cancel(
        self, queue: str, message_id: str, *, offset: int, at_s: float, now_s: float
    ) -> None:
        """Record a cancel read at offset of the store (BEFORE_ALL from an old store). Its time
        is its producer's, but never later than now: one stamped ahead counts from when it was
        read, so that it is forgotten in time and does not hold the pruning of those after it."""
        at_s = min(at_s, now_s)
        if now_s - at_s >= self._kept_s:
            return
        key = _key(queue, message_id)
        before = self._cancels.pop(key, None)  # made again: it moves to the end, as its time
        if before is not None and _offset(before) > offset:
            offset = _offset(before)
        self._cancels[key] = _pack(offset, at_s)

    def add_wait(self, queue: str, message_id: str, token: str, *, offset: int) -> None:
        """Record that the job with this token was enqueued at offset of the store. Kept
        only when a cancel of its id is known: before any cancel, it changes nothing."""
        key = _key(queue, message_id)
        if key in self._cancels:
            self._waits.setdefault(key, {})[token] = offset

    def prune(self, now_s: float) -> None:
        """Forget the cancels past the kept time (and their waits)."""
        stale = []
        for key, packed in self._cancels.items():
            if now_s - _at_s(packed) < self._kept_s:
                break
            stale.append(key)
        for key in stale:
            del self._cancels[key]
            self._waits.pop(key, None)

    def covers(
        self,
        queue: str,
        message_id: str | None,
        token: str | None,
        published_s: Callable[[], float | None],
    ) -> bool:
        """Whether a recorded cancel covers this job of queue (see the module's docstring);
        published_s is read only for a job of another producer whose id has a cancel."""
        if message_id is None:
            return False
        key = _key(queue, message_id)
        packed = self._cancels.get(key)
        if packed is None:
            return False
        if token is None:
            published = published_s()
            return published is None or int(published) <= _at_s(packed)
        if token == FRESH_ID:
            return True
        waited = self._waits.get(key, {}).get(token)
        return waited is None or waited < _offset(packed)

    def entries(self) -> list[Entry]:
        """The cancels, oldest first, for a snapshot."""
        return [
            (*key.split("\x00", 1), _offset(packed), _at_s(packed))  # type: ignore[misc]
            for key, packed in self._cancels.items()
        ]

    def wait_entries(self) -> list[Wait]:
        """The waits kept, for a snapshot."""
        return [
            (*key.split("\x00", 1), token, offset)  # type: ignore[misc]
            for key, tokens in self._waits.items()
            for token, offset in tokens.items()
        ]

    def load(self, snapshot: Snapshot, now_s: float) -> None:
        """Add a snapshot's cancels and waits."""
        for queue, message_id, offset, at_s in snapshot.entries:
            self.add_cancel(queue, message_id, offset=offset, at_s=at_s, now_s=now_s)
        for queue, message_id, token, offset in snapshot.waits:
            self.add_wait(queue, message_id, token, offset=offset)

    def copy(self) -> "CancelLog":
        """A copy to read apart from this one (a snapshot is encoded from it in a thread while
        the reader goes on adding to this one); two dict copies, done in C."""
        copied = CancelLog(self._kept_s)
        copied._cancels = dict(self._cancels)
        copied._waits = {key: dict(tokens) for key, tokens in self._waits.items()}
        return copied

    def clear(self) -> None:
        self._cancels.clear()
        self._waits.clear()

    def waits_kept(self) -> int:
        return sum(len(tokens) for tokens in self._waits.values())

    def __len__(self) -> int:
        return len(self._cancels)


def snapshot_mismatch(snapshot: Snapshot, end: int) -> str | None:
    """Why a snapshot cannot be of a store whose next record gets offset end, else None (pure)."""
    if snapshot.next_offset > end:
        return "ahead of the store"
    if any(offset >= snapshot.next_offset for *_, offset, _ in snapshot.entries):
        return "a cancel at or past its offset"
    if snapshot.anchor is None or not 0 <= snapshot.anchor[0] < snapshot.next_offset:
        return "no anchor before its offset"
    return None


def _deltas(values: Iterable[int]) -> list[int]:
    """Each value less the one before: offsets and times in store order are small steps."""
    out, before = [], 0
    for value in values:
        out.append(value - before)
        before = value
    return out


def _sums(deltas: Iterable[int]) -> list[int]:
    out, total = [], 0
    for delta in deltas:
        total += int(delta)
        out.append(total)
    return out


def _columns(rows: list[Entry]) -> dict[str, dict[str, list[int] | list[str]]]:
    by_queue: dict[str, list[Entry]] = {}
    for row in rows:
        by_queue.setdefault(row[0], []).append(row)
    return {
        queue: {
            "ids": [row[1] for row in queued],
            "offsets": _deltas(row[2] for row in queued),
            "times": _deltas(row[3] for row in queued),
        }
        for queue, queued in by_queue.items()
    }


def encode_snapshot(snapshot: Snapshot) -> bytes:
    """The snapshot as compressed JSON: per queue, its ids, then its offsets and times as steps
    from the one before (a queue's name once, and numbers of a few digits)."""
    document = {
        "v": SNAPSHOT_VERSION,
        "next": snapshot.next_offset,
        "legacy": snapshot.legacy,
        "cancels": _columns(snapshot.entries),
        "waits": [list(wait) for wait in snapshot.waits],
        "anchor": None if snapshot.anchor is None else list(snapshot.anchor),
    }
    return zlib.compress(json.dumps(document, separators=(",", ":")).encode(), 6)


def decode_snapshot(data: bytes) -> Snapshot | None:
    """The snapshot in data, or None when it cannot be read or would decompress to more than
    SNAPSHOT_MAX_BYTES (then the store is read whole)."""
    try:
        inflating = zlib.decompressobj()
        text = inflating.decompress(data, SNAPSHOT_MAX_BYTES)
        if inflating.unconsumed_tail or not inflating.eof:
            return None
        document = json.loads(text)
        if document["v"] != SNAPSHOT_VERSION:
            return None
        entries: list[Entry] = []
        for queue, columns in document["cancels"].items():
            ids, offsets, times = columns["ids"], columns["offsets"], columns["times"]
            if not len(ids) == len(offsets) == len(times):
                return None
            entries.extend(
                zip([queue] * len(ids), map(str, ids), _sums(offsets), _sums(times), strict=True)
            )
        waits: list[Wait] = [
            (str(queue), str(m), str(token), int(o)) for queue, m, token, o in document["waits"]
        ]
        legacy = {str(q): int(o) for q, o in document["legacy"].items()}
        anchor = document.get("anchor")
        if anchor is not None:
            at, marker = anchor  # two values, else ValueError
            if type(at) is not int or not isinstance(marker, str):
                return None
            anchor = (at, marker)
        return Snapshot(entries, waits, int(document["next"]), legacy, anchor)
    except (ValueError, TypeError, KeyError, AttributeError, zlib.error):
        return None
