"""The dashboard picture of docs/observability.md, from a real run: jobs, Prometheus, a render.

Starts Prometheus (Debian's, with the repository's scrape jobs and rules, as the integration
test does), a worker and a monitor on a queue of its own, publishes the bundled example's jobs
for a few minutes (a quiet spell, an outage of the handlers' backend, the recovery), then draws
each panel of config/grafana/dashboards/ricochet.json from Prometheus' answers to the panel's
own queries into an HTML page, and screenshots it with headless Chromium.

    make dashboard-png        # about 7 minutes; writes docs/dashboard.png
"""

import asyncio
import html
import json
import math
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aio_pika

from tests.prometheus import Prometheus
from tests.support import (
    ROOT,
    delete_topology,
    free_port,
    make_settings,
    publish,
    ricochet_env,
    spawn,
)

DASHBOARD = ROOT / "config" / "grafana" / "dashboards" / "ricochet.json"
OUTPUT = ROOT / "docs" / "dashboard.png"
RATE_INTERVAL = "30s"
# (seconds, jobs per second, share of jobs whose backend call fails on the first attempts)
PHASES = [(120, 6, 0.1), (90, 6, 0.8), (150, 6, 0.1)]
PALETTE = ["#5794f2", "#b877d9", "#ff9830", "#8ab8ff", "#73bf69", "#fade2a", "#f2495c"]
# Grafana's dark theme for the color names the dashboard uses.
GRAFANA_COLORS = {"green": "#73bf69", "yellow": "#fade2a", "red": "#f2495c"}
COLUMN_PX, ROW_PX = 64, 30


def job(outage_share: float) -> str:
    """One example report job: most succeed, some fail once or twice, a few for good."""
    draw = random.random()
    report: dict[str, Any] = {"report_id": uuid.uuid4().hex[:8], "work_s": random.random() / 4}
    if draw < outage_share:
        report["fail_times"] = random.choice([1, 2, 3])
    elif draw > 0.98:
        report["fail"] = random.choice(["always", "permanent"])
    return json.dumps(report)


async def run_jobs(queue: str) -> None:
    connection = await aio_pika.connect(make_settings(queue).amqp_url)
    channel = await connection.channel(publisher_confirms=True)
    for seconds, rate, outage_share in PHASES:
        for _ in range(seconds * rate):
            await publish(channel, queue, job(outage_share), type="report")
            await asyncio.sleep(1 / rate)
    await connection.close()


async def remove_queues(queue: str) -> None:
    connection = await aio_pika.connect(make_settings(queue).amqp_url)
    await delete_topology(connection, queue)
    await connection.close()


