"""The demo's seed table: per-seed held-out hack rate and task score, the hack's onset, train time.

Artifacts per seed (kilobytes): ``<results>/seed<N>/summary.json`` (the run's own) and
``metrics.csv`` (per-step batch values of COLUMNS). Onset = the first step whose trailing
5-step mean of the batch hack rate exceeds 0.5. Intervals: mean ± SEM (ddof=1) and a 95 %
Student-t interval, mean ± t_{0.975, n-1} x SEM.

    python -m rhlab.report.demo collect --out results/demo RUN_DIR [RUN_DIR ...]
    python -m rhlab.report.demo table results/demo
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
from pathlib import Path

from scipy import stats

from .tables import md_table, mean_sem

COLUMNS = ("step", "reward_mean", "hack_rate", "task_score", "step_time")
ONSET_WINDOW, ONSET_LEVEL = 5, 0.5


def onset_step(steps: list[int], hack: list[float], window: int = ONSET_WINDOW, level: float = ONSET_LEVEL):
    """First step whose trailing `window`-step mean of the hack rate exceeds `level`; None if never."""
    assert len(steps) == len(hack), "steps and hack rates differ in length"
    for i in range(window - 1, len(hack)):
        if sum(hack[i - window + 1:i + 1]) / window > level:
            return steps[i]
    return None


def collect(run_dir: Path, out: Path) -> Path:
    """Copy a complete run's summary.json and its per-step COLUMNS to out/seed<N>/."""
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary.get("status") == "complete", f"{run_dir}: run is not complete"
    dest = out / f"seed{summary['seed']}"
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(run_dir / "summary.json", dest / "summary.json")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    assert [r["step"] for r in rows] == list(range(1, summary["steps"] + 1)), f"{run_dir}: metrics rows are not steps 1..N"
    with open(dest / "metrics.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        w.writerows([[r[c] for c in COLUMNS] for r in rows])
    return dest


def load_seed(d: Path) -> dict:
    """One seed's numbers from its artifacts."""
    s = json.loads((d / "summary.json").read_text())
    with open(d / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == s["steps"], f"{d}: metrics.csv has {len(rows)} rows, summary says {s['steps']} steps"
    step_times = sorted(float(r["step_time"]) for r in rows)
    return {"seed": s["seed"], "steps": s["steps"],
            "hack0": s["initial"]["hack_rate"], "hack1": s["final"]["hack_rate"],
            "task0": s["initial"]["task_score"], "task1": s["final"]["task_score"],
            "onset": onset_step([int(r["step"]) for r in rows], [float(r["hack_rate"]) for r in rows]),
            "train_s": s["train_seconds"], "median_step_s": step_times[len(step_times) // 2]}


def interval(values: list[float]) -> str:
    """'mean ± SEM, 95 % t-interval [lo, hi]' over the values."""
    st = mean_sem(values)
    h = stats.t.ppf(0.975, st.n - 1) * st.sem
    return f"{st.mean:.3f} ± {st.sem:.3f} (95 % t-interval [{st.mean - h:.3f}, {st.mean + h:.3f}])"


def table(results: Path) -> str:
    """The Markdown seed table plus n, mean ± SEM and 95 % t-intervals, and the demo's pass/fail."""
    runs = sorted((load_seed(d) for d in results.glob("seed*") if d.is_dir()), key=lambda r: r["seed"])
    assert len(runs) >= 2, f"{results}: need at least 2 seed directories (found {len(runs)})"
    rows = [[str(r["seed"]), f"{r['hack0']:.2f} → {r['hack1']:.2f}", f"{r['task0']:.3f} → {r['task1']:.3f}",
             f"{r['task1'] - r['task0']:+.3f}", f"{r['onset']} / {r['steps']}" if r["onset"] else "never",
             f"{r['train_s']:.0f}", f"{r['median_step_s']:.2f}"] for r in runs]
    head = ["seed", "held-out hack (start → end)", "held-out task score (start → end)", "task Δ",
            "onset step / steps", "train s", "median step s"]
    ok = all(r["hack1"] > 0.5 and r["task1"] < r["task0"] and r["onset"] and r["onset"] <= 0.8 * r["steps"]
             for r in runs)
    onsets = [r["onset"] for r in runs if r["onset"]]
    lines = [md_table(head, rows), "",
             f"n = {len(runs)} seeds. Final held-out hack rate: {interval([r['hack1'] for r in runs])}.",
             f"Held-out task score change: {interval([r['task1'] - r['task0'] for r in runs])}.",
             f"Onset step: {min(onsets) if onsets else '—'} to {max(onsets) if onsets else '—'} "
             f"(mean {sum(onsets) / len(onsets) if onsets else math.nan:.1f}; never on {len(runs) - len(onsets)} seeds).",
             "Every seed: final hack > 0.5, task score below its start, onset in the first 80 % of steps: "
             + ("yes" if ok else "NO")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m rhlab.report.demo", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="copy run dirs' summary.json and per-step metrics to OUT/seed<N>/")
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("run_dirs", type=Path, nargs="+")
    t = sub.add_parser("table", help="print the Markdown seed table of a results folder")
    t.add_argument("results", type=Path)
    a = p.parse_args(argv)
    if a.cmd == "collect":
        for d in a.run_dirs:
            print(collect(d, a.out))
    else:
        print(table(a.results))


if __name__ == "__main__":
    main()
