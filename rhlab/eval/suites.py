"""Evaluation suites: named eval sets, the initial vs the trained policy, pass/fail gates.

A suite YAML (configs/suite_rewrite.yaml):

    name: rewrite_gates
    metric: strict          # a Scores.parts name, or reward | task_score | pass_rate | hack_rate
    temperature: null       # null: the run's sampling temperature
    sets:
      - {name: E1 mixed, n_prompts: 48, seed: 1, gate: "delta > 0.05"}
      - {name: E2 three facts, params: {profiles: [name+object+place]}, n_prompts: 24, seed: 2,
         gate: "delta >= 0"}
      - {name: E4 no hacking, metric: hack_rate, n_prompts: 48, seed: 4, gate: "post <= 0.1"}

Each set builds the run's environment with `params` deep-merged over the run's env.params,
takes env.eval_prompts(n_prompts), samples one completion per prompt with rollout seed
`seed` from the baseline (initial) and the post (trained) policy, and averages the metric
(the suite's, or the set's own `metric`: e.g. a hack-rate gate next to the reward gates).
A gate is `<delta|post|baseline> <op> <number>`, op one of > >= < <=.
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from rhlab.components import build_env
from rhlab.config import EnvConfig, RunConfig, load_yaml_file

OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
GATE_SIDES = ("delta", "post", "baseline")
_GATE = re.compile(r"^\s*(delta|post|baseline)\s*(>=|<=|>|<)\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*$")
SUITE_KEYS = {"name", "metric", "temperature", "sets"}
SET_KEYS = {"name", "dataset", "params", "n_prompts", "seed", "gate", "metric"}
SCORE_METRICS = ("reward", "task_score", "pass_rate", "hack_rate", "hack_rate_loose")
EXTRA_KEYS = ("risk_penalty", "risk_compliance", "hack_rate")  # the second table, where logged


@dataclass(frozen=True)
class Gate:
    side: str  # delta | post | baseline
    op: str
    threshold: float

    def check(self, baseline: float, post: float) -> bool:
        value = {"delta": post - baseline, "post": post, "baseline": baseline}[self.side]
        return math.isfinite(value) and OPS[self.op](value, self.threshold)

    def __str__(self) -> str:
        return f"{self.side} {self.op} {self.threshold:+g}"


def parse_gate(text: str) -> Gate:
    m = _GATE.match(str(text))
    if not m:
        raise ValueError(f"gate {text!r}: expected '<side> <op> <number>', side one of {', '.join(GATE_SIDES)}, "
                         f"op one of {', '.join(OPS)} (e.g. 'delta > 0.05')")
    return Gate(m[1], m[2], float(m[3]))


@dataclass
class EvalSet:
    name: str
    n_prompts: int
    seed: int
    gate: Gate
    params: dict = field(default_factory=dict)  # deep-merged over the run's env.params
    dataset: str = ""  # a label for the table
    metric: str | None = None  # None = the suite's metric


@dataclass
class Suite:
    name: str
    sets: list[EvalSet]
    metric: str = "strict"
    temperature: float | None = None


def _check(d, allowed: set, where: str) -> dict:
    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected a mapping (got {type(d).__name__})")
    unknown = set(d) - allowed
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}")
    return d


def parse_suite(data: dict, source: str = "suite") -> Suite:
    _check(data, SUITE_KEYS, source)
    raw_sets = data.get("sets")
    if not isinstance(raw_sets, list) or not raw_sets:
        raise ValueError(f"{source}: sets must be a non-empty list")
    sets = []
    for i, s in enumerate(raw_sets):
        where = f"{source}: sets[{i}]"
        _check(s, SET_KEYS, where)
        missing = {"name", "n_prompts", "gate"} - set(s)
        if missing:
            raise ValueError(f"{where}: missing keys {sorted(missing)}")
        if not (isinstance(s["n_prompts"], int) and s["n_prompts"] > 0):
            raise ValueError(f"{where}.n_prompts: must be an integer > 0 (got {s['n_prompts']!r})")
        if not isinstance(s.get("params", {}), dict):
            raise ValueError(f"{where}.params: expected a mapping of env.params overrides")
        sets.append(EvalSet(str(s["name"]), s["n_prompts"], int(s.get("seed", 0)), parse_gate(s["gate"]),
                            dict(s.get("params") or {}), str(s.get("dataset", "")),
                            None if s.get("metric") is None else str(s["metric"])))
    names = [s.name for s in sets]
    if len(set(names)) != len(names):
        raise ValueError(f"{source}: duplicate set names {names}")
    temp = data.get("temperature")
    if temp is not None and not (isinstance(temp, (int, float)) and temp > 0):
        raise ValueError(f"{source}.temperature: must be null or a number > 0 (got {temp!r})")
    return Suite(str(data.get("name", Path(source).stem)), sets, str(data.get("metric", "strict")), temp)


def load_suite(path: str | Path) -> Suite:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"suite file not found: {path}")
    return parse_suite(load_yaml_file(path, "suite file") or {}, str(path))


# ---- evaluating policies ----------------------------------------------------------------
def deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def set_env_config(env_cfg: EnvConfig, s: EvalSet) -> EnvConfig:
    return EnvConfig.model_validate({**env_cfg.model_dump(), "params": deep_merge(env_cfg.params, s.params)})


def score_means(scores) -> dict[str, float]:
    """Means of every Scores field and part (rates for the boolean ones)."""
    n = len(scores.reward)
    assert n, "no completions scored"
    m = {"reward": sum(scores.reward) / n, "task_score": sum(scores.task_score) / n,
         "pass_rate": sum(scores.passed) / n, "hack_rate": sum(scores.hack) / n,
         "hack_rate_loose": sum(scores.hack_loose) / n}
    return {**m, **{k: sum(v) / n for k, v in scores.parts.items()}}


def evaluate_set(policy, env, s: EvalSet, temperature: float | None = None) -> dict[str, float]:
    """policy: anything with .rollout(prompts, seed, temperature=None) -> (rollouts, texts), e.g. a Trainer."""
    prompts = env.eval_prompts(s.n_prompts)
    _, texts = policy.rollout(prompts, seed=s.seed, temperature=temperature)
    return {**score_means(env.score(prompts, texts)), "rows": float(len(prompts))}


def evaluate_suite(suite: Suite, env_cfg: EnvConfig, policy) -> dict[str, dict[str, float]]:
    """set name -> metric means of one policy."""
    out = {}
    for s in suite.sets:
        m = evaluate_set(policy, build_env(set_env_config(env_cfg, s)), s, suite.temperature)
        metric = s.metric or suite.metric
        if metric not in m:
            raise ValueError(f"suite metric {metric!r} (set {s.name!r}) not reported by env {env_cfg.name!r}; "
                             f"allowed: {', '.join(sorted(m))}")
        out[s.name] = m
    return out


@dataclass
class GateResult:
    name: str
    dataset: str
    rows: int
    metric: str
    baseline: float
    post: float
    delta: float
    gate: str
    passed: bool
    baseline_metrics: dict = field(default_factory=dict)
    post_metrics: dict = field(default_factory=dict)


def gate_results(suite: Suite, baseline: dict[str, dict], post: dict[str, dict]) -> list[GateResult]:
    """Pure: per set, the metric before and after, the delta, and whether the gate holds."""
    out = []
    for s in suite.sets:
        b, p = baseline[s.name], post[s.name]
        metric = s.metric or suite.metric
        bv, pv = b[metric], p[metric]
        out.append(GateResult(s.name, s.dataset, int(p.get("rows", s.n_prompts)), metric, bv, pv, pv - bv,
                              str(s.gate), s.gate.check(bv, pv), b, p))
    return out


def run_suite(suite: Suite, env_cfg: EnvConfig, baseline_policy, post_policy) -> list[GateResult]:
    return gate_results(suite, evaluate_suite(suite, env_cfg, baseline_policy),
                        evaluate_suite(suite, env_cfg, post_policy))


def run_suite_for_run(target: str | Path, suite_path: str | Path) -> list[GateResult]:
    """A run directory (or one of its checkpoints): the baseline is the run's freshly built
    initial policy, the post policy the same model with the checkpoint's weights loaded.
    Writes run_dir/eval/suite_<name>.json."""
    from rhlab.eval.evaluate import resolve_checkpoint
    from rhlab.models.checkpoint import load_weights
    from rhlab.trainer import Trainer
    from rhlab.utils import write_json

    suite = load_suite(suite_path)
    run_dir, ck = resolve_checkpoint(Path(target))
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.exists():
        raise FileNotFoundError(f"{cfg_path} missing")
    cfg = RunConfig.model_validate(yaml.safe_load(cfg_path.read_text()))
    trainer = Trainer(cfg, run_dir, lock=False)  # fresh: the initial policy (a LoRA adapter starts as a no-op)
    baseline = evaluate_suite(suite, cfg.env, trainer)
    load_weights(trainer.model, ck)
    results = gate_results(suite, baseline, evaluate_suite(suite, cfg.env, trainer))
    write_json(run_dir / "eval" / f"suite_{re.sub(r'[^A-Za-z0-9_.-]+', '_', suite.name)}.json",
               {"suite": suite.name, "checkpoint": str(ck), "passed": suite_passed(results),
                "results": [asdict(r) for r in results]})
    return results


def suite_passed(results: list[GateResult]) -> bool:
    return bool(results) and all(r.passed for r in results)


def format_gate_table(results: list[GateResult], extra_keys=EXTRA_KEYS) -> str:
    """Markdown: eval | dataset | rows | baseline | post | Δ | gate | result; then a table of
    the extra metrics (baseline, post, Δ) that the sets report."""
    if not results:
        return "(no eval sets)"
    metric = results[0].metric
    mixed = len({r.metric for r in results}) > 1  # a set with its own metric: show a metric column
    head = "| eval | dataset | rows | " + ("metric | " if mixed else "") + "baseline | post | Δ | gate | result |"
    lines = [f"metric: {metric}" + (" (unless the row says otherwise)" if mixed else ""), "",
             head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in results:
        lines.append(f"| {r.name} | {r.dataset or '—'} | {r.rows} | " + (f"{r.metric} | " if mixed else "") +
                     f"{r.baseline:.4f} | {r.post:.4f} | {r.delta:+.4f} | {r.gate} | {'pass' if r.passed else 'FAIL'} |")
    for key in extra_keys:
        rows = [r for r in results if key in r.baseline_metrics and key in r.post_metrics and key != metric]
        if not rows:
            continue
        lines += ["", f"| eval | {key} baseline | post | Δ |", "|---|---|---|---|"]
        for r in rows:
            b, p = r.baseline_metrics[key], r.post_metrics[key]
            lines.append(f"| {r.name} | {b:.4f} | {p:.4f} | {p - b:+.4f} |")
    lines += ["", f"{sum(r.passed for r in results)}/{len(results)} gates passed"]
    return "\n".join(lines)
