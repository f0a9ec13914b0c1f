"""Advantages from rewards. Groups are consecutive blocks of num_generations completions."""

from __future__ import annotations

import torch

EPS = 1e-4  # as TRL: keeps a group with near-equal rewards from exploding


def grpo_advantages(rewards: torch.Tensor, num_generations: int, scale: str = "group") -> torch.Tensor:
    """A_i = (r_i - mean(group)) / (std + 1e-4), std of the group ("group"), of the whole batch
    ("batch") or 1 ("none"); std is the unbiased sample std, as torch.std and TRL.

    A group whose rewards are all equal gets A = 0 exactly, so it contributes no policy gradient.
    """
    assert rewards.dim() == 1 and rewards.numel() % num_generations == 0, \
        f"{rewards.numel()} rewards do not split into groups of {num_generations}"
    grouped = rewards.view(-1, num_generations)
    adv = (grouped - grouped.mean(1, keepdim=True)).view(-1)
    if scale == "group":
        adv = adv / (grouped.std(1).repeat_interleave(num_generations) + EPS)
    elif scale == "batch":
        adv = adv / (rewards.std() + EPS)
    elif scale != "none":
        raise ValueError(f"scale_rewards: unknown {scale!r}; allowed: group, batch, none")
    return adv


def rloo_advantages(rewards: torch.Tensor, k: int) -> torch.Tensor:
    """RLOO: A_i = R_i - mean of the other k-1 rewards of its group (an unbiased baseline)."""
    assert k >= 2 and rewards.numel() % k == 0, f"{rewards.numel()} rewards do not split into groups of {k}"
    grouped = rewards.view(-1, k)
    others = (grouped.sum(1, keepdim=True) - grouped) / (k - 1)
    return (grouped - others).view(-1)


class MovingBaseline:
    """REINFORCE baseline: an exponential moving average of past batch-mean rewards.

    A_i = R_i - b, with b from *previous* batches (the first batch uses its own mean, so the
    first step is not one big push in the direction of whatever the policy happened to do).
    """

    def __init__(self, momentum: float):
        assert 0 <= momentum < 1, "reinforce baseline momentum must be in [0, 1)"
        self.momentum, self.value = momentum, None

    def advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        mean = float(rewards.mean())
        b = mean if self.value is None else self.value
        self.value = mean if self.value is None else self.momentum * self.value + (1 - self.momentum) * mean
        return rewards - b

    def state(self) -> dict:
        return {"value": self.value}

    def load(self, state: dict) -> None:
        self.value = state["value"]


def screened_advantages(rewards: torch.Tensor, exclude: torch.Tensor, G: int, scale: str = "group") -> torch.Tensor:
    """Exact screening for GRPO (the screening intervention's advantages):
    mean and std over each group's kept members only; excluded members and groups with fewer than
    2 kept members get A = 0. "batch" scaling uses the std of all kept rewards."""
    assert rewards.shape == exclude.shape and rewards.numel() % G == 0
    r, keep = rewards.view(-1, G), ~exclude.view(-1, G)
    k = keep.sum(1, keepdim=True)
    mean = (r * keep).sum(1, keepdim=True) / k.clamp(min=1)
    adv = (r - mean) * keep
    if scale == "group":
        var = (((r - mean) ** 2) * keep).sum(1, keepdim=True) / (k - 1).clamp(min=1)
        adv = adv / (var.sqrt() + EPS)
    elif scale == "batch":
        kept = rewards[~exclude]
        adv = adv / ((kept.std() if kept.numel() > 1 else kept.new_tensor(0.0)) + EPS)
    elif scale != "none":
        raise ValueError(f"scale_rewards: unknown {scale!r}; allowed: group, batch, none")
    adv = adv * (k >= 2)
    return adv.view(-1)
