"""Every name ricochet gives an object in the broker, and the routing keys it spells.

A queue's own objects derive from its name (Names); those every ricochet queue of a virtual host
shares begin with `ricochet.` (SHARED). A queue name that would collide with either, or with the
broker's own `amq.`, is refused (refusal). Pure: the settings check a queue name here, the plan
(broker/plan.py) and everything that publishes, reads or settles a job take names from here.
"""

import math
import re
from dataclasses import dataclass

# What a vhost's ricochet queues share begins with this; no job queue may (SPEC 18).
SHARED_PREFIX = "ricochet."
BROKER_PREFIX = "amq."
# The delays (schedules, RetryLater): level k waits 2^k units; a job's routing key spells its delay
# in binary, one level per digit, so any delay takes at most one queue per level.
DELAY_UNIT_MS = 100
DELAY_LEVELS = 25  # (2^25 - 1) x 100 ms: 38.8 days, beyond the longest schedule of 30 days


def delay_key(delay_ms: int, queue: str) -> str:
    """The routing key that holds a job for delay_ms (rounded up to a whole unit, never less)
    in the shared levels, then hands it to its queue: the units in binary, most significant
    level first, one word per level, then the queue's name (at most 50 + 200 bytes of 255)."""
    units = min(math.ceil(max(delay_ms, 0) / DELAY_UNIT_MS), 2**DELAY_LEVELS - 1)
    return ".".join(format(units, f"0{DELAY_LEVELS}b")) + "." + queue


def return_key(queue: str) -> str:
    """The shared return exchange's binding to a queue: a delay key of any units that ends in
    exactly the queue's name, word for word, so that `x` never takes `a.x`'s jobs."""
    return "*." * DELAY_LEVELS + queue


# A delay key: the levels' digits, then the queue's name (the per-queue levels of earlier
# versions spelled the digits alone).
_DELAY_KEY = re.compile(rf"[01](\.[01]){{{DELAY_LEVELS - 1}}}(\..+)?")


def is_delay_key(routing_key: str) -> bool:
    """Whether a delivery's routing key is one that spelled a wait in the delays."""
    return _DELAY_KEY.fullmatch(routing_key) is not None


@dataclass(frozen=True)
class SharedNames:
    """The objects declared once per virtual host and shared by every ricochet queue in it:
    the delays' levels, where a job whose queue is gone ends, and the cancel store."""

    def delay(self, k: int) -> str:
        """Level k of the delays: a topic exchange, and the queue of that name that waits 2^k
        units."""
        return f"{SHARED_PREFIX}delay.{k}"

    @property
    def delay_entry(self) -> str:
        """Where a job to delay is published, with delay_key as its routing key."""
        return self.delay(DELAY_LEVELS - 1)

    @property
    def return_exchange(self) -> str:
        """Where the lowest level passes a due job on, to its queue by the end of its key."""
        return f"{SHARED_PREFIX}return"

    @property
    def orphans(self) -> str:
        """The exchange (the return exchange's alternate) and queue of jobs whose queue is gone."""
        return f"{SHARED_PREFIX}orphans"

    @property
    def cancels(self) -> str:
        """The cancel store: a stream whose records name their queue."""
        return f"{SHARED_PREFIX}cancels"

    @property
    def cancels_snapshot(self) -> str:
        """The newest snapshot of the cancel store, where a starting worker begins to read it."""
        return f"{SHARED_PREFIX}cancels.snapshot"

    @property
    def schedules(self) -> str:
        """The schedules' store: a stream of the state of each queue's schedules."""
        return f"{SHARED_PREFIX}schedules"

    def schedules_lead(self, queue: str) -> str:
        """The exclusive queue whose connection leads queue's schedules (never durable: the
        broker drops it with that connection)."""
        return f"{SHARED_PREFIX}schedules.lead.{queue}"

    def rates_lead(self, queue: str) -> str:
        """The exclusive queue whose connection refills queue's rate limits (never durable: the
        broker drops it with that connection)."""
        return f"{SHARED_PREFIX}rates.lead.{queue}"

    @property
    def retries(self) -> str:
        """The stream where earlier versions recorded each retry into a tier with its reason
        (the journal holds them now): `ricochet migrate` deletes it."""
        return f"{SHARED_PREFIX}retries"

    @property
    def journal(self) -> str:
        """The journal: a stream of every change of a job's state (ricochet.broker.journal)."""
        return f"{SHARED_PREFIX}journal"

    @property
    def migrated(self) -> str:
        """The register that says `ricochet migrate` has moved what earlier versions left in the
        vhost: a worker's start then reads none of it."""
        return f"{SHARED_PREFIX}migrated"

    @property
    def waiting_scan(self) -> str:
        """The exclusive queue that a scan of the waiting jobs holds as its lock while it reads
        (the levels are the vhost's, so one scan at a time in the vhost)."""
        return f"{SHARED_PREFIX}waiting.scan"


SHARED = SharedNames()


def delay_route(delay_ms: int, queue: str) -> tuple[str, str]:
    """(exchange, routing key) of a job to hold for delay_ms in the shared levels, then hand to
    its queue (or, the queue gone, to the orphans): how a worker sends a job to wait, and how
    the client sends one due later."""
    return SHARED.delay_entry, delay_key(delay_ms, queue)


