"""Composite shaped rewards: weighted score parts minus weighted, shaped penalties.

Each part is a score (added) or a penalty (raw value p >= 0, subtracted). With weights w:

    strict           R = sum_s w_s * s  -  sum_p w_p * p                      (raw penalties: the eval metric)
    scalar_softened  R = sum_s w_s * s  -  sum_p w_p * cap * tanh(p / cap)    (training default)
    scalar_capped    R = sum_s w_s * s  -  sum_p w_p * min(p, cap)            (ablation: the saturating floor)

Why tanh: a hard cap makes every completion past the cap score the same, so a GRPO group
whose members all exceed it has no penalty-side signal. cap * tanh(p / cap) is bounded by
cap too, but its slope sech^2(p / cap) stays positive (0.42 at p = cap, 0.07 at 2 cap):
dropping one more fact still costs something. The strict reward is computed for every
completion whatever the mode, so training runs under any mode are evaluated on one scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

MODES = ("strict", "scalar_softened", "scalar_capped")
KINDS = ("score", "penalty")


@dataclass(frozen=True)
class PartSpec:
    name: str
    weight: float
    kind: str  # "score" or "penalty"
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CompositeSpec:
    parts: tuple[PartSpec, ...]
    mode: str = "scalar_softened"
    penalty_cap: float = 1.5

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"reward_mode: unknown mode {self.mode!r}; allowed: {', '.join(MODES)}")
        if not (isinstance(self.penalty_cap, (int, float)) and self.penalty_cap > 0):
            raise ValueError(f"penalty_cap: must be a number > 0 (got {self.penalty_cap!r})")
        if not self.parts:
            raise ValueError("reward parts: at least one part is required")
        names = [p.name for p in self.parts]
        if len(set(names)) != len(names):
            raise ValueError(f"reward parts: duplicate names {names}")
        for p in self.parts:
            if p.kind not in KINDS:
                raise ValueError(f"reward part {p.name!r}: kind {p.kind!r}; allowed: {', '.join(KINDS)}")
            if not (isinstance(p.weight, (int, float)) and p.weight >= 0):
                raise ValueError(f"reward part {p.name!r}: weight must be a number >= 0 (got {p.weight!r})")

    def part(self, name: str) -> PartSpec | None:
        return next((p for p in self.parts if p.name == name), None)


def build_spec(parts, kinds: dict[str, str], mode: str, penalty_cap: float) -> CompositeSpec:
    """parts: objects with .name/.weight/.params (config RewardSpec) or dicts with those keys.
    kinds: the part names an environment provides -> "score" | "penalty"."""
    specs = []
    for p in parts:
        d = p if isinstance(p, dict) else {"name": p.name, "weight": p.weight, "params": p.params}
        unknown = set(d) - {"name", "weight", "params"}
        if unknown:
            raise ValueError(f"reward part: unknown keys {sorted(unknown)}; allowed: name, weight, params")
        name = d["name"]
        if name not in kinds:
            raise ValueError(f"reward part {name!r} unknown; allowed: {', '.join(sorted(kinds))}")
        specs.append(PartSpec(name, float(d.get("weight", 1.0)), kinds[name], dict(d.get("params") or {})))
    return CompositeSpec(tuple(specs), mode, penalty_cap)


def shape_penalty(raw: float, mode: str, cap: float) -> float:
    """The penalty as the training reward applies it (before the part weight)."""
    assert raw >= 0, f"penalties are raw magnitudes >= 0 (got {raw})"
    if mode == "strict":
        return raw
    if mode == "scalar_softened":
        return cap * math.tanh(raw / cap)
    if mode == "scalar_capped":
        return min(raw, cap)
    raise ValueError(f"reward_mode: unknown mode {mode!r}; allowed: {', '.join(MODES)}")


@dataclass
class Combined:
    reward: list[float]  # the training reward under spec.mode
    strict: list[float]  # the strict reward (raw penalties), whatever the mode
    parts: dict[str, list[float]]  # every part and diagnostic, logged separately


def combine(spec: CompositeSpec, values: dict[str, list[float]]) -> Combined:
    """values: part name -> per-completion raw values (scores as they are, penalties >= 0).

    Logged parts: each score under its name; each penalty p as name = -p (signed, larger is
    better) and name_shaped = -shape(p); penalty_rate = 1 where any raw penalty > 0;
    penalty_saturated = 1 where any raw penalty >= cap (a hard cap would be flat there)."""
    missing = [p.name for p in spec.parts if p.name not in values]
    assert not missing, f"combine: no values for parts {missing}"
    n = len(values[spec.parts[0].name])
    assert all(len(values[p.name]) == n for p in spec.parts), "combine: parts disagree on the number of completions"
    reward, strict = [0.0] * n, [0.0] * n
    parts: dict[str, list[float]] = {}
    any_pen, saturated = [0.0] * n, [0.0] * n
    for p in spec.parts:
        vals = [float(v) for v in values[p.name]]
        if p.kind == "score":
            parts[p.name] = vals
            reward = [r + p.weight * v for r, v in zip(reward, vals)]
            strict = [s + p.weight * v for s, v in zip(strict, vals)]
            continue
        shaped = [shape_penalty(v, spec.mode, spec.penalty_cap) for v in vals]
        parts[p.name] = [-v for v in vals]
        parts[f"{p.name}_shaped"] = [-v for v in shaped]
        reward = [r - p.weight * v for r, v in zip(reward, shaped)]
        strict = [s - p.weight * v for s, v in zip(strict, vals)]
        any_pen = [max(a, float(v > 0)) for a, v in zip(any_pen, vals)]
        saturated = [max(a, float(v >= spec.penalty_cap)) for a, v in zip(saturated, vals)]
    parts["penalty_rate"], parts["penalty_saturated"], parts["strict"] = any_pen, saturated, strict
    return Combined(reward, strict, parts)
