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

A check may name a ``reference_metric`` read on the reference arm instead of ``metric`` (e.g. a routing
arm's ``retain_only/hack_rate`` against a baseline's plain ``hack_rate``).

Each check computes d = mean(arm) - mean(reference) over complete seeds, its SEM
se = sqrt(sem_arm² + sem_ref²) and its 95 % Welch t interval [lo, hi] = d ± t_{0.975, df} x se
(Welch-Satterthwaite df). The verdict is decided on the interval, not on the point estimate:

* "<=" delta: supported if hi <= delta, falsified if lo > delta;
* ">=" delta: supported if lo >= delta, falsified if hi < delta;
* "abs<=" delta: supported if the interval lies inside [-delta, delta], falsified if it lies
  entirely outside it (lo > delta or hi < -delta);
* "abs>=" delta: supported if the interval lies outside (-delta, delta), falsified if inside it;
* inconclusive otherwise (the interval straddles a threshold), or if either arm has fewer than
  MIN_SEEDS (2) complete seeds with the metric (no interval).

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
from .tables import SAFE_PASS, ArmTable, Stat, t_half_width, welch

MIN_SEEDS = 2
OPS = {"<=": operator.le, ">=": operator.ge, "abs<=": operator.le, "abs>=": operator.ge}
# Always accepted metric names (even before any run completed), besides those in the table.
KNOWN_METRICS = ["reward_mean", "task_score", "pass_rate", "hack_rate", "kl", "distinct_2", SAFE_PASS]

SUPPORTED, FALSIFIED, INCONCLUSIVE = "supported", "falsified", "inconclusive"


@dataclass
class Check:
    metric: str
    op: str
    delta: float
    reference_metric: str | None = None  # the reference arm's metric when it differs (default: metric)

    @property
    def ref_metric(self) -> str:
        return self.reference_metric or self.metric


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
    lo: float  # 95 % Welch t interval of diff
    hi: float
    n_arm: int
    n_ref: int
    verdict: str
    reason: str
    ref_metric: str = ""  # the reference arm's metric (= metric unless the check names another)


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
        if not isinstance(c, dict) or not {"metric", "op", "delta"} <= set(c) \
                or not set(c) <= {"metric", "op", "delta", "reference_metric"}:
            raise ReportError(f"{where}: each check needs metric, op and delta (and may name a "
                              f"reference_metric), got {c!r}")
        if c["op"] not in OPS:
            raise ReportError(f"{where}: unknown op {c['op']!r}; allowed: {', '.join(OPS)}")
        if not isinstance(c["delta"], (int, float)) or isinstance(c["delta"], bool):
            raise ReportError(f"{where}: delta must be a number, got {c['delta']!r}")
        ref = c.get("reference_metric")
        checks.append(Check(str(c["metric"]), str(c["op"]), float(c["delta"]), None if ref is None else str(ref)))
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
            for m in dict.fromkeys((c.metric, c.ref_metric)):
                if m not in allowed_m:
                    errors.append(f"hypothesis {h.name!r}: unknown metric {m!r}; allowed: {', '.join(allowed_m)}")
    if errors:
        raise ReportError("\n".join(errors))


def _decide(op: str, delta: float, lo: float, hi: float) -> str:
    """The interval rule of the module docstring."""
    if op == "<=":
        return SUPPORTED if hi <= delta else FALSIFIED if lo > delta else INCONCLUSIVE
    if op == ">=":
        return SUPPORTED if lo >= delta else FALSIFIED if hi < delta else INCONCLUSIVE
    inside, outside = -delta <= lo and hi <= delta, lo > delta or hi < -delta
    if op == "abs<=":
        return SUPPORTED if inside else FALSIFIED if outside else INCONCLUSIVE
    strictly_inside = -delta < lo and hi < delta  # "abs>="
    return SUPPORTED if (lo >= delta or hi <= -delta) else FALSIFIED if strictly_inside else INCONCLUSIVE


def evaluate_check(check: Check, table: ArmTable, arm: str, reference: str) -> CheckResult:
    """Apply the rule in the module docstring to one check."""
    nan = math.nan
    a = table.get(arm, {}).get(check.metric) or Stat(nan, nan, 0)
    r = table.get(reference, {}).get(check.ref_metric) or Stat(nan, nan, 0)
    diff, se, df = welch(a, r)
    h = t_half_width(se, df)
    res = CheckResult(check.metric, check.op, check.delta, a.mean, r.mean, diff, se, diff - h, diff + h,
                      a.n, r.n, INCONCLUSIVE, "", check.ref_metric)
    if min(a.n, r.n) < MIN_SEEDS:
        res.reason = f"fewer than {MIN_SEEDS} seeds (n={a.n} for {arm}, n={r.n} for {reference})"
    elif not (math.isfinite(diff) and math.isfinite(h)):
        res.reason = "difference or its interval undefined"
    else:
        res.verdict = _decide(check.op, check.delta, res.lo, res.hi)
        res.reason = (f"diff {diff:+.3f}, 95 % interval [{res.lo:.3f}, {res.hi:.3f}] "
                      f"{ {SUPPORTED: 'satisfies', FALSIFIED: 'violates', INCONCLUSIVE: 'straddles'}[res.verdict]} "
                      f"{check.op} {check.delta:g}")
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