@dataclass(frozen=True)
class Names:
    """Every name derives from the main queue's."""

    queue: str

    @property
    def dlx(self) -> str:
        return f"{self.queue}.dlx"

    @property
    def first_tier_exchange(self) -> str:
        return f"{self.queue}.dlx.first"

    @property
    def return_exchange(self) -> str:
        return f"{self.queue}.return"

    @property
    def return_to_queue(self) -> str:
        """The exchange between the return exchange and Q, whose alternate is ricochet.orphans:
        a job back from a tier of a queue that was deleted goes there, not nowhere."""
        return f"{self.queue}.return.queue"

    @property
    def failed(self) -> str:
        """The failed exchange, and the durable failed queue bound to it."""
        return f"{self.queue}.failed"

    @property
    def failed_scan(self) -> str:
        """The exclusive queue that a scan of the failed queue holds as its lock while it reads."""
        return f"{self.queue}.failed.scan"

    @property
    def events(self) -> str:
        return f"{self.queue}.failed.events"

    @property
    def record(self) -> str:
        """The queue holding the settings the topology was declared with (broker/record.py)."""
        return f"{self.queue}.topology"

    def tier(self, k: int) -> str:
        return f"{self.queue}.retry.{k}"

    @property
    def redeclaring(self) -> str:
        """The exclusive queue a declarer holds as its lock while it deletes and declares again
        a tier whose delay changed (broker/redeclaring.py)."""
        return f"{self.queue}.retry.redeclaring"

    def lanes(self, k: int) -> str:
        """The random exchange that spreads tier k's jobs over its lanes (with jitter)."""
        return f"{self.queue}.retry.{k}.lanes"

    def lane(self, k: int, i: int) -> str:
        """Lane i = 1.. of tier k; lane 0 is the tier's own queue."""
        return f"{self.queue}.retry.{k}.lane.{i}"

    @property
    def keys(self) -> str:
        """The consistent-hash exchange that spreads the queue's jobs with a key over its key
        lanes, by the key header (ricochet.keys)."""
        return f"{self.queue}.keys"

    def key_lane(self, i: int) -> str:
        """Key lane i = 0..: a queue with one active consumer in the vhost, which takes one job
        at a time."""
        return f"{self.queue}.key.{i}"

    def tokens(self, job_type: str) -> str:
        """The queue of a limited type's tokens: a job of the type runs once it takes one."""
        return f"{self.queue}.tokens.{job_type}"

    def limited(self, job_type: str) -> str:
        """The exchange and queue where a limited type's jobs wait for a token, in order."""
        return f"{self.queue}.limited.{job_type}"

    @property
    def rates(self) -> str:
        """Where each worker announces its rate limits, and their leader reads them."""
        return f"{self.queue}.rates"

    @property
    def rates_applied(self) -> str:
        """The register of the rate limits the leader applies (what `ricochet status` shows)."""
        return f"{self.queue}.rates.applied"

    def key_lane_index(self, name: str) -> int | None:
        """The i of a key lane's name Q.key.i, else None."""
        return _number_after(f"{self.queue}.key.", name)

    def delay(self, k: int) -> str:
        """Level k of the per-queue delays of earlier versions (retired once empty: the shared
        levels, SharedNames.delay, replace them)."""
        return f"{self.queue}.delay.{k}"

    @property
    def delay_entry(self) -> str:
        """Where an earlier version published a job to delay in the per-queue levels."""
        return self.delay(DELAY_LEVELS - 1)

    @property
    def cancels(self) -> str:
        """The per-queue cancel store of earlier versions, read until its cancels expire."""
        return f"{self.queue}.cancels"

    def published_key(self, routing_key: str) -> str:
        """The key a job was published with, as far as its own key tells: one back from the
        delays carries the key that spelled its wait, and jobs go to Q by its name."""
        return self.queue if is_delay_key(routing_key) else routing_key

    def attempt_key(self, k: int) -> str:
        return f"{self.queue}.attempt.{k}"

    def is_attempt_key(self, routing_key: str) -> bool:
        """Whether a delivery's routing key says it came back from a retry tier."""
        return self.tier_of_key(routing_key) is not None

    def tier_of_key(self, routing_key: str) -> int | None:
        """The k of a routing key Q.attempt.k (the tier a job came back from), else None."""
        return _number_after(f"{self.queue}.attempt.", routing_key)


def _number_after(prefix: str, name: str) -> int | None:
    """The number that ends a name which begins with prefix (ASCII digits only), else None."""
    digits = name[len(prefix) :]
    if name.startswith(prefix) and digits.isascii() and digits.isdigit():
        return int(digits)
    return None


# Every name Names derives from a queue's, as a queue name of its own: a queue named so would
# share its objects with the queue it derives from.
_DERIVED = re.compile(
    r".+\.(failed|failed\.events|failed\.scan|topology|cancels|dlx|dlx\.first|return|return\.queue"
    r"|retry\.\d+|retry\.\d+\.lanes?(\.\d+)?|retry\.redeclaring|delay\.\d+|keys|key\.\d+|tokens\..+|limited\..+|rates(\.applied)?)"
)


def refusal(queue: str) -> str | None:
    """Why a queue cannot be named so (None: it may be): a name the broker keeps (amq.), one
    the shared objects take (ricochet.), or one derived from another queue's (a.failed beside
    a)."""
    if queue.startswith((BROKER_PREFIX, SHARED_PREFIX)):
        return "names beginning with amq. (the broker's) or ricochet. (shared) are taken"
    if _DERIVED.fullmatch(queue):
        return "the name of an object ricochet derives from another queue's"
    return None
