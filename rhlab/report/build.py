"""``build_report``: run dirs in, report.md / report.html / PNGs / results.json out."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterable

from .html import ReportContent, SampleSet, render_html, render_markdown
from .hypotheses import evaluate, load_hypotheses, validate
from .plots import plot_curves, plot_pareto
from .runs import DEFAULT_ARM, ReportError, Run, last_step_samples, load_runs
from .tables import arm_names, arm_table, delta_safepass, format_table, metric_names

SAMPLES_PER_ARM = 3
TERMINAL_METRICS = ("pass_rate", "hack_rate", "safe_pass", "task_score", "reward_mean", "kl",
                    "retain_only/hack_rate", "retain_only/task_score")


def build_report(
    run_dirs: Iterable[str | os.PathLike],
    out_dir: str | os.PathLike,
    reference_arm: str | None = None,
    hypotheses_path: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Write report.md, report.html, pareto.png, curves.png and results.json to ``out_dir``.

    ``run_dirs`` are run dirs or parents of run dirs. ``reference_arm`` defaults
    to "vanilla" when that arm exists (otherwise no delta SafePass table).
    Returns the results.json contents plus ``table_text`` (format_table output).
    Raises ReportError on malformed files or unknown arm/metric names.
    """
    runs = load_runs(run_dirs)
    arms = arm_names(runs)
    if reference_arm is None and DEFAULT_ARM in arms:
        reference_arm = DEFAULT_ARM
    elif reference_arm is not None and reference_arm not in arms:
        raise ReportError(f"unknown reference arm {reference_arm!r}; allowed: {', '.join(arms)}")

    # Validate hypotheses before any work or output.
    hyps = load_hypotheses(hypotheses_path) if hypotheses_path is not None else None
    metrics = metric_names(runs)
    if hyps is not None:
        validate(hyps, arms, metrics)

    table = arm_table(runs, metrics, reference_arm)
    deltas = delta_safepass(runs, reference_arm) if reference_arm else None
    hyp_results = evaluate(hyps, table) if hyps is not None else None

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "pareto": plot_pareto(runs, out / "pareto.png", reference_arm),
        "curves": plot_curves(runs, out / "curves.png", reference_arm),
    }
    content = ReportContent(
        runs=runs, table=table, metrics=metrics, reference_arm=reference_arm, deltas=deltas,
        hypotheses=hyp_results, samples=pick_samples(runs, list(table)),
        images={"Hack rate vs pass rate": "pareto.png", "Learning curves (mean ± SEM over seeds)": "curves.png"},
    )
    files["markdown"] = out / "report.md"
    files["markdown"].write_text(render_markdown(content), encoding="utf-8")
    pngs = {p.name: p.read_bytes() for p in (files["pareto"], files["curves"])}
    files["html"] = out / "report.html"
    files["html"].write_text(render_html(content, pngs), encoding="utf-8")

    results = {
        "reference_arm": reference_arm,
        "arms": list(table),
        "metrics": metrics,
        "runs": [_run_json(r) for r in runs],
        "table": {a: {m: asdict(s) for m, s in row.items()} for a, row in table.items()},
        "delta_safepass": {a: asdict(d) for a, d in deltas.items()} if deltas is not None else None,
        "hypotheses": [h.to_dict() for h in hyp_results] if hyp_results is not None else None,
        "files": {k: str(v) for k, v in files.items()} | {"results": str(out / "results.json")},
    }
    results = _nan_to_none(results)
    (out / "results.json").write_text(json.dumps(results, indent=2, allow_nan=False), encoding="utf-8")
    # the terminal table keeps the headline metrics; every metric is in report.md / results.json
    headline = [m for m in TERMINAL_METRICS if m in metrics] or metrics
    results["table_text"] = format_table(table, deltas, headline, reference_arm)
    return results


def pick_samples(runs: list[Run], arms: list[str], k: int = SAMPLES_PER_ARM) -> dict[str, SampleSet]:
    """Per arm, up to ``k`` samples from the last logged step of its lowest-seed complete run."""
    out = {}
    for arm in arms:
        cands = sorted((r for r in runs if r.complete and r.arm == arm),
                       key=lambda r: (r.seed is None, r.seed or 0, r.run_name))
        for r in cands:
            step, samples = last_step_samples(r, k)
            if samples:
                out[arm] = SampleSet(r.run_name, r.seed, step, samples)
                break
    return out


def _run_json(r: Run) -> dict[str, Any]:
    return {"run_name": r.run_name, "arm": r.arm, "seed": r.seed, "status": r.status, "steps": r.steps,
            "path": str(r.path), "included": r.complete, "note": r.note, "final": r.final}


def _nan_to_none(x: Any) -> Any:
    """Strict JSON: nan/inf become null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_nan_to_none(v) for v in x]
    return x
