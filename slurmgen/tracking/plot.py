"""`slurmgen plot RUN`: one PNG with a panel per metric, train and val curves in each.

Drawn for a person skimming many runs: the title says which run, its status, steps and time;
each panel has the train curve as a line (a faint raw line under a smoothed one when there are
many points) and val as dots joined by a line, the last value of each in the legend, and a
dashed line where an attempt resumed (requeue or restart), so a jump in the curve can be told
apart from a bug. Loss panels switch to a log scale when the
values span more than two decades. `plot_sweep` draws the tasks of a sweep over each other, a
colour per task. matplotlib is imported only here (the `plot` extra).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
        out.append(avg / (1 - weight**i))
    return out


def series(run: RunRecord) -> dict[str, dict[str, tuple[list[int], list[float]]]]:
    """metric -> type -> (steps, values), each type sorted by step; non-finite values skipped."""
    out: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    for record in sorted(run.metrics, key=lambda r: r.get("step") or 0):
        kind, step = record.get("type"), record.get("step")
        for name, value in (record.get("metrics") or {}).items():
            if (
                isinstance(value, (int, float))
                and math.isfinite(value)
                and isinstance(step, int)
                and isinstance(kind, str)
            ):
                xs, ys = out.setdefault(name, {}).setdefault(kind, ([], []))
                xs.append(step)
                ys.append(float(value))
    return out


def order(names: Sequence[str]) -> list[str]:
    first = [n for n in FIRST if n in names]
    return first + sorted(n for n in names if n not in first)


def plot_run(run: RunRecord, out: str | Path, metrics: Sequence[str] | None = None, dpi: int = 110) -> Path:
    """Write the PNG to `out` and return its path. Raises ValueError if there is nothing to draw."""
    data = series(run)
    names = _wanted(data, metrics, f"run {run.get('id')!r}")
    fig, axes = _figure(len(names))
    restarts = [
        (a.get("attempt"), a.get("resumed_at_step"))
        for a in run.get("attempts") or []
        if (a.get("attempt") or 1) > 1 and isinstance(a.get("resumed_at_step"), int)
    ]
    for ax, name in zip(axes.flat, names):
        for kind in ("train", "val", "test"):
            if kind in data[name]:
                _curve(ax, name, kind, *data[name][kind], COLOURS[kind], kind)
        for attempt, step in restarts:
            ax.axvline(step, color="#888888", linestyle="--", linewidth=1)
            ax.annotate(
                f"restart {attempt - 1}",
                (step, 1),
                xycoords=("data", "axes fraction"),
                xytext=(3, -12),
                textcoords="offset points",
                fontsize=7,
                color="#666666",
            )
        _finish(ax, name, [v for xs_ys in data[name].values() for v in xs_ys[1]])
    status = run.get("status", "?")
    restarts_text = f", {run.get('restart_count')} restart(s)" if run.get("restart_count") else ""
    return _save(
        fig,
        axes,
        len(names),
        str(run.get("name")),
        f"{run.get('group')} / {run.get('job_type')}  ·  {status}  ·  "
        f"{run.steps if run.steps is not None else 0} steps  ·  {format_duration(run.duration())}{restarts_text}",
        out,
        dpi,
    )


def plot_sweep(
    runs: Sequence[RunRecord], out: str | Path, metrics: Sequence[str] | None = None, dpi: int = 110
) -> Path:
    """The tasks of one sweep in one PNG: a panel per metric, a colour per task, labelled with its
    parameters (train solid, val dashed), so that the settings can be compared at a glance."""
    sweep = runs[0].sweep or {}
    per_run = [series(run) for run in runs]
    merged: dict[str, dict] = {}
    for data in per_run:
        for name, kinds in data.items():
            merged.setdefault(name, {}).update(kinds)
    names = _wanted(merged, metrics, f"sweep {sweep.get('id')!r}")
    fig, axes = _figure(len(names))
    labels = [_task_label(run, runs) for run in runs]
    for ax, name in zip(axes.flat, names):
        values: list[float] = []
        for i, (data, label) in enumerate(zip(per_run, labels)):
            colour = TASK_COLOURS[i % len(TASK_COLOURS)]
            for kind in ("train", "val", "test"):
                if kind in data.get(name, {}):
                    _curve(
                        ax,
                        name,
                        kind,
                        *data[name][kind],
                        colour,
                        label if kind == "train" or "train" not in data[name] else f"{label} {kind}",
                        dashed=kind != "train",
                    )
                    values += data[name][kind][1]
        _finish(ax, name, values)
    states = ", ".join(f"{n} {s}" for s, n in Counter(str(r.get("status", "?")) for r in runs).items())
    return _save(
        fig,
        axes,
        len(names),
        f"sweep {sweep.get('id')}",
        f"{len(runs)} runs  ·  {states}  ·  train solid, val dashed",
        out,
        dpi,
    )


TASK_COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)


def _task_label(run: RunRecord, runs: Sequence[RunRecord]) -> str:
    """'#2 lr=3e-4 batch-size=8'; the job type too where a task has several runs (per-process mode)."""
    sweep = run.sweep or {}
    params = " ".join(f"{k}={v}" for k, v in (sweep.get("params") or {}).items())
    label = f"#{sweep.get('task')} {params}".strip()
    twins = sum(1 for r in runs if (r.sweep or {}).get("task") == sweep.get("task"))
    return f"{label} {run.get('job_type')}" if twins > 1 else label


def _wanted(data: dict, metrics: Sequence[str] | None, what: str) -> list[str]:
    names = order([m for m in data if not metrics or m in metrics])
    if not names:
        wanted = f" among {', '.join(metrics)}" if metrics else ""
        raise ValueError(f"{what} has no metrics to plot{wanted} (have: {', '.join(order(list(data))) or 'none'})")
    return names


def _figure(panels: int):
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a login node
    import matplotlib.pyplot as plt

    cols = 1 if panels == 1 else 2
    rows = math.ceil(panels / cols)
    return plt.subplots(rows, cols, figsize=(6.4 * cols, 3.6 * rows + 0.7), squeeze=False)


def _curve(
    ax, name: str, kind: str, xs: list[int], ys: list[float], colour: str, label: str, dashed: bool = False
) -> None:
    """One curve with its last value in the legend; a noisy train curve faint, its trend drawn over it."""
    style: dict[str, Any] = dict(color=colour, label=f"{label}  (last {_fmt(ys[-1])})", linewidth=1.8)
    if dashed:
        style["linestyle"] = "--"
    if kind != "train" or len(xs) < 3:
        style.update(marker="o", markersize=4)
    if len(xs) > SMOOTH_FROM and name not in NOT_SMOOTHED:
        ax.plot(xs, ys, color=colour, linewidth=1, alpha=0.25)
        ys = smooth(ys)
        style["label"] += ", smoothed"
    ax.plot(xs, ys, **style)


def _finish(ax, name: str, values: list[float]) -> None:
    if "loss" in name and values and min(values) > 0 and max(values) / min(values) > 100:
        ax.set_yscale("log")
    ax.set_title(name, fontsize=11, loc="left")
    ax.set_xlabel("step")
    ax.grid(True, color="#e6e6e6", linewidth=0.8)
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(frameon=False, fontsize=9)


def _save(fig, axes, panels: int, title: str, subtitle: str, out: str | Path, dpi: int) -> Path:
    import matplotlib.pyplot as plt

    for ax in list(axes.flat)[panels:]:
        ax.set_visible(False)
    height = fig.get_figheight()  # the header is placed in inches, so it looks the same for any number of rows
    fig.text(0.012, 1 - 0.22 / height, title, fontsize=14, weight="bold", va="center")
    fig.text(0.012, 1 - 0.5 / height, subtitle, fontsize=9.5, color="#555555", va="center")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.72 / height))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out
