"""The threads sync handlers run in: daemon threads, each kept for the next call once its call
returns, and a new one started only when none is free.

A thread cannot be stopped, so a handler past its timeout keeps its thread: in a fixed pool,
once all were taken the next sync jobs would time out without having run. Here a call never
waits for a thread. Keeping the free ones spares the event loop a thread start per job, which
waits for the new thread to take the GIL: behind CPU-bound handlers, many switch intervals.
Being daemons, hung ones do not hold the process at exit either. The threads number at most as
many as ever ran at once (the prefetch, and the hung ones).
"""

import os
import queue
import threading
from collections.abc import Callable

THREAD_NAME = "ricochet-job"


class HandlerThreads:
    """Runs calls on daemon threads, reusing the free ones."""

    def __init__(self) -> None:
        self._reset()
        # A forked child has none of the parent's threads: it starts without any.
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._free = 0
        self._threads = 0

    @property
    def busy(self) -> int:
        """The threads running a call (a hung handler's among them)."""
        with self._lock:
            return self._threads - self._free

    def run(self, call: Callable[[], None]) -> None:
        """Run call() on a free thread, or on a new one when none is free. call must not raise."""
        with self._lock:
            start = self._free == 0
            if start:
                self._threads += 1
                name = f"{THREAD_NAME}-{self._threads}"
            else:
                self._free -= 1  # this call is that thread's: a later one finds none free
        self._calls.put(call)
        if start:
            threading.Thread(target=self._serve, name=name, daemon=True).start()

    def _serve(self) -> None:
        while True:
            self._calls.get()()
            with self._lock:
                self._free += 1
