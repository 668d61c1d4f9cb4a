"""When a worker process that died starts again: at once after a death that ends a life of
STABLE_S or more, with a wait that doubles for each quick death in a row (a crash loop: a handler
that cannot be imported, or that kills its process at every job)."""

from dataclasses import dataclass

# A process that lived this long was working: its death starts no crash loop.
STABLE_S = 10.0
FIRST_WAIT_S = 0.5
MAX_WAIT_S = 30.0
# Quick deaths in a row that make a crash loop, which /healthz reports.
CRASH_LOOP = 3


@dataclass(frozen=True)
class Restarts:
    """The deaths in a row of one place's processes, each within STABLE_S of its start."""

    quick_deaths: int = 0

    def died(self, lived_s: float) -> "Restarts":
        """After a process of this place died, having lived lived_s."""
        return Restarts(self.quick_deaths + 1 if lived_s < STABLE_S else 0)

    @property
    def wait_s(self) -> float:
        """How long to wait before starting the next process: none after one quick death, then
        FIRST_WAIT_S, doubling, up to MAX_WAIT_S."""
        if self.quick_deaths <= 1:
            return 0.0
        return min(FIRST_WAIT_S * 2.0 ** (self.quick_deaths - 2), MAX_WAIT_S)

    def crash_loop(self, alive_for_s: float | None) -> bool:
        """Whether this place is in a crash loop: CRASH_LOOP quick deaths in a row, and no
        process since that has lived STABLE_S (alive_for_s: None while none runs)."""
        recovered = alive_for_s is not None and alive_for_s >= STABLE_S
        return self.quick_deaths >= CRASH_LOOP and not recovered
