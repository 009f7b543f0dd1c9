"""`slurmgen plot RUN`: one PNG with a panel per metric, train and val curves in each.

Drawn for a person skimming many runs: the title says which run, its status, steps and time;
each panel has the train curve as a line (a faint raw line under a smoothed one when there are
many points) and val as dots joined by a line, the last value of each in the legend, and a
dashed line where an attempt resumed (requeue or restart), so a jump in the curve can be told
apart from a bug. Loss panels switch to a log scale when the
values span more than two decades. matplotlib is imported only here (the `plot` extra).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from .records import RunRecord, format_duration

COLOURS = {"train": "#1f77b4", "val": "#d62728", "test": "#2ca02c"}
FIRST = ("loss", "accuracy", "acc", "lr")
SMOOTH_FROM = 30  # points of one curve above which it is drawn smoothed
NOT_SMOOTHED = ("lr", "learning_rate", "epoch")  # schedules: exact by design, a lag would mislead


def _fmt(value: float) -> str:
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"


def smooth(values: list[float]) -> list[float]:
    """Exponential moving average over about a tenth of the curve, debiased at the start
    (as TensorBoard's smoothing), so the first points are not pulled towards zero."""
    weight = 1 - 1 / max(2.0, len(values) / 10)
    out, avg = [], 0.0
    for i, v in enumerate(values, start=1):
        avg = weight * avg + (1 - weight) * v
        out.append(avg / (1 - weight ** i))
    return out


def series(run: RunRecord) -> dict[str, dict[str, tuple[list[int], list[float]]]]:
    """metric -> type -> (steps, values), each type sorted by step; non-finite values skipped."""
    out: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    for record in sorted(run.metrics, key=lambda r: (r.get("step") or 0)):
        kind, step = record.get("type"), record.get("step")
        for name, value in (record.get("metrics") or {}).items():
            if isinstance(value, (int, float)) and math.isfinite(value) and isinstance(step, int):
                xs, ys = out.setdefault(name, {}).setdefault(kind, ([], []))
                xs.append(step)
                ys.append(float(value))
    return out


def order(names: Sequence[str]) -> list[str]:
    first = [n for n in FIRST if n in names]
    return first + sorted(n for n in names if n not in first)


def plot_run(run: RunRecord, out: str | Path, metrics: Sequence[str] | None = None, dpi: int = 110) -> Path:
    """Write the PNG to `out` and return its path. Raises ValueError if there is nothing to draw."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a login node
    import matplotlib.pyplot as plt

    data = series(run)
    names = order([m for m in data if not metrics or m in metrics])
    if not names:
        wanted = f" among {', '.join(metrics)}" if metrics else ""
        raise ValueError(f"run {run.get('id')!r} has no metrics to plot{wanted} (have: {', '.join(order(list(data))) or 'none'})")
    cols = 1 if len(names) == 1 else 2
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 3.6 * rows + 0.7), squeeze=False)
    restarts = [(a.get("attempt"), a.get("resumed_at_step")) for a in run.get("attempts") or []
                if (a.get("attempt") or 1) > 1 and isinstance(a.get("resumed_at_step"), int)]
    for ax, name in zip(axes.flat, names):
        for kind in ("train", "val", "test"):
            if kind not in data[name]:
                continue
            xs, ys = data[name][kind]
            style = dict(color=COLOURS[kind], label=f"{kind}  (last {_fmt(ys[-1])})", linewidth=1.8)
            if kind != "train" or len(xs) < 3:
                style.update(marker="o", markersize=4)
            if len(xs) > SMOOTH_FROM and name not in NOT_SMOOTHED:  # noisy steps: the raw curve faint, its trend drawn over it
                ax.plot(xs, ys, color=COLOURS[kind], linewidth=1, alpha=0.25)
                ys = smooth(ys)
                style["label"] += ", smoothed"
            ax.plot(xs, ys, **style)
        values = [v for xs_ys in data[name].values() for v in xs_ys[1]]
        if "loss" in name and values and min(values) > 0 and max(values) / min(values) > 100:
            ax.set_yscale("log")
        for attempt, step in restarts:
            ax.axvline(step, color="#888888", linestyle="--", linewidth=1)
            ax.annotate(f"restart {attempt - 1}", (step, 1), xycoords=("data", "axes fraction"), xytext=(3, -12),
                        textcoords="offset points", fontsize=7, color="#666666")
        ax.set_title(name, fontsize=11, loc="left")
        ax.set_xlabel("step")
        ax.grid(True, color="#e6e6e6", linewidth=0.8)
        ax.spines[["top", "right"]].set_visible(False)
        ax.legend(frameon=False, fontsize=9)
    for ax in list(axes.flat)[len(names):]:
        ax.set_visible(False)
    status = run.get("status", "?")
    restarts_text = f", {run.get('restart_count')} restart(s)" if run.get("restart_count") else ""
    height = fig.get_figheight()  # the header is placed in inches, so it looks the same for any number of rows
    fig.text(0.012, 1 - 0.22 / height, f"{run.get('name')}", fontsize=14, weight="bold", va="center")
    fig.text(0.012, 1 - 0.5 / height, f"{run.get('group')} / {run.get('job_type')}  ·  {status}  ·  "
             f"{run.steps if run.steps is not None else 0} steps  ·  {format_duration(run.duration())}{restarts_text}",
             fontsize=9.5, color="#555555", va="center")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.72 / height))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out