def expand(panels: list[dict[str, Any]], stages: list[str]) -> list[dict[str, Any]]:
    """Grafana's layout: a panel repeated over $stage becomes one per stage, side by side."""
    out: list[dict[str, Any]] = []
    shift = 0
    for panel in panels:
        grid = dict(panel["gridPos"], y=panel["gridPos"]["y"] + shift)
        if panel.get("repeat") != "stage":
            out.append(dict(panel, gridPos=grid))
            continue
        per_row = min(len(stages), panel.get("maxPerRow", len(stages)))
        width = 24 // per_row
        for i, stage in enumerate(stages):
            pos = {"x": (i % per_row) * width, "y": grid["y"] + (i // per_row) * grid["h"]}
            out.append(dict(panel, title=stage, stage=stage, gridPos=dict(grid, w=width, **pos)))
        shift += (len(stages) - 1) // per_row * grid["h"]
    return out


def natural(stage: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", stage)]


def substitute(expr: str, queue: str, stage: str | None) -> str:
    expr = expr.replace("$queue", queue).replace("$__rate_interval", RATE_INTERVAL)
    return expr.replace("$stage", stage or "")


def formatted(value: float, unit: str) -> str:
    if math.isnan(value):  # no series, or Prometheus' "no value"
        return "-"
    if unit == "s" and value >= 90:
        minutes, seconds = divmod(int(value), 60)
        return f"{minutes} min {seconds} s"
    suffix = {"s": " s", "ops": "/s"}.get(unit, "")
    return f"{value:.3g}{suffix}" if value < 1000 else f"{value:.0f}{suffix}"


Series = list[tuple[str, list[tuple[float, float]]]]


def chart(series: Series, colors: list[str], w: int, h: int, unit: str) -> str:
    """An SVG line chart of the series over a shared time axis."""
    points = [p for _, values in series for p in values if p[1] == p[1]]
    if not points:
        return '<div class="none">No data</div>'
    t0, t1 = min(p[0] for p in points), max(p[0] for p in points)
    highest = max(p[1] for p in points)
    top = highest * 1.15 if highest > 0 else 1.0
    left, pad, bottom = 56, 8, 18

    def x(t: float) -> float:
        return left + (t - t0) / max(t1 - t0, 1) * (w - left - pad)

    def y(v: float) -> float:
        return pad + (h - bottom - pad) * (1 - v / top)

    parts = [f'<svg width="{w}" height="{h}">']
    for v in (top * i / 3 for i in range(4)):
        label = html.escape(formatted(v, unit))
        parts.append(f'<line x1="{left}" x2="{w - pad}" y1="{y(v):.1f}" y2="{y(v):.1f}"/>')
        parts.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{label}</text>')
    for t, anchor in ((t0, "start"), ((t0 + t1) / 2, "middle"), (t1, "end")):
        label = time.strftime("%H:%M", time.gmtime(t))
        parts.append(f'<text x="{x(t):.1f}" y="{h - 3}" text-anchor="{anchor}">{label}</text>')
    for (_, values), color in zip(series, colors, strict=True):
        line = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in values if v == v)
        parts.append(f'<polyline points="{line}" stroke="{color}"/>')
    legend = "".join(
        f'<span><i style="background:{color}"></i>{html.escape(name)}</span>'
        for (name, _), color in zip(series, colors, strict=True)
    )
    return "".join(parts) + f'</svg><div class="legend">{legend}</div>'


def legend_name(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m[1], ""), template) or "value"


def series_colors(panel: dict[str, Any], names: list[str]) -> list[str]:
    """The panel's fixed colors by series name (its overrides), the palette for the others."""
    fixed = {
        o["matcher"]["options"]: GRAFANA_COLORS[prop["value"]["fixedColor"]]
        for o in panel["fieldConfig"]["overrides"]
        for prop in o["properties"]
        if prop["id"] == "color"
    }
    return [fixed.get(name, PALETTE[i % len(PALETTE)]) for i, name in enumerate(names)]


def stat_color(panel: dict[str, Any], value: float) -> str:
    """The color of the last threshold step the value reaches (Grafana's rule)."""
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    reached = [s for s in steps if s["value"] is None or value >= s["value"]]
    return GRAFANA_COLORS[reached[-1]["color"]]


def panel_html(
    prom: Prometheus, panel: dict[str, Any], queue: str, start: float, end: float
) -> str:
    unit = panel["fieldConfig"]["defaults"].get("unit", "short")
    grid = panel["gridPos"]
    w, h = grid["w"] * COLUMN_PX - 10, grid["h"] * ROW_PX - 10
    exprs = [(substitute(t["expr"], queue, panel.get("stage")), t) for t in panel["targets"]]
    if panel["type"] == "stat":
        result = prom.api("query", query=exprs[0][0], time=str(end))["result"]
        value = float(result[0]["value"][1]) if result else math.nan
        color = stat_color(panel, value)
        content = f'<div class="stat" style="color:{color}">{formatted(value, unit)}</div>'
    else:
        series: Series = []
        step = str(max((end - start) / 150, 1))
        for expr, target in exprs:
            answer = prom.api("query_range", query=expr, start=str(start), end=str(end), step=step)
            for s in answer["result"]:
                values = [(float(t), float(v)) for t, v in s["values"]]
                series.append((legend_name(target.get("legendFormat", ""), s["metric"]), values))
        series.sort(key=lambda s: natural(s[0]))
        colors = series_colors(panel, [name for name, _ in series])
        content = chart(series, colors, w, h - 52, unit)
    style = f"left:{grid['x'] * COLUMN_PX}px;top:{grid['y'] * ROW_PX}px;width:{w}px;height:{h}px"
    title = html.escape(panel["title"])
    return f'<div class="panel" style="{style}"><h2>{title}</h2>{content}</div>'


PAGE = """<!doctype html><meta charset="utf-8"><style>
body {{ margin: 0; background: #111217; color: #ccccdc; font: 13px sans-serif; }}
header {{ padding: 10px 14px; font-size: 17px; }} header small {{ color: #8e8e9e; }}
main {{ position: relative; margin: 0 10px; height: {height}px; }}
.panel {{ position: absolute; background: #181b1f; border: 1px solid #2c3235; border-radius: 3px;
  padding: 4px 0 0 0; overflow: hidden; }}
h2 {{ font-size: 13px; font-weight: 500; margin: 2px 10px 6px; }}
.stat {{ font-size: 38px; text-align: center; margin-top: 8px; }}
line {{ stroke: #2c3235; }} text {{ fill: #8e8e9e; font-size: 10px; }}
polyline {{ fill: none; stroke-width: 1.6; }}
.legend {{ margin: 0 10px; font-size: 11px; }} .legend span {{ margin-right: 12px; }}
.legend i {{ display: inline-block; width: 12px; height: 3px; margin: 0 5px 3px 0; }}
.none {{ color: #8e8e9e; text-align: center; margin-top: 30px; }}
</style><header>ricochet <small>queue {queue} · last {minutes} minutes · {when} UTC</small></header>
<main>{panels}</main>"""


def render(prom: Prometheus, queue: str, start: float, end: float, output: Path) -> None:
    board = json.loads(DASHBOARD.read_text())
    stage_values = prom.api(
        "label/stage/values", **{"match[]": f'ricochet_queue_messages{{queue="{queue}"}}'}
    )
    panels = expand(board["panels"], sorted(stage_values, key=natural))
    height = max((p["gridPos"]["y"] + p["gridPos"]["h"]) * ROW_PX for p in panels) + 10
    page = PAGE.format(
        height=height,
        queue=html.escape(queue),
        minutes=round((end - start) / 60),
        when=time.strftime("%Y-%m-%d %H:%M", time.gmtime(end)),
        panels="".join(panel_html(prom, p, queue, start, end) for p in panels),
    )
    with tempfile.TemporaryDirectory() as directory:
        page_path = Path(directory) / "dashboard.html"
        page_path.write_text(page)
        chromium = shutil.which("chromium")
        assert chromium, "chromium is missing: apt-get install chromium"
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--window-size={24 * COLUMN_PX + 20},{height + 50}",
                f"--screenshot={output}",
                page_path.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )


def main() -> None:
    queue = f"demo-{uuid.uuid4().hex[:6]}"
    settings = make_settings(queue, retry_delay_ms=5000, alert_interval_s=1, connect_timeout_s=20)
    ports = {"ricochet-worker": free_port(), "ricochet-monitor": free_port()}
    with tempfile.TemporaryDirectory() as directory:
        logs = Path(directory)
        processes = [
            spawn(
                [role],
                {**ricochet_env(settings), "RICOCHET_HTTP_PORT": str(ports[f"ricochet-{role}"])},
                logs / f"{role}.log",
            )
            for role in ("worker", "monitor")
        ]
        try:
            targets = {job: [f"127.0.0.1:{port}"] for job, port in ports.items()}
            with Prometheus(logs, targets) as prom:
                time.sleep(5)
                start = time.time()
                asyncio.run(run_jobs(queue))
                end = time.time()
                time.sleep(3)  # the last scrape
                render(prom, queue, start, end, OUTPUT)
        finally:
            for process in processes:
                process.terminate()
                process.wait(30)
            asyncio.run(remove_queues(queue))
    print(f"wrote {OUTPUT.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
