"""Figures: the hack-vs-pass Pareto plot and learning curves with seed bands.

Figures are drawn on ``matplotlib.figure.Figure`` (Agg canvas) without pyplot,
so no global backend state is touched. Only complete runs are plotted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from .runs import Run
from .tables import arm_names, mean_sem

# Learning-curve panels, drawn for each metric some run logs in metrics.jsonl.
CURVE_METRICS = ["reward_mean", "hack_rate", "task_score", "pass_rate", "kl"]


@dataclass
class Curve:
    """Mean over seeds ± SEM at each step (SEM nan where only one seed logged the step)."""

    steps: np.ndarray
    mean: np.ndarray
    sem: np.ndarray
    n_seeds: int


def pareto_frontier(points: list[tuple[float, float]]) -> list[int]:
    """Indices of non-dominated (hack, pass) points; lower hack and higher pass are better.

    q dominates p if q.hack <= p.hack and q.pass >= p.pass with at least one strict.
    Identical points do not dominate each other.
    """
    idx = []
    for i, (x, y) in enumerate(points):
        dominated = any(
            (qx <= x and qy >= y) and (qx < x or qy > y) for j, (qx, qy) in enumerate(points) if j != i
        )
        if not dominated:
            idx.append(i)
    return idx


def arm_colors(arms: list[str]) -> dict[str, str]:
    """A stable tab10 colour per arm (in the given order)."""
    return {a: f"C{i % 10}" for i, a in enumerate(arms)}


def pareto_points(runs: list[Run]) -> list[tuple[Run, float, float]]:
    """(run, hack_rate, pass_rate) of complete runs that report both."""
    out = []
    for r in runs:
        h, p = r.final.get("hack_rate"), r.final.get("pass_rate")
        if r.complete and h is not None and p is not None:
            out.append((r, h, p))
    return out


def plot_pareto(runs: list[Run], path: Path, reference_arm: str | None = None) -> Path:
    """Hack rate (x) vs pass rate (y): one point per run, arm means with SEM bars, frontier."""
    fig = Figure(figsize=(6.5, 5), dpi=100)
    ax = fig.add_subplot()
    pts = pareto_points(runs)
    arms = arm_names([r for r, _, _ in pts], reference_arm)
    colors = arm_colors(arm_names(runs, reference_arm))
    for arm in arms:
        xs = [h for r, h, _ in pts if r.arm == arm]
        ys = [p for r, _, p in pts if r.arm == arm]
        ax.scatter(xs, ys, color=colors[arm], alpha=0.55, s=30, label=f"{arm} (n={len(xs)})")
        mx, my = mean_sem(xs), mean_sem(ys)
        ax.errorbar(mx.mean, my.mean, xerr=_nan0(mx.sem), yerr=_nan0(my.sem), color=colors[arm],
                    marker="D", markersize=9, markeredgecolor="black", capsize=3, linestyle="none")
    front = sorted((pts[i][1], pts[i][2]) for i in pareto_frontier([(h, p) for _, h, p in pts]))
    if front:
        fx, fy = zip(*front)
        ax.plot(fx, fy, drawstyle="steps-post", color="black", linestyle="--", linewidth=1, label="Pareto frontier")
    if not pts:
        ax.text(0.5, 0.5, "no complete runs with hack_rate and pass_rate", ha="center", transform=ax.transAxes)
    ax.set_xlabel("hack rate (lower is better)")
    ax.set_ylabel("pass rate (higher is better)")
    ax.set_title("Hack vs pass (points: seeds, diamonds: arm mean ± SEM)", fontsize=10)
    ax.grid(alpha=0.3)
    if pts:
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def learning_curve(runs: list[Run], metric: str) -> Curve | None:
    """Mean ± SEM over runs of ``metric`` at each logged step (union of steps)."""
    series = [_series(r, metric) for r in runs]
    series = [s for s in series if s]
    if not series:
        return None
    steps = sorted({st for s in series for st in s})
    stats = [mean_sem(s[st] for s in series if st in s) for st in steps]
    return Curve(np.array(steps), np.array([s.mean for s in stats]), np.array([s.sem for s in stats]), len(series))


def curve_metrics(runs: list[Run]) -> list[str]:
    """The CURVE_METRICS that some complete run logs."""
    return [m for m in CURVE_METRICS if any(_series(r, m) for r in runs if r.complete)]


def plot_curves(runs: list[Run], path: Path, reference_arm: str | None = None) -> Path:
    """One panel per metric; per arm the mean over seeds with a ± SEM band."""
    metrics = curve_metrics(runs) or ["reward_mean"]
    ncols = min(3, len(metrics))
    nrows = math.ceil(len(metrics) / ncols)
    fig = Figure(figsize=(4.6 * ncols, 3.4 * nrows), dpi=100)
    colors = arm_colors(arm_names(runs, reference_arm))
    done = [r for r in runs if r.complete]
    legend_done = False
    for k, metric in enumerate(metrics):
        ax = fig.add_subplot(nrows, ncols, k + 1)
        for arm in arm_names(done, reference_arm):
            c = learning_curve([r for r in done if r.arm == arm], metric)
            if c is None:
                continue
            ax.plot(c.steps, c.mean, color=colors[arm], label=f"{arm} (n={c.n_seeds})")
            ok = np.isfinite(c.sem)
            ax.fill_between(c.steps, c.mean - np.where(ok, c.sem, 0), c.mean + np.where(ok, c.sem, 0),
                            color=colors[arm], alpha=0.2, linewidth=0)
        ax.set_title(metric, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.has_data():
            if not legend_done:  # arms share colours across panels: one legend suffices
                ax.legend(fontsize=7)
                legend_done = True
        else:
            ax.text(0.5, 0.5, "no data", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def _series(run: Run, metric: str) -> dict[int, float]:
    """step -> value of ``metric`` in the run's metrics rows (rows lacking it skipped)."""
    out = {}
    for row in run.metrics:
        v, st = row.get(metric), row.get("step")
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and isinstance(st, int):
            out[st] = float(v)
    return out


def _nan0(x: float) -> float:
    return 0.0 if not math.isfinite(x) else x
