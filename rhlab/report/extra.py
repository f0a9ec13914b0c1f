"""Extra report tables, picked by name: `rhlab report --table NAME` and a sweep file's
`report.tables: [NAME]`. Each takes the run directories (or folders holding them), the reference
arm (None: the table's default) and the report's output folder, and returns the table's text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable


def projection(runs: list[str | Path], reference: str | None, out: Path) -> str:
    """The projection experiment's preregistered headline (rhlab/report/projection_headline.py)."""
    from .projection_headline import headline

    return headline(runs, reference or "vanilla")


def overopt(runs: list[str | Path], reference: str | None, out: Path) -> str:
    """Proxy vs gold over-optimisation by arm; the per-run fits and plot go to OUT/overopt."""
    from rhlab.rm.overopt import arm_overopt_table, overopt_report

    from .runs import load_runs

    dirs = [r.path for r in load_runs(runs) if r.complete]
    overopt_report(dirs, out / "overopt")
    return arm_overopt_table(dirs) + f"\n(fits and plot: {out / 'overopt'})"


def routing(runs: list[str | Path], reference: str | None, out: Path) -> str:
    """The gradient-routing table: each arm under each adapter mode (rhlab/report/routing_table.py)."""
    from .routing_table import routing_table

    return routing_table(runs)


TABLES: dict[str, Callable[[list[str | Path], str | None, Path], str]] = {
    "projection": projection, "overopt": overopt, "routing": routing}


def check_table(name: str) -> str:
    """A table name as given, or a one-line ValueError listing the registered ones."""
    if name not in TABLES:
        raise ValueError(f"unknown report table {name!r}; allowed: {', '.join(TABLES)}")
    return name
