"""The gradient-routing table (docs/routing.md), from finished runs:

    python -m rhlab.report.routing_table runs/sweep_routing

Rows: the initial policy, then each arm under each adapter mode its evaluations hold (both,
retain_only, forget_only); cells are mean ± SEM [95 % t interval] over seeds of the final evaluation. Registered as
the report table `routing` (rhlab/report/extra.py).
"""

from __future__ import annotations

from rhlab.interventions.routing import EVAL_MODES

from .runs import load_runs
from .tables import fmt_stat, md_table, mean_sem

TABLE_METRICS = ("hack_rate", "task_score", "pass_rate", "reward_mean", "distinct_2", "kl")


def routing_table(paths, metrics: list[str] | None = None) -> str:
    """Mean ± SEM over seeds of the final evaluation, by arm and adapter mode (arms without modes,
    e.g. the LoRA baseline, show their plain evaluation as `both`), plus the initial policy; with
    env.eval_rewards, one column per evaluated reward part (the decomposition). `metrics` picks the columns."""
    runs = [r for r in load_runs(paths) if r.complete]
    assert runs, f"no complete runs under {paths}"
    parts = sorted({k for r in runs for k in r.final if k.startswith("eval_reward/")})
    known = (*TABLE_METRICS, *parts)
    unknown = [m for m in metrics or [] if m not in known]
    assert not unknown, f"routing table: unknown metric {unknown[0]!r}; allowed: {', '.join(known)}"
    metrics = tuple(metrics or known)
    initial = [{k: r.initial.get(k) for k in metrics} for r in runs]
    rows = [("initial", "-", initial)]
    for arm in sorted({r.arm for r in runs}):
        finals = [r.final for r in runs if r.arm == arm]
        for mode in EVAL_MODES:
            vals = [v for f in finals if (v := _mode_values(f, mode, metrics)) is not None]
            if vals:
                rows.append((arm, mode, vals))
    out = []
    for arm, mode, vals in rows:
        stats = [mean_sem(v[m] for v in vals) for m in metrics]
        out.append([arm, mode, str(len(vals))] + [fmt_stat(s.mean, s.sem, s.n) for s in stats])
    return md_table(["arm", "mode", "n", *metrics], out)


def _mode_values(final: dict, mode: str, metrics) -> dict | None:
    if "both/hack_rate" not in final:  # an arm without adapter modes: its plain evaluation is `both`
        return {k: final.get(k) for k in metrics} if mode == "both" else None
    return {k: final.get(f"{mode}/{k}") for k in metrics}


if __name__ == "__main__":
    import sys

    assert len(sys.argv) > 1, "usage: python -m rhlab.report.routing_table RUN_DIR_OR_FOLDER..."
    print(routing_table(sys.argv[1:]))
