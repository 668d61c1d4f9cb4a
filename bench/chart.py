"""The chart of docs/performance.md: throughput ratios, retry-delay error and RSS per queue type."""

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

from bench.report import DELAY_P99_TARGET_MS, LABELS, RATIO_TARGETS

COLORS = {"quorum": "#3b6ea8", "classic": "#e08a2c"}


def _ratio_label(tp: dict[str, Any]) -> str:
    ratio = f"{tp.get('ratio', 1.0):.2f}"
    return f"{ratio}\n({tp['same_work_ratio']:.2f})" if "same_work_ratio" in tp else ratio


def draw(results: dict[str, Any], path: Path) -> None:
    """Three panels side by side, written as a PNG."""
    qts = list(results["queue_types"])
    fig, (tp_ax, delay_ax, mem_ax) = plt.subplots(
        1, 3, figsize=(16, 5), gridspec_kw={"width_ratios": [1.5, 1.2, 0.7]}
    )
    width = 0.8 / len(qts)

    measured = results["queue_types"][qts[0]]["throughput"]
    scenarios = [s for s in LABELS if s in measured]  # a run may predate a scenario
    for i, qt in enumerate(qts):
        tp = results["queue_types"][qt]["throughput"]
        xs = [s + i * width for s in range(len(scenarios))]
        bars = tp_ax.bar(
            xs, [tp[s]["median"] for s in scenarios], width, label=qt, color=COLORS.get(qt)
        )
        for bar, s in zip(bars, scenarios, strict=True):
            tp_ax.annotate(
                _ratio_label(tp[s]),
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
            )
    tp_ax.set_xticks([s + width * (len(qts) - 1) / 2 for s in range(len(scenarios))])
    tp_ax.set_xticklabels(
        [LABELS[s].replace(": ", ":\n").replace(", ", ",\n") for s in scenarios], fontsize=7
    )
    tp_ax.set_ylabel("jobs per second (median)")
    tp_ax.set_title("Throughput: ratio to the raw ack loop (to the same work)", fontsize=10)
    tp_ax.legend()

    tiers = list(results["queue_types"][qts[0]]["delay"]["ricochet"])
    bar = 0.8 / (2 * len(qts))
    for i, qt in enumerate(qts):
        delay = results["queue_types"][qt]["delay"]
        for j, consumer in enumerate(("ricochet", "raw")):
            xs = [x + (2 * i + j) * bar for x in range(len(tiers))]
            delay_ax.bar(
                xs,
                [delay[consumer][t]["p99_ms"] for t in tiers],
                bar,
                label=f"{qt} {'raw loop' if consumer == 'raw' else consumer} p99",
                color=COLORS.get(qt),
                alpha=1.0 if consumer == "ricochet" else 0.45,
                hatch=None if consumer == "ricochet" else "//",
            )
            delay_ax.plot(
                xs,
                [delay[consumer][t]["p50_ms"] for t in tiers],
                "kD",
                markersize=3,
                label="p50" if i == j == 0 else None,
            )
    delay_ax.axhline(
        DELAY_P99_TARGET_MS, color="red", linestyle="--", linewidth=1, label="p99 target"
    )
    delay_ax.set_xticks([x + bar * (2 * len(qts) - 1) / 2 for x in range(len(tiers))])
    delay_ax.set_xticklabels([f"{int(t):,} ms tier" for t in tiers])
    delay_ax.set_ylabel("observed - configured delay (ms)")
    load = results["queue_types"][qts[0]]["delay"]["load_jobs_per_s"]
    delay_ax.set_title(f"Retry delay error under {load:,} jobs/s of load", fontsize=10)
    delay_ax.legend(fontsize=8)

    for i, qt in enumerate(qts):
        mem = results["queue_types"][qt]["memory"]
        mem_ax.bar(
            [0 + i * width, 1 + i * width],
            [mem["idle_mb"], mem["after_mb"]],
            width,
            label=qt,
            color=COLORS.get(qt),
        )
    jobs = results["queue_types"][qts[0]]["memory"]["jobs"]
    mem_ax.set_xticks([width * (len(qts) - 1) / 2, 1 + width * (len(qts) - 1) / 2])
    mem_ax.set_xticklabels(["idle", f"after {jobs:,} jobs"])
    mem_ax.set_ylabel("worker RSS (MB)")
    mem_ax.set_title("Worker memory")
    mem_ax.legend(loc="lower center")

    m = results["machine"]
    fig.suptitle(
        f"ricochet, {m['cpus']} cores, RabbitMQ {m['rabbitmq']}, Python {m['python']}, "
        f"prefetch {results['config']['prefetch']}, targets: ratios "
        + ", ".join(f"{v[1]:g}" for v in RATIO_TARGETS.values()),
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_herd(results: dict[str, Any], path: Path) -> None:
    """The herd: when 1,000 jobs that failed together come back, one panel per jitter."""
    qts = list(results["queue_types"])
    runs = {qt: results["queue_types"][qt]["wait"]["herd"] for qt in qts}
    jitters = [run["jitter"] for run in runs[qts[0]]]
    fig, axes = plt.subplots(1, len(jitters), figsize=(15, 4), sharey=True)
    for ax, i in zip(axes, range(len(jitters)), strict=True):
        for qt in qts:
            run = runs[qt][i]
            bins = {float(k): v for k, v in run["back_s_histogram"].items()}
            ax.bar(
                [b + 0.125 for b in bins],
                list(bins.values()),
                width=0.25,
                alpha=0.6,
                color=COLORS.get(qt),
                label=qt,
            )
        delay_s = runs[qts[0]][i]["delay_ms"] / 1000
        ax.axvline(delay_s, color="grey", linestyle=":", linewidth=1)
        ax.set_title(f"jitter {jitters[i]:g}: tier delay {delay_s:g} s")
        ax.set_xlabel("seconds after the first failure")
    axes[0].set_ylabel("jobs back in each 0.25 s")
    axes[0].legend()
    fig.suptitle(f"{runs[qts[0]][0]['jobs']:,} jobs failing at once, and when they come back")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
