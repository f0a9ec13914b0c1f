"""Preregistered hypothesis checks.

A YAML file lists claims comparing an arm with a reference arm::

    hypotheses:
      - name: projection_lowers_hacking
        claim: "projected lowers hack rate by >= 30 points vs vanilla"
        arm: projected
        reference: vanilla
        checks:
          - {metric: hack_rate, op: "<=", delta: -0.30}   # arm mean - ref mean <= -0.30
          - {metric: pass_rate, op: "abs<=", delta: 0.10} # |arm mean - ref mean| <= 0.10

Each check computes d = mean(arm) - mean(reference) over complete seeds, with
se = sqrt(sem_arm² + sem_ref²), and the statistic s = d (ops "<=", ">=") or
s = |d| (ops "abs<=", "abs>="). A check is

* inconclusive if either arm has fewer than MIN_SEEDS (2) complete seeds with
  the metric (no SEM), or if |s - delta| <= MARGIN_SEMS (1) * se, i.e. the
  threshold lies within one combined SEM of the observed difference, on
  either side;
* otherwise supported if s satisfies the op against delta, else falsified.

A hypothesis is falsified if any check is falsified, supported if all checks
are supported, and inconclusive otherwise.
"""

from __future__ import annotations

import math
import operator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rhlab.config import ConfigError, load_yaml_file

from .runs import ReportError
from .tables import SAFE_PASS, ArmTable

MIN_SEEDS = 2
MARGIN_SEMS = 1.0
OPS = {"<=": operator.le, ">=": operator.ge, "abs<=": operator.le, "abs>=": operator.ge}
# Always accepted metric names (even before any run completed), besides those in the table.
KNOWN_METRICS = ["reward_mean", "task_score", "pass_rate", "hack_rate", "kl", "distinct_2", SAFE_PASS]

SUPPORTED, FALSIFIED, INCONCLUSIVE = "supported", "falsified", "inconclusive"


@dataclass
class Check:
    metric: str
    op: str
    delta: float


@dataclass
class Hypothesis:
    name: str
    claim: str
    arm: str
    reference: str
    checks: list[Check]


@dataclass
class CheckResult:
    metric: str
    op: str
    delta: float  # the threshold
    arm_mean: float
    ref_mean: float
    diff: float  # arm mean - reference mean
    se: float  # combined SEM of diff
    n_arm: int
    n_ref: int
    verdict: str
    reason: str


@dataclass
class HypothesisResult:
    name: str
    claim: str
    arm: str
    reference: str
    verdict: str
    checks: list[CheckResult] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_hypotheses(path: str | Path) -> list[Hypothesis]:
    """Parse the hypotheses YAML; structural problems raise ReportError naming the file."""
    path = Path(path)
    try:
        data = load_yaml_file(path, "hypotheses file")
    except (OSError, ConfigError) as e:
        raise ReportError(str(e)) from None
    items = data.get("hypotheses") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ReportError(f"{path}: expected a top-level 'hypotheses:' list")
    return [_parse_hypothesis(h, i, path) for i, h in enumerate(items)]


def _parse_hypothesis(h: Any, i: int, path: Path) -> Hypothesis:
    where = f"{path}: hypothesis #{i + 1}"
    if not isinstance(h, dict):
        raise ReportError(f"{where}: expected a mapping")
    missing = [k for k in ("name", "arm", "reference", "checks") if k not in h]
    if missing:
        raise ReportError(f"{where}: missing key(s) {', '.join(missing)}")
    where = f"{path}: hypothesis {h['name']!r}"
    if not isinstance(h["checks"], list) or not h["checks"]:
        raise ReportError(f"{where}: 'checks' must be a non-empty list")
    checks = []
    for c in h["checks"]:
        if not isinstance(c, dict) or not {"metric", "op", "delta"} <= set(c):
            raise ReportError(f"{where}: each check needs metric, op and delta, got {c!r}")
        if c["op"] not in OPS:
            raise ReportError(f"{where}: unknown op {c['op']!r}; allowed: {', '.join(OPS)}")
        if not isinstance(c["delta"], (int, float)) or isinstance(c["delta"], bool):
            raise ReportError(f"{where}: delta must be a number, got {c['delta']!r}")
        checks.append(Check(str(c["metric"]), str(c["op"]), float(c["delta"])))
    return Hypothesis(str(h["name"]), str(h.get("claim", "")), str(h["arm"]), str(h["reference"]), checks)


def validate(hyps: list[Hypothesis], arms: list[str], metrics: list[str]) -> None:
    """Raise ReportError naming unknown arms/metrics and the allowed values."""
    allowed_m = list(dict.fromkeys(metrics + KNOWN_METRICS))
    errors = []
    for h in hyps:
        for a in (h.arm, h.reference):
            if a not in arms:
                errors.append(f"hypothesis {h.name!r}: unknown arm {a!r}; allowed: {', '.join(arms) or '(none)'}")
        for c in h.checks:
            if c.metric not in allowed_m:
                errors.append(f"hypothesis {h.name!r}: unknown metric {c.metric!r}; allowed: {', '.join(allowed_m)}")
    if errors:
        raise ReportError("\n".join(errors))


def evaluate_check(check: Check, table: ArmTable, arm: str, reference: str) -> CheckResult:
    """Apply the rule in the module docstring to one check."""
    nan = math.nan
    a, r = table.get(arm, {}).get(check.metric), table.get(reference, {}).get(check.metric)
    am, an, asem = (a.mean, a.n, a.sem) if a else (nan, 0, nan)
    rm, rn, rsem = (r.mean, r.n, r.sem) if r else (nan, 0, nan)
    diff = am - rm
    se = math.sqrt(asem**2 + rsem**2)
    stat = abs(diff) if check.op.startswith("abs") else diff
    res = CheckResult(check.metric, check.op, check.delta, am, rm, diff, se, an, rn, INCONCLUSIVE, "")
    if min(an, rn) < MIN_SEEDS:
        res.reason = f"fewer than {MIN_SEEDS} seeds (n={an} for {arm}, n={rn} for {reference})"
    elif not math.isfinite(stat) or not math.isfinite(se):
        res.reason = "difference or SEM undefined"
    elif abs(stat - check.delta) <= MARGIN_SEMS * se:
        res.reason = f"threshold within {MARGIN_SEMS:g} SEM of the difference (|{stat:.3f} - {check.delta:g}| <= {se:.3f})"
    else:
        holds = OPS[check.op](stat, check.delta)
        res.verdict = SUPPORTED if holds else FALSIFIED
        lhs = "|diff|" if check.op.startswith("abs") else "diff"
        bare_op = check.op.removeprefix("abs")
        res.reason = f"{lhs} = {stat:.3f} {'' if holds else 'not '}{bare_op} {check.delta:g} (se {se:.3f})"
    return res


def evaluate(hyps: list[Hypothesis], table: ArmTable) -> list[HypothesisResult]:
    """Evaluate every hypothesis against the arm table (arm -> metric -> Stat)."""
    out = []
    for h in hyps:
        checks = [evaluate_check(c, table, h.arm, h.reference) for c in h.checks]
        verdicts = {c.verdict for c in checks}
        verdict = FALSIFIED if FALSIFIED in verdicts else SUPPORTED if verdicts == {SUPPORTED} else INCONCLUSIVE
        out.append(HypothesisResult(h.name, h.claim, h.arm, h.reference, verdict, checks))
    return out
