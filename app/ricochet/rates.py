"""Rate limits per job type (SPEC 28), as settings and handlers give them (pure).

A limit is a token bucket: at most `burst` tokens, refilled at `count` per `period` seconds. The
tokens are kept in the broker, one queue per limited type of a queue (broker/plan.py's
rate_plan), refilled by the one process that leads the queue's limits (worker/rate_limits.py),
so that every worker and process of the vhost shares them.
"""

import re
from dataclasses import dataclass

PERIODS = {"s": 1, "m": 60, "h": 3600}
# A limited type names queues of its own (Q.tokens.TYPE, Q.limited.TYPE): the characters a
# queue name may have.
TYPE_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,50}")
MAX_COUNT = 10_000
MAX_BURST = 10_000
_RATE = re.compile(r"(\d+)/([smh])")


@dataclass(frozen=True, order=True)
class Limit:
    """count tokens per period_s seconds, at most burst of them banked."""

    per_s: float
    burst: int
    count: int
    period_s: int

    @property
    def interval_s(self) -> float:
        """Seconds between two tokens."""
        return self.period_s / self.count

    def text(self) -> str:
        unit = next(u for u, s in PERIODS.items() if s == self.period_s)
        return f"{self.count}/{unit}" + (f":{self.burst}" if self.burst != 1 else "")


def limit(rate: object, burst: object = 1) -> Limit:
    """The limit of rate "N/s", "N/m" or "N/h" (N of 1-10,000) and burst (1-10,000 tokens);
    ValueError saying what is allowed."""
    match = _RATE.fullmatch(rate) if isinstance(rate, str) else None
    if match is None or not 1 <= int(match[1]) <= MAX_COUNT:
        raise ValueError(f"rate {rate!r:.60}: N/s, N/m or N/h with N of 1-{MAX_COUNT} is allowed")
    if isinstance(burst, bool) or not isinstance(burst, int) or not 1 <= burst <= MAX_BURST:
        raise ValueError(f"burst {burst!r:.60}: an int of 1-{MAX_BURST} is allowed")
    count, period_s = int(match[1]), PERIODS[match[2]]
    return Limit(count / period_s, burst, count, period_s)


def checked_type(job_type: object) -> str:
    """A limited type's name, or ValueError: its tokens and waiting jobs are queues named after
    it."""
    if not isinstance(job_type, str) or not TYPE_PATTERN.fullmatch(job_type):
        raise ValueError(
            f"job type {job_type!r:.60} cannot be limited: 1-50 characters of A-Za-z0-9._- are"
        )
    return job_type


def parse_limits(text: str) -> dict[str, Limit]:
    """RICOCHET_RATE_LIMITS ("mail=10/s,oauth=100/m:20") into a limit per type; ValueError
    naming the bad entry."""
    limits: dict[str, Limit] = {}
    for entry in (e.strip() for e in text.split(",")):
        job_type, equals, rest = (part.strip() for part in entry.partition("="))
        rate, colon, burst = rest.partition(":")
        try:
            if not equals:
                raise ValueError("TYPE=N/s[:BURST] is allowed")
            if job_type in limits:
                raise ValueError("the type is listed twice")
            checked_type(job_type)
            if colon and not burst.isdigit():
                raise ValueError(f"burst {burst!r}: an int of 1-{MAX_BURST} is allowed")
            limits[job_type] = limit(rate, int(burst) if colon else 1)
        except ValueError as error:
            raise ValueError(f"entry {entry!r}: {error}") from None
    return limits


def lowest(limits: list[Limit]) -> Limit:
    """What workers that disagree apply: the lowest rate, and the smallest burst."""
    slowest = min(limits)
    return Limit(slowest.per_s, min(x.burst for x in limits), slowest.count, slowest.period_s)
