"""A test handler that records every attempt and behaves as each job's payload asks."""

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ricochet import Job, PermanentError


@dataclass
class Attempt:
    """What the handler saw of one delivery."""

    attempt: int
    max_attempts: int
    at: float
    headers: dict[str, Any]
    routing_key: str


@dataclass
class Recorder:
    """Async handler: payload {"fail": N} fails the first N attempts, {"fail": "always"} always,
    {"fail": "permanent"} raises PermanentError, {"sleep_s": x} works for x seconds."""

    seen: dict[str | None, list[Attempt]] = field(default_factory=lambda: defaultdict(list))
    succeeded: list[str | None] = field(default_factory=list)

    async def __call__(self, job: Job) -> None:
        self.seen[job.message_id].append(
            Attempt(
                job.attempt, job.max_attempts, time.monotonic(), dict(job.headers), job.routing_key
            )
        )
        payload = job.payload
        await asyncio.sleep(payload.get("sleep_s", 0))
        fail = payload.get("fail", 0)
        if fail == "permanent":
            raise PermanentError("cannot ever work")
        if fail == "always" or (isinstance(fail, int) and job.attempt <= fail):
            raise ConnectionError(f"transient trouble on attempt {job.attempt}")
        self.succeeded.append(job.message_id)

    def attempts(self, message_id: str) -> list[int]:
        return [a.attempt for a in self.seen[message_id]]
