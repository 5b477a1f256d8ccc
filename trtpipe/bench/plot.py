"""`--plot FILE.png`: the throughput-latency curve of a sweep and the TTFT distribution.

The same figure is drawn from a live result (`plot_result`) or from a recorded summary
(`plot_input_from_summary`, what `trtpipe report` redraws for every recorded version).

Left panel: one point per load level (rate or concurrency), x = achieved output-token
throughput, y = E2E and TTFT latency at P50 (solid) and P99 (dashed); each point is labelled with
its load level, so the knee where throughput stops growing and latency takes off is visible.
Right panel: the TTFT histogram of every load level (successful requests), with P50 and P99 marks
for the highest load. Both switch to a log scale when values span more than 20x (past the knee,
latency grows by orders of magnitude and would squash the low-load points).
"""

from __future__ import annotations

import io
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trtpipe.bench.metrics import Aggregates
from trtpipe.bench.report import BenchResult


@dataclass(frozen=True)
class PlotRun:
    """What the figure needs of one load level: its label, aggregates and successful requests' TTFTs (s)."""

    label: str
    aggregates: Aggregates
    ttft_s: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class PlotInput:
    title: str
    runs: list[PlotRun]


def plot_input(result: BenchResult) -> PlotInput:
    runs = [PlotRun(run.label, run.aggregates, [r.ttft_s for r in run.records if r.ok and r.ttft_s is not None])
            for run in result.runs]
    return PlotInput(f"trtpipe bench: {result.model} @ {result.url}, {result.mode} loop", runs)


def plot_input_from_summary(summary: dict[str, Any], title: str | None = None) -> PlotInput | None:
    """The same figure's input from a recorded bench summary (`BenchResult.summary()`, what `bench --record`
    stores): None when the record has no per-run aggregates (a result recorded by hand with flat figures).
    Records made before the summary carried `ttft_s_ok` redraw the curve; their histogram says it has none."""
    runs: list[PlotRun] = []
    for run in summary.get("runs") or []:
        if not isinstance(run, dict) or not isinstance(run.get("aggregates"), dict):
            return None
        try:
            aggregates = Aggregates.model_validate(run["aggregates"])
        except ValidationError:
            return None
        ttfts = [float(v) for v in run.get("ttft_s_ok") or [] if isinstance(v, (int, float))]
        runs.append(PlotRun(str(run.get("label") or f"run {len(runs) + 1}"), aggregates, ttfts))
    if not runs:
        return None
    default = f"trtpipe bench: {summary.get('model', '?')} @ {summary.get('url', '?')}, {summary.get('mode', '?')} loop"
    return PlotInput(title or default, runs)


def plot_result(result: BenchResult, path: Path) -> Path:
    """Draw the figure and write it as PNG (atomically). Uses matplotlib's Agg backend (no display)."""
    return write_png(draw(plot_input(result)), path)


def png_bytes(data: PlotInput) -> bytes:
    """The figure as PNG bytes (the release report inlines them)."""
    buffer = io.BytesIO()
    draw(data).savefig(buffer, format="png")
    return buffer.getvalue()


