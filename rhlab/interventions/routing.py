"""Gradient routing: flagged completions update only the forget adapter; ablate it at inference.

Every targeted linear layer gets a retain and a forget LoRA (rhlab/adapters/dual_lora.py). Each
micro-batch is split into flagged / unflagged groups, each back-propagated inside a context that
zeroes some adapters' parameter gradients:

    mode       flagged completions update    the rest update
    none       both (no split)               both
    classic    forget only                   both
    exclusive  forget only                   retain only

The flags come from an overseer: a base detector (`env` = the environment's own hack flag, or
any DETECTORS name with detector_params; the shipped configs use happy_prefix, not the
evaluation's happy_density) passed through noise with the configured recall and false-positive
rate, drawn from a stream seeded by (seed, step) so a resumed run is exact. Each step logs the
overseer's agreement with the env's hack flag (overseer/*, rhlab/interventions/oversight.py).
With route=group, every completion of a prompt whose group holds a flagged completion is routed
as flagged: under group-relative advantages the unflagged members' (negative) advantages are
set by the hack's reward, so they carry the hack signal too.
Evaluations add the modes both (1, 1), retain_only (1, 0) and forget_only (0, 1).
See docs/routing.md.
"""

from __future__ import annotations

import random
from contextlib import nullcontext

import torch

from rhlab.adapters import ALL_LINEAR, dual_lora
from rhlab.interventions.base import INTERVENTIONS, NESTED_CHECKS, Intervention, check_detector
from rhlab.interventions.oversight import base_flags, oversight_stats
from rhlab.rewards.registry import DETECTORS

MODES = ("none", "classic", "exclusive")
ROUTE = ("completion", "group")  # what a flag routes: the flagged completion, or its whole group
# (retain mask, forget mask) for the flagged and the unflagged group of each mode
MASKS = {"classic": {"flagged": (0, 1), "unflagged": (1, 1)},
         "exclusive": {"flagged": (0, 1), "unflagged": (1, 0)}}
EVAL_MODES = {"both": (1.0, 1.0), "retain_only": (1.0, 0.0), "forget_only": (0.0, 1.0)}


class Routing(Intervention):
    name = "routing"

    def __init__(self, mode: str, retain_rank: int, forget_rank: int, retain_alpha: float, forget_alpha: float,
                 target_modules: list[str], layers: list[int] | None, detector: str, detector_params: dict,
                 recall: float, false_positive_rate: float, route: str, eval_modes: bool):
        if mode not in MODES:
            raise ValueError(f"routing mode {mode!r}; allowed: {', '.join(MODES)}")
        if not (0 <= recall <= 1 and 0 <= false_positive_rate <= 1):
            raise ValueError(f"routing recall={recall}, false_positive_rate={false_positive_rate} must lie in [0, 1]")
        if route not in ROUTE:
            raise ValueError(f"routing route {route!r}; allowed: {', '.join(ROUTE)}")
        _check_detector(detector, detector_params)
        self.mode = mode
        self.ranks = dict(retain_rank=retain_rank, retain_alpha=retain_alpha,
                          forget_rank=forget_rank, forget_alpha=forget_alpha)
        self.target_modules, self.layers = list(target_modules), layers
        self.detector_name, self.detector_params = detector, dict(detector_params)
        self.recall, self.fpr = recall, false_positive_rate
        self.route = route
        self.eval_modes = eval_modes
        self.masks = MASKS.get(mode)  # a test may set all-ones masks: the split must then change nothing
        self.detector = None
        self.stats: dict[str, float] = {}

    # ---- once ----------------------------------------------------------------------------
    def prepare_model(self, trainer, model):
        if trainer.cfg.model.lora.enabled:
            raise ValueError("intervention routing installs its own dual adapters: set model.lora.enabled=false")
        dual_lora.install(model, self.target_modules, self.layers, **self.ranks)
        return model

    def setup(self, trainer) -> None:
        # built here, not in the factory: the environments register their detectors on import
        if self.detector_name != "env":
            self.detector = DETECTORS.build(self.detector_name, self.detector_params)

    # ---- each step -----------------------------------------------------------------------
    def on_scored(self, trainer, batch) -> None:
        base = base_flags(self.detector, batch)
        flags = self.oversee(base, trainer.cfg.seed, trainer.step)
        routed = flags
        if self.route == "group":
            g = trainer.cfg.train.num_generations
            assert len(flags) % g == 0, f"{len(flags)} completions do not split into groups of {g}"
            assert all(len(set(batch.prompts[i:i + g])) == 1 for i in range(0, len(flags), g)), \
                "route=group expects each prompt's completions to be contiguous"
            routed = flags.view(-1, g).any(1, keepdim=True).expand(-1, g).reshape(-1)
        batch.extra["routing_flag"] = routed
        # agreement with the env's hack flag (the evaluation's measure) is judged on the overseer's own flags
        self.stats = {**oversight_stats(base, flags, batch.scores.hack), "routing/routed_frac": float(routed.float().mean())}

    def advantages(self, trainer, batch, adv: torch.Tensor) -> torch.Tensor:
        """Unchanged: only logs what pushes each adapter (advantage_split)."""
        self.stats.update(advantage_split(adv, batch.extra["routing_flag"], trainer.cfg.train.num_generations,
                                          batch.scores.hack))
        return adv

    def oversee(self, base: torch.Tensor, seed: int, step: int) -> torch.Tensor:
        """An imperfect overseer: keeps each detected completion with prob recall and flags each
        undetected one with prob false_positive_rate; one uniform draw per completion per step."""
        rng = random.Random(f"{seed}-routing-{step}")
        u = torch.tensor([rng.random() for _ in range(len(base))], dtype=torch.float64)
        return torch.where(base, u < self.recall, u < self.fpr)

    def backward_groups(self, trainer, batch, idx):
        if self.mode == "none":
            return [(idx, nullcontext())]
        flags = batch.extra.get("routing_flag")
        assert flags is not None, "routing: on_scored did not attach routing_flag to the batch"
        sel = flags.to(idx.device)[idx]  # idx: the trainer's chunk indices, on the model's device
        groups = []
        for key, members in (("flagged", idx[sel]), ("unflagged", idx[~sel])):
            if len(members):
                retain, forget = self.masks[key]
                groups.append((members, dual_lora.grad_mask(trainer.model, retain=retain, forget=forget)))
        assert sum(len(g) for g, _ in groups) == len(idx)
        return groups

    def metrics(self) -> dict[str, float]:
        return dict(self.stats)

    # ---- evaluation ----------------------------------------------------------------------
    def extra_evals(self, trainer) -> dict[str, dict]:
        if not self.eval_modes:
            return {}
        out = {}
        for mode, (retain, forget) in EVAL_MODES.items():
            with dual_lora.scales(trainer.model, retain, forget):
                out[mode], _ = trainer.evaluate()
        return out


