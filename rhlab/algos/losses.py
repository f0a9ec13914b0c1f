"""The policy-gradient losses of the GRPO family, with the meanings of TRL 1.16's GRPOConfig.

Per token t of completion i (ratio rho = exp(logp - logp_old), A_i the advantage):
    l_it = pg_it + beta * w_it * KL3_it
    KL3  = exp(ref - logp) - (ref - logp) - 1          (k3 estimator, >= 0)
    w    = rho with kl_bias_correction (TRL's use_bias_correction_kl), else 1
    pg   = -min(rho' * A_i, clip(rho, 1 - eps, 1 + eps_high) * A_i)     grpo, bnpo, dr_grpo, dapo
           rho' = min(rho, delta) when delta is set (two-sided clipping), else rho
    pg   = -sg[min(rho, eps_high)] * A_i * logp                          cispo (sg = no gradient)
    pg   = -sigmoid(tau (rho - 1)) * 4 / tau * A_i, tau = tau_pos if A_i > 0 else tau_neg    sapo
Aggregation over the mask m (see docs/losses.md), B sequences in the generation batch:
    grpo, sapo:  sum_i [ sum_t m l / sum_t m ] / B      (per-sequence mean, then mean)
    bnpo:        sum m l / sum m, per micro-batch, averaged over micro-batches (TRL's semantics)
    dr_grpo:     sum m l / (B * max_new_tokens)         (constant normaliser)
    dapo, cispo: sum m l / tokens_in_whole_batch        (over all micro-batches' tokens)
The loss is returned as per-sequence contributions, so a micro-batch, or any sub-group of it
processed in its own backward pass (gradient routing), sums back to the batch loss exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

CLIPPED = ("grpo", "bnpo", "dr_grpo", "dapo")  # PPO-style hard clip of rho * A
LOSS_TYPES = (*CLIPPED, "cispo", "sapo")


@dataclass
class Norm:
    """What the aggregation divides by. A generation batch of `batch_seqs` sequences and
    `batch_tokens` masked tokens is split into `n_micro` micro-batches; `micro_tokens` is this
    micro-batch's token count (bnpo normalises per micro-batch, as TRL does)."""
    batch_seqs: int
    batch_tokens: float
    micro_tokens: float
    n_micro: int
    max_new_tokens: int

    @classmethod
    def single(cls, mask: torch.Tensor, max_new_tokens: int | None = None) -> "Norm":
        tokens = float(mask.sum())
        return cls(mask.shape[0], tokens, tokens, 1, max_new_tokens or mask.shape[1])


@dataclass
class LossOut:
    loss: torch.Tensor  # = per_seq.sum(): summed over micro-batches (and sub-groups) gives the batch loss
    per_seq: torch.Tensor  # [B] each sequence's contribution
    kl: torch.Tensor  # mean k3 KL over masked tokens (detached)
    clip_low: torch.Tensor  # fraction of masked tokens clipped at 1 - eps with A < 0 (0 for cispo, sapo)
    clip_high: torch.Tensor  # fraction clipped at 1 + eps_high with A > 0 (cispo: rho > eps_high; sapo: 0)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def seq_contributions(per_tok: torch.Tensor, mask: torch.Tensor, loss_type: str, norm: Norm) -> torch.Tensor:
    """Per-sequence share of the batch loss, so any split of the batch sums back to it exactly."""
    seq_sum = (per_tok * mask).sum(1)
    if loss_type in ("grpo", "sapo"):
        return seq_sum / mask.sum(1).clamp(min=1) / norm.batch_seqs
    if loss_type == "bnpo":
        return seq_sum / max(norm.micro_tokens, 1.0) / norm.n_micro
    if loss_type == "dr_grpo":
        return seq_sum / (norm.batch_seqs * norm.max_new_tokens)
    if loss_type in ("dapo", "cispo"):
        return seq_sum / max(norm.batch_tokens, 1.0)
    raise ValueError(f"loss_type: unknown {loss_type!r}; allowed: {', '.join(LOSS_TYPES)}")


def pg_per_token(logp: torch.Tensor, ratio: torch.Tensor, a: torch.Tensor, loss_type: str, epsilon: float,
                 eps_high: float, delta: float | None, sapo_temperature_pos: float,
                 sapo_temperature_neg: float) -> torch.Tensor:
    """The policy-gradient term of each token (before the KL term), in TRL's operation order."""
    if loss_type == "cispo":  # the capped ratio only weighs the plain policy gradient (MiniMax-M1)
        return -torch.clamp(ratio, max=eps_high).detach() * a * logp
    if loss_type == "sapo":  # a smooth gate instead of the hard clip; its gradient at rho = 1 is -A grad logp
        tau = torch.where(a > 0, sapo_temperature_pos, sapo_temperature_neg)
        return -(torch.sigmoid(tau * (ratio - 1)) * 4 / tau) * a
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + eps_high)
    capped = ratio if delta is None else torch.clamp(ratio, max=delta)
    return -torch.min(capped * a, clipped * a)


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, *,
                loss_type: str, epsilon: float, epsilon_high: float | None = None,
                delta: float | None = None, beta: float = 0.0, ref_logp: torch.Tensor | None = None,
                norm: Norm | None = None, kl_bias_correction: bool = False,
                sapo_temperature_pos: float = 1.0, sapo_temperature_neg: float = 1.05) -> LossOut:
    """logp, old_logp, ref_logp, mask: [B, T]; adv: [B]. norm defaults to "this is the whole batch"."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type: unknown {loss_type!r}; allowed: {', '.join(LOSS_TYPES)}")
    eps_high = epsilon if epsilon_high is None else epsilon_high
    mask = mask.to(logp.dtype)
    norm = norm or Norm.single(mask)
    ratio = torch.exp(logp - old_logp)
    a = adv[:, None]
    per_tok = pg_per_token(logp, ratio, a, loss_type, epsilon, eps_high, delta, sapo_temperature_pos,
                           sapo_temperature_neg)
    kl = torch.zeros_like(logp)
    if ref_logp is not None:
        kl = k3_kl(logp, ref_logp)
    if beta:
        assert ref_logp is not None, "beta > 0 needs reference log-probs"
        # times rho (with its gradient): the unbiased reverse-KL gradient, even where rho = 1
        per_tok = per_tok + beta * (kl * ratio if kl_bias_correction else kl)
    per_seq = seq_contributions(per_tok, mask, loss_type, norm)
    loss = per_seq.sum()
    n = mask.sum().clamp(min=1)
    with torch.no_grad():
        low = ((ratio < 1 - epsilon) & (a < 0)).to(mask.dtype)
        high = ((ratio > 1 + eps_high) & (a > 0)).to(mask.dtype)
        if loss_type == "cispo":  # TRL's cispo_clip_ratio: the ratio's cap is eps_high itself
            low, high = torch.zeros_like(low), ((ratio > eps_high) & (a > 0)).to(mask.dtype)
        elif loss_type == "sapo":  # no hard clipping
            low, high = torch.zeros_like(low), torch.zeros_like(high)
        return LossOut(loss, per_seq, (kl.detach() * mask).sum() / n, (low * mask).sum() / n,
                       (high * mask).sum() / n)
