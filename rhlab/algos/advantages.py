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
