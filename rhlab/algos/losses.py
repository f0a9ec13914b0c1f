"""The clipped policy-gradient loss of the GRPO family, with the meanings of TRL's GRPOConfig.

Per token t of completion i (ratio rho = exp(logp - logp_old), A_i the advantage):
    l_it = -min(rho' * A_i, clip(rho, 1 - eps, 1 + eps_high) * A_i) + beta * KL3_it
    rho' = min(rho, delta) when delta is set (two-sided clipping), else rho
    KL3  = exp(ref - logp) - (ref - logp) - 1          (k3 estimator, >= 0)
Aggregation over the mask m (see docs/losses.md):
    grpo:    mean_i [ sum_t m l / sum_t m ]             (per-sequence mean, then mean)
    bnpo:    sum m l / sum m                            (over this micro-batch's tokens)
    dr_grpo: sum m l / (n_sequences * max_new_tokens)   (constant normaliser)
    dapo:    sum m l / tokens_in_whole_batch            (over all micro-batches' tokens)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


@dataclass
class LossOut:
    loss: torch.Tensor
    kl: torch.Tensor  # mean k3 KL over masked tokens (detached)
    clip_low: torch.Tensor  # fraction of masked tokens clipped at 1 - eps with A < 0
    clip_high: torch.Tensor  # fraction clipped at 1 + eps_high with A > 0


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, *,
                loss_type: str, epsilon: float, epsilon_high: float | None = None,
                delta: float | None = None, beta: float = 0.0, ref_logp: torch.Tensor | None = None,
                max_new_tokens: int | None = None, total_tokens: float | None = None) -> LossOut:
    """logp, old_logp, ref_logp, mask: [B, T]; adv: [B]. Returns the scalar loss for this micro-batch,
    already normalised so that summing micro-batch losses gives the full-batch loss for
    bnpo/dapo/dr_grpo; for grpo and bnpo the caller divides by the number of micro-batches."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type: unknown {loss_type!r}; allowed: {', '.join(LOSS_TYPES)}")
    eps_high = epsilon if epsilon_high is None else epsilon_high
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + eps_high)
    capped = ratio if delta is None else torch.clamp(ratio, max=delta)
    a = adv[:, None]
    per_tok = -torch.min(capped * a, clipped * a)
    kl = torch.zeros_like(logp)
    if ref_logp is not None:
        kl = k3_kl(logp, ref_logp)
    if beta:
        assert ref_logp is not None, "beta > 0 needs reference log-probs"
        per_tok = per_tok + beta * kl
    if loss_type == "grpo":
        loss = ((per_tok * mask).sum(1) / mask.sum(1).clamp(min=1)).mean()
    elif loss_type == "bnpo":
        loss = (per_tok * mask).sum() / mask.sum().clamp(min=1)
    elif loss_type == "dr_grpo":
        assert max_new_tokens, "dr_grpo needs max_new_tokens"
        loss = (per_tok * mask).sum() / (logp.shape[0] * max_new_tokens)
    else:
        assert total_tokens is not None, "dapo needs the whole batch's token count"
        loss = (per_tok * mask).sum() / max(total_tokens, 1.0)
    n = mask.sum().clamp(min=1)
    with torch.no_grad():
        low = ((ratio < 1 - epsilon) & (a < 0)).to(mask.dtype)
        high = ((ratio > 1 + eps_high) & (a > 0)).to(mask.dtype)
        return LossOut(loss, (kl.detach() * mask).sum() / n, (low * mask).sum() / n, (high * mask).sum() / n)
