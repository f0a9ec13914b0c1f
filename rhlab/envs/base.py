"""The Environment protocol: prompts in; reward parts, task score and hack flags out."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Protocol

from rhlab.rewards.registry import REWARDS


@dataclass
class Scores:
    """Per-completion results. `reward` is what is trained on; `task_score` what we want."""
    reward: list[float]
    parts: dict[str, list[float]]
    task_score: list[float]
    passed: list[bool]
    hack: list[bool]  # strict hack flag from the env's detector
    hack_loose: list[bool] = field(default_factory=list)
    # per-completion 0/1 indicators logged as their share, e.g. {"label/reward_hack": [...]}
    shares: dict[str, list[float]] = field(default_factory=dict)

    def __post_init__(self):
        n = len(self.reward)
        for name, vals in [("task_score", self.task_score), ("passed", self.passed), ("hack", self.hack),
                           *self.parts.items(), *self.shares.items()]:
            assert len(vals) == n, f"scores: {name} has {len(vals)} values for {n} completions"
        if not self.hack_loose:
            self.hack_loose = list(self.hack)


class Environment(Protocol):
    name: str
    DEFAULT_REWARDS: list[dict]  # env.rewards when the config leaves it unset
    DEFAULT_DETECTOR: dict | None  # env.detector when unset; None: the environment flags hacks itself

    def sample_prompts(self, rng: random.Random, n: int) -> list[str]: ...

    def eval_prompts(self, n: int) -> list[str]: ...

    def score(self, prompts: list[str], completions: list[str]) -> Scores: ...


ENVS: dict[str, Callable] = {}


def register_env(name: str):
    def deco(cls):
        ENVS[name] = cls
        return cls
    return deco


def env_params(given: dict, defaults: dict, env: str) -> dict:
    """An environment's params: its defaults updated by the config's; unknown keys fail loudly."""
    unknown = set(given) - set(defaults)
    if unknown:
        raise ValueError(f"env.params: unknown keys {sorted(unknown)} for {env}; allowed: {sorted(defaults)}")
    return {**defaults, **given}


def check_env_params(name: str, params: dict) -> type:
    """env.params against the environment's declared ones (PARAMS_MODEL, or DEFAULT_PARAMS typed by
    their defaults); a one-line ValueError naming the key."""
    from typing import Any

    from pydantic import ConfigDict, create_model

    from rhlab.registry import validate_params

    if name not in ENVS:
        raise ValueError(f"env.name: unknown environment {name!r}; allowed: {', '.join(sorted(ENVS))}")
    cls = ENVS[name]
    model = getattr(cls, "PARAMS_MODEL", None)
    if model is None:
        defaults = getattr(cls, "DEFAULT_PARAMS", {})
        model = create_model(f"{name}_params", __config__=ConfigDict(extra="forbid"),
                             **{k: (Any if v is None else type(v), v) for k, v in defaults.items()})
    validate_params(model, params, "env.params", f"env {name!r}")
    return cls


class WeightedReward:
    """Training reward = sum of weight * part; every part is also logged under its name."""

    def __init__(self, specs):
        if not specs:
            raise ValueError("env.rewards: at least one reward is required")
        self.parts = [(s.name, s.weight, REWARDS.build(s.name, s.params)) for s in specs]
        names = [n for n, _, _ in self.parts]
        if len(set(names)) != len(names):
            raise ValueError(f"env.rewards: duplicate reward names {names}")

    def __call__(self, prompts: list[str], completions: list[str]) -> tuple[list[float], dict[str, list[float]]]:
        parts = {}
        total = [0.0] * len(completions)
        for name, weight, fn in self.parts:
            vals = [float(v) for v in fn(prompts, completions)]
            assert len(vals) == len(completions), f"reward {name} returned {len(vals)} values"
            parts[name] = vals
            total = [t + weight * v for t, v in zip(total, vals)]
        return total, parts
