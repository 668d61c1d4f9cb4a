"""The targets, and the results as a table (pure: results in, verdicts and text out)."""

from typing import Any

# scenario -> (label, the least ratio to the raw loop the issue asks for)
RATIO_TARGETS = {
    "happy": ("happy path", 0.9),
    "retry": ("retry path", 0.8),
    "failure": ("failure path", 0.5),
}
LABELS = {
    "raw": "raw loop: ack",
    "raw-retry": "raw loop: nack, ack the retry",
    "raw-failure": "raw loop: confirmed copy, ack",
    **{k: v[0] for k, v in RATIO_TARGETS.items()},
    "happy-no-otel": "happy path, opentelemetry absent",
    "raw-retry-jitter": "raw loop: nack into jittered lanes, ack the retry",
    "retry-jitter": "retry path, jitter 0.5",
}
# The happy path with opentelemetry installed and no tracer configured, against it not importable.
TRACING_OFF_TARGET = 0.95
DELAY_P99_TARGET_MS = 20.0
RSS_GROWTH_TARGET_MB = 10.0


def evaluate(queue_types: dict[str, Any]) -> list[dict[str, Any]]:
    """Every verdict of a full run: the paths, tracing, delays, memory, and the wait's."""
    from bench.wait import evaluate as evaluate_wait

    verdicts = _evaluate(queue_types)
    for qt, r in queue_types.items():
        if "wait" in r:  # runs from before the wait was measured have none
            verdicts += evaluate_wait(qt, r["wait"], r["throughput"])
    return verdicts


def _evaluate(queue_types: dict[str, Any]) -> list[dict[str, Any]]:
    """One verdict per target and queue type: what was measured, what was asked, met or not."""
    verdicts: list[dict[str, Any]] = []
    for qt, r in queue_types.items():
        for scenario, (label, least) in RATIO_TARGETS.items():
            tp = r["throughput"][scenario]
            for key, against in (("ratio", ""), ("same_work_ratio", " (same broker work)")):
                if key in tp:
                    verdicts.append(
                        {
                            "queue_type": qt,
                            "target": f"{label} ratio{against} >= {least}",
                            "value": tp[key],
                            "met": tp[key] >= least,
                        }
                    )
        off = r["throughput"]["happy"]["tracing_off_ratio"]
        verdicts.append(
            {
                "queue_type": qt,
                "target": "happy path, tracing installed but off, ratio to tracing absent"
                f" >= {TRACING_OFF_TARGET}",
                "value": off,
                "met": off >= TRACING_OFF_TARGET,
            }
        )
        for tier, d in r["delay"]["ricochet"].items():
            verdicts.append(
                {
                    "queue_type": qt,
                    "target": f"{tier} ms tier p99 error <= {DELAY_P99_TARGET_MS:g} ms",
                    "value": d["p99_ms"],
                    "raw_loop": r["delay"]["raw"][tier]["p99_ms"],
                    "met": abs(d["p99_ms"]) <= DELAY_P99_TARGET_MS,
                }
            )
        growth = r["memory"]["growth_mb"]
        verdicts.append(
            {
                "queue_type": qt,
                "target": f"RSS growth < {RSS_GROWTH_TARGET_MB:g} MB",
                "value": growth,
                "met": growth < RSS_GROWTH_TARGET_MB,
            }
        )
    return verdicts


def table(results: dict[str, Any]) -> str:
    """The results as Markdown tables (printed, and pasted into docs/performance.md)."""
    qts = list(results["queue_types"])
    rows = [
        "| scenario | "
        + " | ".join(f"{qt} jobs/s | ratio | same work | CPU µs/job" for qt in qts)
        + " |",
        "|---|" + "---:|---:|---:|---:|" * len(qts),
    ]
    for scenario, label in LABELS.items():
        if scenario not in results["queue_types"][qts[0]]["throughput"]:
            continue  # a run from before the scenario was measured
        cells = []
        for qt in qts:
            tp = results["queue_types"][qt]["throughput"][scenario]
            same = tp.get("same_work_ratio", tp.get("ratio", 1.0))
            cells.append(
                f"{tp['median']:,} | {tp.get('ratio', 1.0):.2f} | {same:.2f}"
                f" | {tp['cpu_us_per_job']:,}"
            )
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    delays = [results["queue_types"][qt]["delay"] for qt in qts]
    rows += [
        "",
        "| retry delay error (observed - configured), p50 / p99 | "
        + " | ".join(f"{qt}: ricochet | {qt}: raw loop" for qt in qts)
        + " |",
        "|---|" + "---:|---:|" * len(qts),
    ]
    for tier in delays[0]["ricochet"]:
        cells = [f"{_p50_p99(d['ricochet'][tier])} | {_p50_p99(d['raw'][tier])}" for d in delays]
        rows.append(f"| {int(tier):,} ms tier | " + " | ".join(cells) + " |")
    rows += ["", "| worker RSS | " + " | ".join(qts) + " |", "|---|" + "---:|" * len(qts)]
    mem = [results["queue_types"][qt]["memory"] for qt in qts]
    rows.append("| idle | " + " | ".join(f"{m['idle_mb']} MB" for m in mem) + " |")
    rows.append(
        f"| after {mem[0]['jobs']:,} jobs | "
        + " | ".join(f"{m['after_mb']} MB" for m in mem)
        + " |"
    )
    rows.append("| growth | " + " | ".join(f"{m['growth_mb']:+} MB" for m in mem) + " |")
    return "\n".join(rows)


def _p50_p99(d: dict[str, Any]) -> str:
    return f"{d['p50_ms']:+.1f} / {d['p99_ms']:+.1f} ms"


def print_table(results: dict[str, Any]) -> None:
    print()
    print(table(results))
    print()
    for v in results["targets"]:
        verdict = "met    " if v["met"] else "NOT MET"
        raw = f" (raw loop: {v['raw_loop']})" if "raw_loop" in v else ""
        print(f"{verdict}  {v['queue_type']:8} {v['target']}: {v['value']}{raw}")
