"""The flags an arm trains on versus the evaluation's hack measure.

An arm that uses an overseer, monitor or screen (monitor_penalty, screening, routing) flags with a
training detector (a DETECTORS name, or `env` = the environment's own hack flag) passed through
noise. The evaluation measures the hack rate with env.detector (batch.scores.hack). When the two
are the same detector the arm is trained against its own yardstick, so the shipped configs use a
different, cheaper one (e.g. happy_prefix against happy_density) and every step logs how often
they disagree.
"""

from __future__ import annotations

import torch

from rhlab.rewards.registry import DetectorFn


def base_flags(detector: DetectorFn | None, batch) -> torch.Tensor:
    """The training detector's flags before noise; detector None = the env's hack flag."""
    flags = batch.scores.hack if detector is None else detector(batch.prompts, batch.completions)
    assert len(flags) == len(batch.completions), \
        f"detector returned {len(flags)} flags for {len(batch.completions)} completions"
    return torch.tensor([bool(f) for f in flags], dtype=torch.bool)


def oversight_stats(base: torch.Tensor, used: torch.Tensor, env_hack) -> dict[str, float]:
    """Per-step numbers, as overseer/<name>: the training detector's flag rate before (base) and
    after the noise (flag_rate: what the arm acted on), the env's hack rate on the same completions,
    and agreement with it: disagree = share of completions where used != env hack flag (base_disagree
    the same for the detector alone), recall = P(used | hack), fpr = P(used | no hack),
    precision = P(hack | used); a ratio with an empty denominator is nan."""
    truth = torch.as_tensor(env_hack, dtype=torch.bool).cpu()
    used, base = used.cpu(), base.cpu()
    assert len(base) == len(used) == len(truth), f"{len(base)} base, {len(used)} used, {len(truth)} env flags"

    def ratio(num: torch.Tensor, den: torch.Tensor) -> float:
        return float(num.sum()) / float(den.sum()) if den.any() else float("nan")
    return {"overseer/base_flag_rate": float(base.float().mean()),
            "overseer/flag_rate": float(used.float().mean()),
            "overseer/env_hack_rate": float(truth.float().mean()),
            "overseer/disagree": float((used != truth).float().mean()),
            "overseer/base_disagree": float((base != truth).float().mean()),
            "overseer/recall": ratio(used & truth, truth),
            "overseer/fpr": ratio(used & ~truth, ~truth),
            "overseer/precision": ratio(used & truth, used)}
