"""Baselines for the projection experiment, acting on rewards/advantages instead of gradients.
All of them train the same SVD adapter as the projection arms (svd.enabled=false: plain model).

advantage_penalty  Rebound-style (Wu & Tang 2026, section 3.2): per completion
                   r <- r - alpha * max(0, cos(h_mean - c, v_concept)), h_mean the policy's mean
                   residual-stream activation over the completion's tokens at depth_frac of the
                   stack, v_concept = unit(mean h_hack - mean h_clean) over the contrastive pairs
                   (extracted once, from the initial model). c = 0 as specified; center=true uses
                   c = the midpoint of the two pair means.
monitor_penalty    r <- r - penalty when a detector of the given accuracy flags the completion
                   (the named detector's flag, or the env's hack flag when none is named, flipped
                   with probability 1 - accuracy; seeded per step). The shipped configs name
                   happy_prefix, not the evaluation's happy_density (rhlab/interventions/oversight.py).
screening          flagged completions leave their group's statistics and get A = 0: on_scored
                   sets batch.extra["exclude"], and the advantages hook replaces the trainer's
                   advantages with screened_advantages over the kept members. batch.rewards (logged
                   as reward_trained_mean) holds excluded rewards at their group's kept mean (the
                   same advantages for scale_rewards=none; under group scaling the kept ones would
                   be sqrt((G-1)/(k-1)) too large, hence the hook).
"""

from __future__ import annotations

import random

import torch

from rhlab.algos.advantages import EPS, screened_advantages  # noqa: F401  (re-exported for tests)
from rhlab.interventions.direction import (
    hidden_layer,
    masked_hidden_mean,
    pair_activation_means,
    unit,
)
from rhlab.interventions.base import INTERVENTIONS, NESTED_CHECKS, check_detector_ref
from rhlab.interventions.oversight import base_flags, oversight_stats
from rhlab.interventions.projection import SVDArm
from rhlab.interventions.pairs import load_pairs
from rhlab.rewards.registry import DETECTORS


class AdvantagePenalty(SVDArm):
    name = "advantage_penalty"

    def __init__(self, alpha: float = 0.5, depth_frac: float = 0.7, pairs: str = "happy_stories",
                 pair_params: dict | None = None, modes: list[str] | None = None, center: bool = False,
                 svd: dict | None = None):
        super().__init__(svd)
        if alpha < 0:
            raise ValueError(f"intervention.params.alpha must be >= 0, got {alpha}")
        self.alpha, self.depth_frac, self.center = alpha, depth_frac, center
        self.pairs, self.pair_params, self.modes = pairs, dict(pair_params or {}), modes
        self._m: dict[str, float] = {}

    def setup(self, trainer) -> None:
        self.layer = hidden_layer(trainer.model, self.depth_frac)
        pairs = load_pairs(self.pairs, self.pair_params, self.modes)
        h_hack, h_clean = pair_activation_means(trainer.model, trainer.tok, pairs, self.layer)
        self.v = unit(h_hack.mean(0) - h_clean.mean(0), "v_concept")
        self.c = (h_hack.mean(0) + h_clean.mean(0)) / 2 if self.center else torch.zeros_like(self.v)
        cos_h, cos_c = self.cos(h_hack), self.cos(h_clean)
        # how well the penalty separates the pairs it came from (logged once, for the write-up)
        self.pair_stats = {"pair_cos_hack": float(cos_h.mean()), "pair_cos_clean": float(cos_c.mean()),
                           "pair_frac_hack_above": float((cos_h > cos_c).float().mean())}
        print(f"advantage_penalty: layer {self.layer}, {len(pairs)} pairs, {self.pair_stats}")

    def cos(self, h: torch.Tensor) -> torch.Tensor:
        x = h - self.c
        return x @ self.v / (x.norm(dim=-1) + 1e-12)

    def completion_means(self, trainer, batch) -> torch.Tensor:
        r = batch.rollouts
        out = []
        n_micro = trainer.cfg.train.gradient_accumulation_steps
        for idx in torch.arange(len(r), device=r.completion_ids.device).chunk(n_micro):
            s = r.select(idx)
            ids = torch.cat([s.prompt_ids, s.completion_ids], 1)
            attn = torch.cat([s.prompt_mask, s.completion_mask], 1)
            cm = torch.cat([torch.zeros_like(s.prompt_mask), s.completion_mask], 1)
            out.append(masked_hidden_mean(trainer.model, ids, attn, cm, self.layer))
        return torch.cat(out)

    def on_scored(self, trainer, batch) -> None:
        was_training = trainer.model.training
        trainer.model.eval()
        cos = self.cos(self.completion_means(trainer, batch))
        trainer.model.train(was_training)
        pen = self.alpha * cos.clamp(min=0)  # on the CPU (activation means are): rewards live on the model's device
        batch.rewards = batch.rewards - pen.to(batch.rewards.device)
        batch.extra["concept_cos"] = cos
        hack = torch.tensor(batch.scores.hack, dtype=torch.bool)
        self._m = {"penalty/mean": float(pen.mean()), "penalty/cos": float(cos.mean()),
                   "penalty/cos_hack": float(cos[hack].mean()) if hack.any() else float("nan"),
                   "penalty/cos_nohack": float(cos[~hack].mean()) if (~hack).any() else float("nan")}

    def metrics(self) -> dict[str, float]:
        return self._m


