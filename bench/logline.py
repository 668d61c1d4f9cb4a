"""Where a log line's time goes: the real configuration, stage by stage (python -m bench.logline).

configure_logging("INFO", "json") is set up writing to /dev/null as the benchmark's worker is,
and each part of the success line a job writes is timed on its own, in a running event loop as
in the worker: binding the job's fields (once per job), every processor of the configured chain
in turn, the write (and the same from a thread, outside any loop), the whole
`log.info("job succeeded")`, and a library's warning through the standard library. With
--base-src, the same runs against the app/ of another checkout, in alternation, so the two are
compared on the same machine in the same minutes. Each figure is the best of its repeats:
another process can only make a run slower.
"""

import argparse
import asyncio
import json
import logging
import os
import timeit
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.sides import alternate, app_first

NUMBER = 20_000  # calls per repeat: long enough to time, short enough to dodge a noisy neighbour


def best_us(call: Callable[[], object], repeats: int) -> float:
    """The least time of one call in microseconds, over repeats of NUMBER calls."""
    return min(timeit.repeat(call, number=NUMBER, repeat=repeats)) / NUMBER * 1e6


def stage(processor: Callable[..., Any], event: dict[str, Any]) -> Callable[[], object]:
    """One processor's call on a fresh copy of the event it receives in the chain."""
    return lambda: processor(None, "info", dict(event))


def measure(repeats: int) -> dict[str, float]:
    """Every stage of the success line, in microseconds, in this process's ricochet."""
    import structlog
    from ricochet.handlers.job import Job, bind_log_context
    from ricochet.log import configure_logging

    devnull = open(os.devnull, "w")  # noqa: SIM115 (open for the process's life)
    configure_logging("INFO", "json", devnull)
    job = Job(
        b"{}",
        headers={},
        message_id="bench.happy.quorum.4f2a9c1e.bench.4242",
        amqp_type="bench",
        attempt=1,
        max_attempts=4,
    )
    bind_log_context(job)
    log = structlog.get_logger("ricochet.consumer")
    log.info("job succeeded")  # the first call caches the configured logger
    stages = {"bind the job's fields (once a job)": best_us(lambda: bind_log_context(job), repeats)}
    config = structlog.get_config()
    event: Any = {"event": "job succeeded"}
    copy = best_us(lambda: dict(event), repeats)  # each stage is timed on a fresh copy
    for processor in config["processors"]:
        name = getattr(processor, "__name__", type(processor).__name__).strip("_")
        stages[name] = max(0.0, best_us(stage(processor, event), repeats) - copy)
        event = processor(None, "info", dict(event))
    writer = config["logger_factory"]()
    name = type(writer).__name__
    stages[f"the write ({name})"] = best_us(lambda: writer.info(event), repeats)
    outside = ThreadPoolExecutor(1).submit(best_us, lambda: writer.info(event), repeats)
    stages[f"the write ({name}), from a thread"] = outside.result()
    stages["the whole line: log.info"] = best_us(lambda: log.info("job succeeded"), repeats)
    library = logging.getLogger("aiormq.connection")
    stages["a library's line (stdlib logging)"] = best_us(
        lambda: library.warning("connection lost"), repeats
    )
    return stages


async def in_a_loop(repeats: int) -> dict[str, float]:
    """measure() inside a running event loop, where the worker logs."""
    return measure(repeats)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.logline", description=__doc__)
    parser.add_argument("--base-src", type=Path, help="the checkout whose app/ to compare with")
    parser.add_argument("--rounds", type=int, default=3, help="alternating runs of each side")
    parser.add_argument("--repeats", type=int, default=7, help="repeats per stage per run")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        app_first()
        print(json.dumps(asyncio.run(in_a_loop(args.repeats))))
        return
    runs = alternate("bench.logline", [f"--repeats={args.repeats}"], args.base_src, args.rounds)
    for side, results in runs.items():
        print(f"\n{side}: µs, the best of {args.rounds} runs")
        for stage in results[0]:
            print(f"  {min(r.get(stage, float('nan')) for r in results):7.2f}  {stage}")


if __name__ == "__main__":
    main()
