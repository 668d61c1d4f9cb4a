"""The monitor's index of the journal (SPEC 26): every job changed in the last MOST_ENTRIES
entries, kept up to date from the stream, for the job API and pages (monitor/job_views.py).

At start the index looks for where the last MOST_ENTRIES entries begin: it reads the stream
backwards, a chunk of records at a time (each chunk twice the one before), only counting each
record's entries; then it reads forward from there and goes on reading as entries are written.
A long journal (7 days, 1 GB) so costs a start its last million entries, not all of it. Until
the index has read up to where the stream ended at its start it answers from what it has, and
says it is incomplete. On a new connection it reads on from the record after the last it read,
or from the first record of a stream that ends before it (one deleted and declared again,
whose offsets start at 0 again), keeping what it holds.

Past MOST_ENTRIES entries, the jobs changed longest ago are forgotten, with their entries.
"""

import asyncio
import time
from collections import OrderedDict
from collections.abc import Iterator

from aio_pika.abc import AbstractConnection

from ricochet.broker.amqp import Delivery
from ricochet.broker.connection import connection_name, is_lost
from ricochet.broker.journal import RECORD, Entry, read_entries
from ricochet.broker.stream_log import LogReader, Read, read_between, tail
from ricochet.log import get_logger
from ricochet.names import SHARED
from ricochet.ops.jobs import JobHistory, fold
from ricochet.service.process import Lifecycle, keep_connected
from ricochet.settings import Settings

log = get_logger("ricochet.monitor")

MOST_ENTRIES = 1_000_000
# Records of the first chunk read backwards; each next chunk is twice as long.
FIRST_CHUNK = 1024
# A read of a chunk, or up to the end, that takes longer is given up (what was read stands).
READ_TIMEOUT_S = 120.0
# After a failure of its own (the stream missing, say), the index starts over this much later.
RETRY_S = 5.0

Key = tuple[str, str]  # (queue, message_id)


def counted_entries(record: Delivery) -> int:
    """About how many entries a record of the journal holds, without reading them: a count of
    the separators between entries (one inside an entry's text counts one more)."""
    if record.type != RECORD or not record.body.startswith(b"[["):
        return 0
    return record.body.count(b"],[") + 1


def _counting(sizes: list[tuple[int, int]]) -> Read:
    """A reader that notes each record's offset and counted entries in sizes."""
    return lambda record, offset: sizes.append((offset, counted_entries(record)))


class JobIndex:
    """The jobs of the last `most` entries, by (queue, message_id), in the order they changed."""

    def __init__(self, most: int = MOST_ENTRIES) -> None:
        self._most = most
        self._jobs: OrderedDict[Key, JobHistory] = OrderedDict()  # changed longest ago first
        # The queues of the jobs held (few: a job is found by id in each of them).
        self._queues: dict[str, int] = {}
        self.entries = 0
        # Whether everything written before the index started has been read.
        self.complete = False
        self._next_offset: int | None = None  # where a reader goes on from (None: not begun)

    def add(self, entry: Entry) -> None:
        """Fold one entry into its job; past `most` entries, forget the jobs changed longest ago.
        A job's entries are its events, one each (two items of its list)."""
        key = (entry.queue, entry.message_id)
        job = self._jobs.get(key)
        if job is None:
            job = self._jobs[key] = JobHistory(entry.message_id, entry.queue)
            self._queues[entry.queue] = self._queues.get(entry.queue, 0) + 1
        else:
            self._jobs.move_to_end(key)
        fold(job, entry)
        self.entries += 1
        while self.entries > self._most:
            self._forget_oldest()

    def _forget_oldest(self) -> None:
        (queue, _), job = self._jobs.popitem(last=False)
        self.entries -= len(job.events) // 2
        self._queues[queue] -= 1
        if not self._queues[queue]:
            del self._queues[queue]

    def __len__(self) -> int:
        return len(self._jobs)

    def job(self, message_id: str, queue: str | None = None) -> list[JobHistory]:
        """The jobs of that id (of that queue, when given), the one changed last, last."""
        queues = self._queues if queue is None else (queue,)
        found = [job for q in queues if (job := self._jobs.get((q, message_id))) is not None]
        return sorted(found, key=lambda j: j.last_at_ms)

    def jobs(self) -> Iterator[JobHistory]:
        return iter(self._jobs.values())

    def read_record(self, record: Delivery, _: int) -> None:
        if record.type == RECORD:
            for entry in read_entries(record.body, record.app_id()):
                self.add(entry)

    async def serve(self, settings: Settings, lifecycle: Lifecycle) -> None:
        """Keep the index up to date until a stop is requested, on a connection of its own."""
        name = connection_name("monitor journal", settings.queue)
        await keep_connected(lifecycle, settings, name, lambda c: self._follow(c, lifecycle))

    async def _follow(self, connection: AbstractConnection, lifecycle: Lifecycle) -> None:
        while not (is_lost(connection) or lifecycle.stopping.is_set()):
            try:
                await self._read(connection, lifecycle.stopping)
            except Exception as error:  # the stream missing, or refused: the monitor goes on
                if is_lost(connection):
                    return
                log.warning("journal index: reading failed, trying again", error=str(error))
                await lifecycle.unless_stopped(asyncio.sleep(RETRY_S))

    async def _read(self, connection: AbstractConnection, stopping: asyncio.Event) -> None:
        """Read from where the last entries begin (or where the last read stopped) until stopping
        is set or the reader is lost. A stream that ends before where the last read stopped is a
        new one (deleted and declared again, its offsets from 0): a reader from there would wait
        until it grew that far, so it is read from its first record, on top of what is held."""
        started = time.monotonic()
        start: int | str
        end = await tail(connection, SHARED.journal, READ_TIMEOUT_S)
        if self._next_offset is None:
            start = "first" if end is None else await self._start_of_last(connection, end)
        elif end is not None and end < self._next_offset:
            log.warning(
                "journal stream is new: read from its first record",
                end=end,
                next_offset=self._next_offset,
            )
            start = "first"
        else:
            start = self._next_offset
        reader = await LogReader.open(connection, SHARED.journal, self.read_record, start)
        try:
            # Until its marker comes back within READ_TIMEOUT_S: a slow first read asks again.
            while not (self.complete or reader.lost.is_set() or stopping.is_set()):
                self.complete = await reader.up_to_now(READ_TIMEOUT_S) is not None
                log.info(
                    "journal index built" if self.complete else "journal index still reading",
                    jobs=len(self),
                    entries=self.entries,
                    took_s=round(time.monotonic() - started, 2),
                )
            lost = asyncio.ensure_future(reader.lost.wait())
            stop = asyncio.ensure_future(stopping.wait())
            try:
                await asyncio.wait({lost, stop}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                lost.cancel()
                stop.cancel()
        finally:
            self._next_offset = reader.next_offset
            await reader.close()

    async def _start_of_last(self, connection: AbstractConnection, end: int) -> int:
        """The offset from which the stream holds its last `most` entries (about: they are
        counted, not read), or its first record's."""
        counted, chunk, upper = 0, FIRST_CHUNK, end
        while upper > 0:
            lower = max(0, upper - chunk)
            sizes: list[tuple[int, int]] = []
            first = await read_between(
                connection, SHARED.journal, lower, upper, _counting(sizes), READ_TIMEOUT_S
            )
            if first is None:
                return lower  # the chunk was not read in time: start there
            for offset, entries in reversed(sizes):
                counted += entries
                if counted >= self._most:
                    return offset
            if first > lower:
                return first  # the stream's first record
            upper, chunk = lower, chunk * 2
        return 0