class Monitor:
    """Hack flags from a detector of a given accuracy: the named detector's flag (the env's hack
    flag when none is named) flipped with probability 1 - accuracy, one draw per completion from a
    stream seeded by (run seed, step), so runs are reproducible and resumable. Each call leaves its
    agreement with the env's hack flag in self.stats (overseer/* metrics)."""

    def __init__(self, accuracy: float, detector: dict | None):
        if not 0 <= accuracy <= 1:
            raise ValueError(f"intervention.params.accuracy must be in [0, 1], got {accuracy}")
        self.accuracy = accuracy
        self.detector = None
        if detector is not None:
            ref = check_detector_ref(detector, "intervention.params.detector")
            self.detector = DETECTORS.build(ref.name, ref.params)
        self.stats: dict[str, float] = {}

    def flags(self, trainer, batch) -> torch.Tensor:
        base = base_flags(self.detector, batch)
        rng = random.Random(f"{trainer.cfg.seed}-monitor-{trainer.step}")
        out = torch.tensor([bool(t) != (rng.random() >= self.accuracy) for t in base.tolist()], dtype=torch.bool)
        self.stats = oversight_stats(base, out, batch.scores.hack)
        return out


class MonitorPenalty(SVDArm):
    name = "monitor_penalty"

    def __init__(self, penalty: float = 1.0, accuracy: float = 0.9, detector: dict | None = None,
                 svd: dict | None = None):
        super().__init__(svd)
        if penalty < 0:
            raise ValueError(f"intervention.params.penalty must be >= 0, got {penalty}")
        self.penalty, self.monitor = penalty, Monitor(accuracy, detector)
        self._m: dict[str, float] = {}

    def on_scored(self, trainer, batch) -> None:
        flags = self.monitor.flags(trainer, batch).to(batch.rewards.device)
        batch.rewards = batch.rewards - self.penalty * flags.float()
        batch.extra["monitor_flag"] = flags
        self._m = dict(self.monitor.stats)

    def metrics(self) -> dict[str, float]:
        return self._m


def screened_rewards(rewards: torch.Tensor, exclude: torch.Tensor, G: int) -> torch.Tensor:
    """Excluded rewards -> the mean of their group's kept rewards (kept ones unchanged); a group with
    fewer than 2 kept members becomes constant (no statistics: every A = 0)."""
    r = rewards.view(-1, G).clone()
    ex = exclude.view(-1, G)
    for g in range(r.shape[0]):
        keep = ~ex[g]
        if keep.sum() < 2:
            r[g] = r[g][keep].mean() if keep.any() else r[g].mean()
        else:
            r[g][ex[g]] = r[g][keep].mean()
    return r.view(-1)


class Screening(SVDArm):
    name = "screening"

    def __init__(self, accuracy: float = 0.9, detector: dict | None = None, svd: dict | None = None):
        super().__init__(svd)
        self.monitor = Monitor(accuracy, detector)
        self._m: dict[str, float] = {}

    def setup(self, trainer) -> None:
        t = trainer.cfg.train
        if t.algo != "grpo" or t.kl_in_reward:
            raise ValueError("screening needs train.algo=grpo and kl_in_reward=false (group statistics of kept "
                             f"members); got algo={t.algo}, kl_in_reward={t.kl_in_reward}")

    def on_scored(self, trainer, batch) -> None:
        flags = self.monitor.flags(trainer, batch).to(batch.rewards.device)
        batch.extra["exclude"] = flags
        batch.rewards = screened_rewards(batch.rewards, flags, trainer.cfg.train.num_generations)
        self._m = dict(self.monitor.stats)

    def advantages(self, trainer, batch, adv):
        """Group statistics over the kept members only; excluded completions get A = 0."""
        t = trainer.cfg.train
        return screened_advantages(batch.rewards, batch.extra["exclude"].to(batch.rewards.device),
                                   t.num_generations, t.scale_rewards)

    def metrics(self) -> dict[str, float]:
        return self._m


def _check_monitor_detector(params: dict) -> None:
    """intervention.params.detector: unset (the env's hack flag) or {name, params} of a registered detector."""
    if params.get("detector") is not None:
        check_detector_ref(params["detector"], "intervention.params.detector")


INTERVENTIONS.register("advantage_penalty")(AdvantagePenalty)
INTERVENTIONS.register("monitor_penalty")(MonitorPenalty)
INTERVENTIONS.register("screening")(Screening)
NESTED_CHECKS["monitor_penalty"] = NESTED_CHECKS["screening"] = _check_monitor_detector
