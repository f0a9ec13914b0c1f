"""Dual LoRA: a retain and a forget adapter on the same frozen linear layer (gradient routing).

    y = base(x) + retain_scale * (alpha_r / r_r) * B_r A_r x + forget_scale * (alpha_f / r_f) * B_f A_f x

A is kaiming-uniform initialised and B is zero (as in peft), so a fresh model equals its base.
At (1, 1) the pair is exactly a LoRA of rank r_r + r_f whose A and B are the two adapters'
stacked, provided alpha_r / r_r == alpha_f / r_f (the baseline's alpha / r must match too).
set_scales ablates an adapter at inference; grad_mask zeroes one adapter's parameter gradients
for a backward pass (routing masks gradients, never outputs: masking an adapter's output would
also cut the gradient that reaches the layers below it).
"""

from __future__ import annotations

import math
import re
from contextlib import contextmanager

import torch
from torch import nn

ADAPTERS = ("retain", "forget")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class DualLoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, retain_rank: int, retain_alpha: float,
                 forget_rank: int, forget_alpha: float):
        super().__init__()
        assert isinstance(base, nn.Linear), f"DualLoRALinear wraps nn.Linear, got {type(base).__name__}"
        assert retain_rank > 0 and forget_rank > 0, "both adapters need rank > 0"
        assert retain_alpha > 0 and forget_alpha > 0, "both adapters need alpha > 0"
        self.base = base.requires_grad_(False)
        w = base.weight
        for name, r in (("retain", retain_rank), ("forget", forget_rank)):
            a = nn.Parameter(torch.empty(r, base.in_features, dtype=w.dtype, device=w.device))
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))  # peft's LoRA A init
            setattr(self, f"{name}_A", a)
            setattr(self, f"{name}_B", nn.Parameter(torch.zeros(base.out_features, r, dtype=w.dtype, device=w.device)))
        self.retain_scaling = retain_alpha / retain_rank
        self.forget_scaling = forget_alpha / forget_rank
        self.retain_scale = 1.0  # inference-time multipliers, set by set_scales
        self.forget_scale = 1.0

    def adapter_params(self, which: str) -> list[nn.Parameter]:
        assert which in ADAPTERS, f"adapter must be one of {ADAPTERS}, got {which!r}"
        return [getattr(self, f"{which}_A"), getattr(self, f"{which}_B")]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        # a zero scale skips the branch entirely (ablation, not a multiply by zero)
        if self.retain_scale != 0:
            out = out + (x @ self.retain_A.T @ self.retain_B.T) * (self.retain_scaling * self.retain_scale)
        if self.forget_scale != 0:
            out = out + (x @ self.forget_A.T @ self.forget_B.T) * (self.forget_scaling * self.forget_scale)
        return out

    def extra_repr(self) -> str:
        return (f"in={self.base.in_features}, out={self.base.out_features}, retain_rank={self.retain_A.shape[0]}, "
                f"forget_rank={self.forget_A.shape[0]}, scales=({self.retain_scale}, {self.forget_scale})")


def install(model: nn.Module, target_modules: list[str], layers: list[int] | None, retain_rank: int,
            retain_alpha: float, forget_rank: int, forget_alpha: float) -> list[str]:
    """Freeze every weight of `model`, then replace each targeted nn.Linear (by last name component,
    in decoder layers `layers` or all) with a DualLoRALinear. Returns the replaced module names."""
    assert not dual_modules(model), "model already has dual adapters"
    model.requires_grad_(False)
    present = {n.split(".")[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    missing = set(target_modules) - present
    if missing:
        raise ValueError(f"routing target_modules {sorted(missing)} not in the model; linear modules: {sorted(present)}")
    layer_ids = {int(m.group(1)) for n, _ in model.named_modules() if (m := _LAYER.search(n + "."))}
    if layers is not None:
        bad = set(layers) - layer_ids
        if bad or not layers:
            raise ValueError(f"routing layers {sorted(bad) or layers} invalid; the model has layers {sorted(layer_ids)}")
    chosen = []
    for name, mod in list(model.named_modules()):
        if not isinstance(mod, nn.Linear) or name.split(".")[-1] not in target_modules:
            continue
        m = _LAYER.search(name)
        if m is None:  # e.g. lm_head: not inside a decoder layer
            continue
        if layers is not None and int(m.group(1)) not in layers:
            continue
        chosen.append(name)
    if not chosen:
        raise ValueError(f"routing: no linear module matched target_modules={target_modules}, layers={layers}")
    for name in chosen:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, DualLoRALinear(getattr(parent, child), retain_rank, retain_alpha,
                                              forget_rank, forget_alpha))
    return chosen


def dual_modules(model: nn.Module) -> list[DualLoRALinear]:
    return [m for m in model.modules() if isinstance(m, DualLoRALinear)]


def adapter_params(model: nn.Module, which: str) -> list[nn.Parameter]:
    mods = dual_modules(model)
    assert mods, "model has no DualLoRALinear modules"
    return [p for m in mods for p in m.adapter_params(which)]


def set_scales(model: nn.Module, retain: float, forget: float) -> None:
    mods = dual_modules(model)
    assert mods, "set_scales: model has no DualLoRALinear modules"
    for m in mods:
        m.retain_scale, m.forget_scale = float(retain), float(forget)


def get_scales(model: nn.Module) -> tuple[float, float]:
    scales = {(m.retain_scale, m.forget_scale) for m in dual_modules(model)}
    assert len(scales) == 1, f"dual adapters disagree on their scales: {scales}"
    return scales.pop()


@contextmanager
def scales(model: nn.Module, retain: float, forget: float):
    """set_scales for the duration of a block, then restore the previous scales (even on error)."""
    before = get_scales(model)
    set_scales(model, retain, forget)
    try:
        yield
    finally:
        set_scales(model, *before)


@contextmanager
def grad_mask(model: nn.Module, retain: float = 1.0, forget: float = 1.0):
    """Multiply each adapter's parameter gradients by 0 or 1 during the backward passes run inside.
    A mask of 0 replaces the gradient by exact zeros before it is accumulated into .grad (so no
    NaN * 0 issues and earlier accumulated gradients are untouched); a mask of 1 adds no hook."""
    handles = []
    for which, keep in (("retain", retain), ("forget", forget)):
        assert keep in (0, 1), f"grad_mask: {which} mask must be 0 or 1, got {keep}"
        if keep == 0:
            handles += [p.register_hook(torch.zeros_like) for p in adapter_params(model, which)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