def draw(data: PlotInput):  # -> matplotlib.figure.Figure (imported lazily)
    """Left: throughput vs latency per load level; right: the TTFT histogram per load level."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(13, 5.2), dpi=110, layout="constrained")
    curve, hist = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.25, 1]})

    runs = [r for r in data.runs if r.aggregates.requests_ok > 0]
    x = [r.aggregates.output_token_throughput for r in runs]
    series = (
        ("E2E P50", [r.aggregates.e2e_s.p50 for r in runs], "tab:blue", "-"),
        ("E2E P99", [r.aggregates.e2e_s.p99 for r in runs], "tab:blue", "--"),
        ("TTFT P50", [r.aggregates.ttft_s.p50 for r in runs], "tab:orange", "-"),
        ("TTFT P99", [r.aggregates.ttft_s.p99 for r in runs], "tab:orange", "--"),
    )
    for name, values, color, style in series:
        ms = [v * 1e3 if v is not None else float("nan") for v in values]
        curve.plot(x, ms, style, marker="o", color=color, label=name)
    for run, xv, yv in zip(runs, x, [r.aggregates.e2e_s.p99 for r in runs], strict=True):
        if yv is not None:
            curve.annotate(run.label, (xv, yv * 1e3), textcoords="offset points", xytext=(4, 6), fontsize=8)
    curve.set_xlabel("achieved output throughput (tokens/s)")
    curve.set_ylabel("latency (ms)")  # replaced below when the axis goes logarithmic
    curve.set_title("Throughput vs latency across the sweep")
    curve.grid(True, alpha=0.3)
    finite = [v * 1e3 for _, values, _, _ in series for v in values if v is not None and v > 0]
    # Past saturation latency grows by orders of magnitude; a log axis keeps the low-load points readable.
    wide = bool(finite) and max(finite) / min(finite) > 20
    if wide:
        curve.set_yscale("log")
        curve.set_ylim(bottom=min(finite) / 1.5, top=max(finite) * 2.0)
        curve.set_ylabel("latency (ms, log scale)")
    else:
        # Headroom so the load labels above the top curve stay inside.
        curve.set_ylim(bottom=0, top=(max(finite) * 1.18) if finite else 1)
    curve.set_xlim(left=0, right=(max(x) * 1.15) if x and max(x) > 0 else 1)
    if runs:
        curve.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=4, fontsize=9, frameon=False)
    failed = sum(r.aggregates.requests_failed for r in data.runs)
    if failed:
        curve.text(
            0.99, 0.02, f"{failed} failed request(s) not plotted", transform=curve.transAxes,
            ha="right", va="bottom", color="tab:red", fontsize=9,
        )
    if not runs:
        curve.text(0.5, 0.5, "no successful request", transform=curve.transAxes, ha="center", va="center")

    all_ttft = [v * 1e3 for run in runs for v in run.ttft_s]
    if all_ttft:
        lo, hi = max(min(all_ttft), 1e-3), max(all_ttft)
        log_bins = hi / lo > 20
        if log_bins:  # same reason as the curve: low-load TTFTs would all fall in the first bin
            edges = [lo * (hi / lo) ** (i / 40) for i in range(41)]
            edges[0], edges[-1] = lo * 0.999, hi * 1.001
            hist.set_xscale("log")
        elif hi > lo:
            edges = [lo + (hi - lo) * i / 30 for i in range(31)]
        else:
            edges = [lo - 0.5, lo + 0.5]
        for run in runs:
            values = [v * 1e3 for v in run.ttft_s]
            hist.hist(values, bins=edges, histtype="step", linewidth=1.6, label=f"{run.label} (n={len(values)})")
        top = runs[-1].aggregates.ttft_s
        for name, value, style in (("P50", top.p50, "-"), ("P99", top.p99, "--")):
            if value is not None:
                hist.axvline(
                    value * 1e3, color="black", linestyle=style, linewidth=1,
                    label=f"{name} at {runs[-1].label}: {value * 1e3:.1f} ms",
                )
        hist.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3, fontsize=8, frameon=False)
    else:
        # Successful requests but no samples: a result recorded before summaries kept per-request TTFTs.
        missing = "no per-request TTFTs in this record" if any(r.aggregates.ttft_s.count for r in runs) else "no TTFT measured"
        hist.text(0.5, 0.5, missing, transform=hist.transAxes, ha="center", va="center")
    hist.set_xlabel("time to first token (ms" + (", log scale)" if all_ttft and log_bins else ")"))
    hist.set_ylabel("requests")
    hist.yaxis.set_major_locator(MaxNLocator(integer=True))
    hist.set_title("TTFT distribution per load level")
    hist.grid(True, alpha=0.3)

    fig.suptitle(data.title, fontsize=12)
    return fig


def write_png(fig, path: Path) -> Path:
    """Write a figure as PNG atomically (temp file beside it, then rename), readable by others."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, format="png")
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a plot is meant to be read by others
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
