"""Stratified prompt batches, and difficulty filtering + rebucketing of a task pool.

Prompts are grouped into buckets by a reward-profile key (which fact types a prompt
carries, or a difficulty bucket). A batch of n prompts gives every bucket floor(n / k) or
ceil(n / k) prompts (k buckets; the extra ones go to buckets drawn at random), so when
n >= k every bucket is in every batch: one easy profile cannot crowd the others out of a step.

Difficulty filtering: sample a group of completions per prompt from the base policy; a
prompt whose group rewards do not spread (all pass or all fail) gives GRPO no advantage,
so it is dropped. The kept prompts are rebucketed by their mean reward (hardest first).
"""

from __future__ import annotations

import json
import random
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


@dataclass
class StratifiedSampler:
    buckets: dict[str, list[str]]  # bucket key -> prompts

    def __post_init__(self):
        assert self.buckets, "stratified sampler: no buckets"
        empty = [k for k, v in self.buckets.items() if not v]
        assert not empty, f"stratified sampler: empty buckets {empty}"
        self.keys = sorted(self.buckets)  # sorted: the same rng gives the same batch on every machine

    def counts(self, rng: random.Random, n: int) -> dict[str, int]:
        """Prompts per bucket: floor(n / k) each, the n % k extra ones to distinct random buckets."""
        assert n > 0, f"stratified sampler: n must be > 0 (got {n})"
        base, extra = divmod(n, len(self.keys))
        lucky = set(rng.sample(self.keys, extra))
        return {k: base + (k in lucky) for k in self.keys}

    def sample(self, rng: random.Random, n: int) -> list[str]:
        out = [rng.choice(self.buckets[k]) for k, c in self.counts(rng, n).items() for _ in range(c)]
        rng.shuffle(out)  # no bucket always sits first in the batch
        return out


def bucket_by(prompts: list[str], key: Callable[[str], str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in prompts:
        out.setdefault(key(p), []).append(p)
    return out


def spread(rewards: list[float]) -> float:
    """Population standard deviation of one prompt's group rewards (0 for a single reward)."""
    assert rewards, "spread of an empty group"
    return statistics.pstdev(rewards)


@dataclass
class FilterResult:
    kept: dict[str, float]  # prompt -> mean group reward, for prompts with spread > min_spread
    dropped: list[str]
    spreads: dict[str, float]


def difficulty_filter(group_rewards: dict[str, list[float]], min_spread: float) -> FilterResult:
    """Keep the prompts whose group rewards have spread (population std) > min_spread."""
    assert min_spread >= 0, f"min_spread must be >= 0 (got {min_spread})"
    spreads = {p: spread(r) for p, r in group_rewards.items()}
    kept = {p: statistics.fmean(group_rewards[p]) for p in group_rewards if spreads[p] > min_spread}
    dropped = [p for p in group_rewards if p not in kept]
    return FilterResult(kept, dropped, spreads)


def rebucket(means: dict[str, float], n_buckets: int = 3,
             key: Callable[[str], str] | None = None) -> dict[str, list[str]]:
    """Split prompts into n_buckets equal-size difficulty buckets by mean reward, lowest first.

    Names: hard/medium/easy for 3 buckets, d0 (hardest) .. d{n-1} otherwise. With key, a
    bucket is f"{key(prompt)}/{difficulty}", so a profile x difficulty grid is stratified."""
    assert n_buckets >= 1, f"n_buckets must be >= 1 (got {n_buckets})"
    assert len(means) >= n_buckets, f"rebucket: {len(means)} prompts for {n_buckets} buckets"
    names = ["hard", "medium", "easy"] if n_buckets == 3 else [f"d{i}" for i in range(n_buckets)]
    order = sorted(means, key=lambda p: (means[p], p))  # ties broken by text: deterministic
    out: dict[str, list[str]] = {}
    for i, p in enumerate(order):
        name = names[i * n_buckets // len(order)]
        out.setdefault(f"{key(p)}/{name}" if key else name, []).append(p)
    return out


def measure_group_rewards(policy, env, prompts: list[str], num_generations: int,
                          seed: int = 0) -> dict[str, list[float]]:
    """The base policy's training rewards: num_generations completions per prompt.
    policy: anything with .rollout(prompts, seed) -> (rollouts, texts), e.g. a Trainer."""
    assert num_generations >= 2, "a spread needs at least 2 completions per prompt"
    assert len(set(prompts)) == len(prompts), "measure_group_rewards: duplicate prompts"
    batch = [p for p in prompts for _ in range(num_generations)]
    _, texts = policy.rollout(batch, seed=seed)
    rewards = env.score(batch, texts).reward
    return {p: rewards[i * num_generations:(i + 1) * num_generations] for i, p in enumerate(prompts)}


def save_pool(path: str | Path, buckets: dict[str, list[str]]) -> None:
    """A rebucketed pool, readable by the rewrite env's pool_file param."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({"buckets": buckets}, indent=1) + "\n")


def load_pool(path: str | Path) -> dict[str, list[str]]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"pool_file not found: {path}")
    data = json.loads(path.read_text())
    if not (isinstance(data, dict) and isinstance(data.get("buckets"), dict)):
        raise ValueError(f"{path}: a pool file holds {{\"buckets\": {{name: [prompts]}}}}")
    buckets = data["buckets"]
    bad = [k for k, v in buckets.items() if not (isinstance(v, list) and v and all(isinstance(p, str) for p in v))]
    if bad:
        raise ValueError(f"{path}: buckets {bad} must be non-empty lists of prompt strings")
    return buckets
