"""Reports over training runs: tables (mean ± SEM by arm, delta SafePass), plots
(hack-vs-pass Pareto, learning curves), preregistered hypothesis checks, and a
Markdown + self-contained HTML page. Entry point: :func:`build_report`."""

from .build import build_report
from .hypotheses import evaluate, load_hypotheses
from .plots import pareto_frontier
from .runs import ReportError, Run, discover_run_dirs, load_run, load_runs
from .tables import Delta, Stat, arm_table, delta_safepass, format_table, mean_sem

__all__ = [
    "build_report", "format_table", "ReportError", "Run", "Stat", "Delta",
    "discover_run_dirs", "load_run", "load_runs", "arm_table", "delta_safepass", "mean_sem",
    "pareto_frontier", "load_hypotheses", "evaluate",
]
