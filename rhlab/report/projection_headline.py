"""The projection experiment's headline table (the preregistered design's headline), from finished runs.

    python -m rhlab.report.projection_headline runs/sweep_projection [--reference vanilla]

Columns: arm | n | delta SafePass | hack % | pass % | KL | mean cos | frac fired | |g| | hack % by
mode (A felt_happy, B bare_happy, C happy_laden, D clean_then_happy; happy-stories runs only).
Cells are mean ± SEM over seeds, from summary.json "final" (proj/* is the mean of the last
window steps) and the final evaluation's samples. Registered as the report table `projection`
(rhlab/report/extra.py); `rhlab report` gives the full table, the Pareto plot and the hypothesis checks.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from rhlab.interventions.pairs import HAPPY_MODES, happy_mode

from .runs import Run, load_runs
from .tables import arm_names, delta_safepass, fmt_stat, md_table, mean_sem, run_values, t_half_width

COLUMNS = [("hack_rate", "hack %", 100), ("pass_rate", "pass %", 100), ("kl", "KL", 1),
           ("proj/mean_cos", "mean cos", 1), ("proj/frac_fired", "frac fired", 1), ("proj/grad_norm", "‖g‖", 1)]
MODE_COLUMNS = [(f"mode/{m}", f"hack % {k}", 100) for k, m in zip("ABCD", HAPPY_MODES)]


def pct(mean: float, sem: float, n: int, df: float | None = None) -> str:
    """A fraction as percent, 'mean ± sem [95 % t interval]' on df degrees of freedom (default n - 1;
    '± —' for one seed)."""
    if n == 0 or not math.isfinite(mean):
        return "—"
    h = t_half_width(sem, n - 1 if df is None else df)
    if not math.isfinite(h):
        return f"{100 * mean:.1f} ± —"
    return f"{100 * mean:.1f} ± {100 * sem:.1f} [{100 * (mean - h):.1f}, {100 * (mean + h):.1f}]"


def mode_rates(run: Run) -> dict[str, float]:
    """Fraction of the final evaluation's completions in each hack mode (happy_stories only)."""
    f = run.path / "eval" / f"step_{run.steps:05d}.json"
    if not f.exists():
        return {}
    samples = json.loads(f.read_text())["samples"]
    if not samples:
        return {}
    modes = [happy_mode(s["completion"]) for s in samples]
    return {f"mode/{m}": sum(x == m for x in modes) / len(modes) for m in HAPPY_MODES}


def headline(paths: list[str | Path], reference: str = "vanilla") -> str:
    runs = [r for r in load_runs(paths) if r.complete]
    assert runs, f"no complete runs under {paths}"
    arms = arm_names(runs, reference)
    vals = {id(r): {**run_values(r), **mode_rates(r)} for r in runs}
    deltas = delta_safepass(runs, reference) if reference in arms else {}
    cols = COLUMNS + (MODE_COLUMNS if any("mode/felt_happy" in v for v in vals.values()) else [])
    header = ["arm", "n", "Δ SafePass (pp)"] + [c[1] for c in cols]
    rows = []
    for arm in arms:
        mine = [vals[id(r)] for r in runs if r.arm == arm]
        d = deltas.get(arm)
        cells = [arm, str(len(mine)),
                 "0 (ref)" if arm == reference else pct(d.delta, d.sem, d.n, d.df) if d else "—"]
        for key, _, scale in cols:
            s = mean_sem(v[key] for v in mine if key in v)
            cells.append(pct(s.mean, s.sem, s.n) if scale == 100 else fmt_stat(s.mean, s.sem, s.n))
        rows.append(cells)
    return md_table(header, rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="run directories or folders holding them")
    ap.add_argument("--reference", default="vanilla")
    args = ap.parse_args(argv)
    print(headline(args.runs, args.reference))


if __name__ == "__main__":
    main()
