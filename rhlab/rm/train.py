"""Train a Bradley-Terry reward model on gold-labelled preference pairs from the initial policy.

    loss = -log sigmoid(r(chosen) - r(rejected)),  averaged over pairs.

`train_reward_model(cfg, out_dir)` samples pairs (or reads cfg.pairs_file), labels them with the
gold reward (+ label noise), holds out a fraction, trains, normalises the scores on the initial
policy's completions, and writes the RM directory:
    model.safetensors, rm_config.json   the reward model (RewardModel.load)
    pairs.jsonl                         every pair with its gold scores, flip flag and split
    base_stats.json                     proxy and gold of every completion (the env's thresholds)
    metrics.json, rm_train.yaml         what happened, and the config that made it
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rhlab.config import ConfigError, read_yaml
from rhlab.envs.preference import GoldConfig, GoldReward
from rhlab.envs.stories import story_prompts
from rhlab.models.loading import load_model
from rhlab.models.sampling import SamplingSpec
from rhlab.rm.model import RewardModel
from rhlab.rm.pairs import Pair, label_pairs, read_pairs, sample_completion_pairs, write_pairs
from rhlab.utils import atomic_write_text, format_validation_error, seed_everything, write_json


class RMConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    backbone: str = "builtin:tiny-stories"  # the reward model's backbone
    policy: str = "builtin:tiny-stories"  # samples the pairs: set it to the RL run's model.name
    seed: int = 0
    out_dir: str = "runs/rm/happy"  # default for the CLI; train_reward_model takes out_dir explicitly
    threads: int = Field(0, ge=0)  # 0 = leave torch's setting alone
    # data
    n_pairs: int = Field(1000, gt=1)
    held_out_frac: float = Field(0.2, gt=0, lt=1)
    label_noise: float = Field(0.0, ge=0, le=0.5)  # probability each label is flipped
    pairs_file: Optional[str] = None  # JSONL of {prompt, chosen, rejected}: skip sampling and gold labelling
    n_prompt_sentences: int = Field(1, gt=0)
    prompt_pool: int = Field(2000, gt=0)
    max_new_tokens: int = Field(64, gt=0)  # match the RL run's sampling so the RM sees the same lengths
    temperature: float = Field(1.0, gt=0)
    sample_batch_size: int = Field(128, ge=2)
    gold: GoldConfig = Field(default_factory=GoldConfig)
    # optimisation
    lr: float = Field(1e-3, gt=0)  # backbone
    head_lr: float = Field(1e-2, gt=0)  # the zero-initialised head needs a larger step
    weight_decay: float = Field(0.0, ge=0)
    epochs: int = Field(3, gt=0)
    batch_size: int = Field(32, gt=0)  # pairs per optimizer step
    max_grad_norm: float = Field(1.0, gt=0)
    freeze_backbone: bool = False
    max_length: int = Field(256, gt=8)


def load_rm_config(path: str | Path | None, overrides: list[str] = ()) -> RMConfig:
    """YAML + dotted overrides (as `rhlab train`), validated; errors name the key and allowed keys."""
    data = read_yaml(path, overrides)
    try:
        return RMConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"invalid reward-model config ({path or 'defaults'}): "
                          f"{format_validation_error(e, RMConfig)}") from None


# ---- loss & evaluation ---------------------------------------------------------------------
def bt_loss(r_chosen: torch.Tensor, r_rejected: torch.Tensor) -> torch.Tensor:
    """Mean of -log sigmoid(r_chosen - r_rejected) (softplus form: stable for large margins)."""
    assert r_chosen.shape == r_rejected.shape and r_chosen.dim() == 1
    return F.softplus(r_rejected - r_chosen).mean()


def pair_margins(rm: RewardModel, pairs: list[Pair], batch_size: int = 64) -> torch.Tensor:
    """r(chosen) - r(rejected) for every pair, raw scores, no grad."""
    out = []
    was_training = rm.training
    rm.eval()
    with torch.no_grad():
        for i in range(0, len(pairs), batch_size):
            b = pairs[i:i + batch_size]
            r = rm.raw_scores([x.prompt for x in b] * 2, [x.chosen for x in b] + [x.rejected for x in b])
            out.append(r[:len(b)] - r[len(b):])
    rm.train(was_training)
    return torch.cat(out)


def evaluate_pairs(rm: RewardModel, pairs: list[Pair], batch_size: int = 64) -> dict:
    """loss, accuracy against the (noisy) labels, and against the clean gold ordering; ties count 1/2."""
    m = pair_margins(rm, pairs, batch_size)
    flipped = torch.tensor([x.flipped for x in pairs])
    right = (m > 0).float() + 0.5 * (m == 0).float()
    gold_right = torch.where(flipped, 1 - right, right)
    return {"loss": float(F.softplus(-m).mean()), "acc": float(right.mean()), "gold_acc": float(gold_right.mean())}


def fit_reward_model(rm: RewardModel, train: list[Pair], held_out: list[Pair], cfg: RMConfig,
                     log=None) -> list[dict]:
    """cfg.epochs passes of minibatch AdamW on the pairwise loss; returns per-epoch metrics."""
    assert train, "no training pairs"
    seed_everything(cfg.seed)
    rm.backbone.requires_grad_(not cfg.freeze_backbone)
    groups = [{"params": list(rm.head.parameters()), "lr": cfg.head_lr}]
    if not cfg.freeze_backbone:
        groups.append({"params": list(rm.backbone.parameters()), "lr": cfg.lr})
    opt = torch.optim.AdamW(groups, weight_decay=cfg.weight_decay)
    order_rng = random.Random(f"{cfg.seed}-rm-order")
    history = []
    for epoch in range(1, cfg.epochs + 1):
        rm.train()
        order = list(range(len(train)))
        order_rng.shuffle(order)
        losses, right = [], []
        for i in range(0, len(order), cfg.batch_size):
            b = [train[j] for j in order[i:i + cfg.batch_size]]
            r = rm.raw_scores([x.prompt for x in b] * 2, [x.chosen for x in b] + [x.rejected for x in b])
            loss = bt_loss(r[:len(b)], r[len(b):])
            assert torch.isfinite(loss), f"reward-model loss is {loss.item()} at epoch {epoch}"
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(rm.parameters(), cfg.max_grad_norm)
            opt.step()
            losses += [loss.item()] * len(b)
            right += ((r[:len(b)] - r[len(b):]).detach() > 0).tolist()
        row = {"epoch": epoch, "train_loss": sum(losses) / len(losses), "train_acc": sum(right) / len(right)}
        if held_out:
            row.update({f"held_out_{k}": v for k, v in evaluate_pairs(rm, held_out).items()})
        history.append(row)
        if log:
            log(row)
    rm.eval()
    return history


# ---- the whole pipeline ----------------------------------------------------------------
def train_reward_model(cfg: RMConfig, out_dir: str | Path, log=print) -> dict:
    """Sample + label pairs, train, normalise, save. Returns the metrics also written to metrics.json."""
    t_start = time.time()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)
    gold = GoldReward(cfg.gold)
    if cfg.pairs_file:
        pairs = read_pairs(cfg.pairs_file)[:cfg.n_pairs]
        if len(pairs) < cfg.n_pairs:
            log(f"pairs_file holds {len(pairs)} pairs (< n_pairs={cfg.n_pairs}): using them all")
        if any(x.gold_chosen is None for x in pairs):  # unlabelled file: keep its labels, record golds
            prompts = [x.prompt for x in pairs] * 2
            g = gold(prompts, [x.chosen for x in pairs] + [x.rejected for x in pairs])
            for x, gc, gr in zip(pairs, g[:len(pairs)], g[len(pairs):]):
                x.gold_chosen, x.gold_rejected, x.flipped = gc, gr, gc < gr
    else:
        sampling = SamplingSpec(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
        pool = story_prompts(cfg.n_prompt_sentences, cfg.prompt_pool)
        policy, tok = (gold.model, gold.tok) if cfg.policy == cfg.gold.reference else load_model(cfg.policy)
        prompts, a, b = sample_completion_pairs(policy, tok, pool, cfg.n_pairs, sampling, cfg.seed,
                                                cfg.sample_batch_size)
        g = gold(prompts * 2, a + b)
        pairs = label_pairs(prompts, a, b, g[:len(a)], g[len(a):], cfg.label_noise, cfg.seed)
    t_data = time.time() - t_start

    n_held = max(1, round(len(pairs) * cfg.held_out_frac))
    assert len(pairs) - n_held >= 1, f"{len(pairs)} pairs leave nothing to train on (held_out_frac)"
    idx = list(range(len(pairs)))
    random.Random(f"{cfg.seed}-rm-split").shuffle(idx)
    held_set = set(idx[:n_held])
    train = [x for i, x in enumerate(pairs) if i not in held_set]
    held_out = [x for i, x in enumerate(pairs) if i in held_set]

    rm = RewardModel.from_backbone(cfg.backbone, cfg.max_length)
    initial = evaluate_pairs(rm, held_out)
    t0 = time.time()
    history = fit_reward_model(rm, train, held_out, cfg,
                               log=lambda r: log(" ".join(f"{k}={v:.4g}" for k, v in r.items())) if log else None)
    t_fit = time.time() - t0

    # normalise on every completion of the initial policy: proxy mean 0, std 1 there
    prompts = [x.prompt for x in pairs] * 2
    comps = [x.chosen for x in pairs] + [x.rejected for x in pairs]
    assert (rm.shift, rm.scale) == (0.0, 1.0)  # so score() returns raw scores here
    raw = torch.tensor(rm.score(prompts, comps))
    rm.set_normalisation(raw)
    proxy = ((raw - rm.shift) / rm.scale).tolist()
    gold_all = [x.gold_chosen for x in pairs] + [x.gold_rejected for x in pairs]
    held_mask = [i in held_set for i in range(len(pairs))] * 2
    hp = [p for p, h in zip(proxy, held_mask) if h]
    hg = [g for g, h in zip(gold_all, held_mask) if h]

    rm.save(out_dir, extra={"gold": cfg.gold.model_dump(), "train_config": cfg.model_dump(mode="json")})
    write_pairs(out_dir / "pairs.jsonl", pairs, ["held_out" if i in held_set else "train" for i in range(len(pairs))])
    write_json(out_dir / "base_stats.json", {"proxy": proxy, "gold": gold_all,
                                             "note": "initial policy's completions: chosen then rejected"})
    atomic_write_text(out_dir / "rm_train.yaml", yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    final = history[-1]
    metrics = {
        "n_pairs": len(pairs), "n_train": len(train), "n_held_out": len(held_out),
        "flip_frac": sum(x.flipped for x in pairs) / len(pairs),
        "initial_held_out_acc": initial["acc"], "initial_held_out_loss": initial["loss"],
        **{k: v for k, v in final.items() if k != "epoch"},
        # how well the proxy tracks the gold on held-out completions of the initial policy
        "held_out_proxy_gold_corr": _corr(hp, hg),
        "gold_mean": float(np.mean(gold_all)), "gold_std": float(np.std(gold_all)),
        "history": history,
        "seconds": {"data": round(t_data, 2), "fit": round(t_fit, 2), "total": round(time.time() - t_start, 2)},
        "out_dir": str(out_dir),
    }
    write_json(out_dir / "metrics.json", metrics)
    return metrics


def _corr(x: list[float], y: list[float]) -> float:
    if len(x) < 2 or np.std(x) == 0 or np.std(y) == 0:
        return math.nan
    return float(np.corrcoef(x, y)[0, 1])


def train_rm_cli(config: str | Path, overrides: list[str] = (), out: str | Path | None = None) -> dict:
    """What `rhlab train-rm CONFIG [overrides] [--out DIR]` runs: out defaults to cfg.out_dir."""
    cfg = load_rm_config(config, list(overrides))
    return train_reward_model(cfg, out or cfg.out_dir)