def advantage_split(adv: torch.Tensor, routed: torch.Tensor, group: int,
                    hack: list[bool] | torch.Tensor | None = None) -> dict[str, float]:
    """Advantages of routed (forget-only) and unrouted (both adapters) completions, and of the unrouted ones
    that share a group with a routed one: under group-relative advantages those are pushed down by the
    hack's reward, and with per-completion routing that push reaches the retain adapter. With the env's hack
    flags, also the unrouted hacks (the overseer missed them): their advantage is the hack signal that
    reaches the retain adapter."""
    adv, routed = adv.detach().float().cpu(), routed.bool().cpu()
    in_hack_group = routed.view(-1, group).any(1, keepdim=True).expand(-1, group).reshape(-1) & ~routed
    nan = float("nan")

    def mean(sel):
        return float(adv[sel].mean()) if sel.any() else nan

    return {"routing/adv_routed": mean(routed), "routing/adv_unrouted": mean(~routed),
            "routing/adv_unrouted_in_routed_groups": mean(in_hack_group),
            "routing/unrouted_in_routed_groups_frac": float(in_hack_group.float().mean()),
            "routing/unrouted_negative_frac": float((adv[~routed] < 0).float().mean()) if (~routed).any() else nan,
            **(_missed_hacks(adv, routed, torch.as_tensor(hack, dtype=torch.bool).cpu()) if hack is not None else {})}


def _missed_hacks(adv: torch.Tensor, routed: torch.Tensor, hack: torch.Tensor) -> dict[str, float]:
    missed = hack & ~routed
    return {"routing/unrouted_hack_frac": float(missed.float().mean()),
            "routing/adv_unrouted_hacks": float(adv[missed].mean()) if missed.any() else float("nan")}


def _check_detector(detector: str, detector_params: dict | None) -> None:
    """detector: env (the environment's hack flag, no detector_params) or a registered hack detector, with
    detector_params its factory accepts."""
    if detector == "env":
        if detector_params:
            raise ValueError("intervention.params.detector_params: routing detector 'env' (the environment's hack "
                             "flag) takes none")
        return
    check_detector(detector, detector_params or {}, "intervention.params.detector",
                   "intervention.params.detector_params")


@INTERVENTIONS.register("routing")
def routing(mode: str = "classic", retain_rank: int = 8, forget_rank: int = 8, retain_alpha: float = 16.0,
            forget_alpha: float = 16.0, target_modules: list[str] | None = None, layers: list[int] | None = None,
            detector: str = "env", detector_params: dict | None = None, recall: float = 1.0,
            false_positive_rate: float = 0.0, route: str = "completion", eval_modes: bool = True) -> Intervention:
    """Dual retain/forget LoRA with gradient routing. detector: 'env' (batch.scores.hack) or a
    DETECTORS name; recall / false_positive_rate model an imperfect overseer."""
    return Routing(mode, retain_rank, forget_rank, retain_alpha, forget_alpha, target_modules or list(ALL_LINEAR),
                   layers, detector, detector_params or {}, recall, false_positive_rate, route, eval_modes)


NESTED_CHECKS["routing"] = lambda p: _check_detector(p.get("detector", "env"), p.get("detector_params"))
