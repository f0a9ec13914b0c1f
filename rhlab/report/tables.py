"""Per-arm statistics over seeds: mean ± SEM and a 95 % interval per final metric, and delta SafePass.

SEM = std(ddof=1) / sqrt(n); with n = 1 the SEM is nan (shown as '—'). The 95 % interval of a mean is
Student's t, mean ± t_{0.975, n-1} x SEM. SafePass = pass_rate - hack_rate per run; delta SafePass of an
arm is mean SafePass(arm) - mean SafePass(reference) with SEM sqrt(sem_a² + sem_ref²) and a Welch t
interval (Welch-Satterthwaite degrees of freedom). Only complete runs count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np
from scipy import stats as sps

from .runs import Run, ReportError

SAFE_PASS = "safe_pass"
# Metrics listed first (in this order) when present; the rest follow sorted.
PREFERRED_METRICS = ["pass_rate", "hack_rate", SAFE_PASS, "task_score", "reward_mean", "kl", "distinct_2"]

@dataclass(frozen=True)
class Stat:
    mean: float
    sem: float
    n: int

    @property
    def half_width(self) -> float:
        """Half-width of the 95 % Student-t interval of the mean (nan below 2 values)."""
        return t_half_width(self.sem, self.n - 1)


ArmTable = dict[str, dict[str, Stat]]  # arm -> metric -> Stat


@dataclass(frozen=True)
class Delta:
    """delta SafePass of one arm against the reference arm."""

    delta: float
    sem: float
    n: int
    n_ref: int
    df: float = math.nan  # Welch-Satterthwaite degrees of freedom of the difference


def t_half_width(sem: float, df: float) -> float:
    """t_{0.975, df} x sem: half-width of a two-sided 95 % t interval; nan when undefined."""
    if not (df >= 1 and math.isfinite(sem)):
        return math.nan
    return float(sps.t.ppf(0.975, df)) * sem


def welch(a: Stat, b: Stat) -> tuple[float, float, float]:
    """(a.mean - b.mean, its SEM, Welch-Satterthwaite df) of two independent means."""
    va, vb = a.sem**2, b.sem**2
    se = math.sqrt(va + vb)
    if a.n < 2 or b.n < 2 or not math.isfinite(se):
        return a.mean - b.mean, se, math.nan
    den = (va**2 / (a.n - 1) if va else 0.0) + (vb**2 / (b.n - 1) if vb else 0.0)
    df = (va + vb) ** 2 / den if den > 0 else float(a.n + b.n - 2)  # both SEMs 0: the pooled df
    return a.mean - b.mean, se, df


def mean_sem(values: Iterable[float]) -> Stat:
    """Mean and SEM (ddof=1) of the finite values; nan where undefined."""
    x = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    n = len(x)
    mean = float(x.mean()) if n else math.nan
    sem = float(x.std(ddof=1) / math.sqrt(n)) if n >= 2 else math.nan
    return Stat(mean, sem, n)


def run_values(run: Run) -> dict[str, float]:
    """A run's final metrics plus the derived safe_pass."""
    vals = dict(run.final)
    if "pass_rate" in vals and "hack_rate" in vals:
        vals[SAFE_PASS] = vals["pass_rate"] - vals["hack_rate"]
    return vals


def arm_names(runs: list[Run], reference_arm: str | None = None) -> list[str]:
    """All arms in the runs, sorted, the reference arm first."""
    arms = sorted({r.arm for r in runs})
    if reference_arm in arms:
        arms.remove(reference_arm)
        arms.insert(0, reference_arm)
    return arms


def metric_names(runs: list[Run]) -> list[str]:
    """Metrics present in any complete run's final values, preferred ones first."""
    seen = {m for r in runs if r.complete for m in run_values(r)}
    return [m for m in PREFERRED_METRICS if m in seen] + sorted(seen - set(PREFERRED_METRICS))


def arm_table(runs: list[Run], metrics: list[str] | None = None, reference_arm: str | None = None) -> ArmTable:
    """arm -> metric -> Stat over the complete runs (seeds) of each arm."""
    metrics = metric_names(runs) if metrics is None else metrics
    table: ArmTable = {}
    for arm in arm_names(runs, reference_arm):
        vals = [run_values(r) for r in runs if r.complete and r.arm == arm]
        table[arm] = {m: mean_sem(v[m] for v in vals if m in v) for m in metrics}
    return table


def delta_safepass(runs: list[Run], reference_arm: str) -> dict[str, Delta]:
    """arm -> delta SafePass against ``reference_arm`` (the reference itself omitted)."""
    arms = arm_names(runs, reference_arm)
    if reference_arm not in arms:
        raise ReportError(f"unknown reference arm {reference_arm!r}; allowed: {', '.join(arms)}")
    table = arm_table(runs, [SAFE_PASS], reference_arm)
    ref = table[reference_arm][SAFE_PASS]
    out: dict[str, Delta] = {}
    for arm in arms[1:]:
        s = table[arm][SAFE_PASS]
        d, se, df = welch(s, ref)
        out[arm] = Delta(d, se, s.n, ref.n, df)
    return out


def md_cell(c) -> str:
    return str(c).replace("|", "\\|").replace("\n", " ")


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table (cells with "|" escaped)."""
    lines = ["| " + " | ".join(map(md_cell, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(md_cell, r)) + " |" for r in rows]
    return "\n".join(lines)


def fmt_num(x: float) -> str:
    """Compact number: 3 decimals, or 3 significant digits for tiny/huge values."""
    if x is None or not math.isfinite(x):
        return "—"
    if abs(x) < 1e-12:  # float noise, e.g. the SEM of identical values
        x = 0.0
    if x != 0 and (abs(x) < 0.01 or abs(x) >= 1000):
        return f"{x:.3g}"
    return f"{x:.3f}"


def fmt_stat(mean: float, sem: float, n: int | None = None, df: float | None = None) -> str:
    """'mean ± sem [lo, hi]' with the 95 % t interval on df degrees of freedom (default n - 1); without n
    or df just 'mean ± sem'; '—' for an undefined mean (n = 0)."""
    if n == 0 or not math.isfinite(mean):
        return "—"
    text = f"{fmt_num(mean)} ± {fmt_num(sem)}"
    df = (n - 1 if n is not None else math.nan) if df is None else df
    h = t_half_width(sem, df)
    return f"{text} [{fmt_num(mean - h)}, {fmt_num(mean + h)}]" if math.isfinite(h) else text


def table_rows(
    table: ArmTable, deltas: dict[str, Delta] | None = None, metrics: list[str] | None = None,
    reference_arm: str | None = None,
) -> tuple[list[str], list[list[str]]]:
    """Header and string rows of the arm table (shared by terminal, Markdown, HTML)."""
    arms = list(table)
    metrics = metrics if metrics is not None else (list(table[arms[0]]) if arms else [])
    header = ["arm", "n"] + metrics + (["Δ SafePass"] if deltas is not None else [])
    rows = []
    for arm in arms:
        stats = table[arm]
        n = max((s.n for s in stats.values()), default=0)
        row = [arm, str(n)] + [fmt_stat(stats[m].mean, stats[m].sem, stats[m].n) for m in metrics]
        if deltas is not None:
            d = deltas.get(arm)
            row.append("(reference)" if arm == reference_arm else fmt_stat(d.delta, d.sem, d.n, d.df) if d else "—")
        rows.append(row)
    return header, rows


def format_table(
    table: ArmTable, deltas: dict[str, Delta] | None = None, metrics: list[str] | None = None,
    reference_arm: str | None = None,
) -> str:
    """The arm table as aligned plain text for the terminal.

    ``n`` is the number of complete seeds; each cell is mean ± SEM over seeds.
    """
    header, rows = table_rows(table, deltas, metrics, reference_arm)
    if not rows:
        return "(no runs)"
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]

    def line(cells: list[str]) -> str:  # arm name left-aligned, numbers right-aligned
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    out = [line(header), "  ".join("-" * w for w in widths)] + [line(r) for r in rows]
    return "\n".join(s.rstrip() for s in out)
