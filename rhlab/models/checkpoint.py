"""LoRA wrapping and resumable checkpoints (safetensors weights + optimizer state), written atomically."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from rhlab.utils import user_mode


def add_lora(model, spec):
    from peft import LoraConfig, get_peft_model

    names = {n.split(".")[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    missing = set(spec.target_modules) - names
    if missing:
        raise ValueError(f"model.lora.target_modules: {sorted(missing)} not in the model; "
                         f"linear modules present: {sorted(names)}")
    cfg = LoraConfig(r=spec.r, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                     target_modules=list(spec.target_modules), bias="none")
    return get_peft_model(model, cfg)


def trainable_state(model) -> dict[str, torch.Tensor]:
    """Only what training changes: adapter weights under LoRA, every weight otherwise; CPU copies
    (safetensors files are device-free; load_weights puts them back on the model's device)."""
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    return {k: v.detach().cpu().clone().contiguous() for k, v in model.state_dict().items() if k in names}


def read_json(path: str | Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def save(trainer, root: Path, step: int, keep: int = 1) -> Path:
    """checkpoints/step_XXXXX/{weights.safetensors, optimizer.pt, state.json}; tmp dir then rename."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:05d}"
    tmp = root / f".tmp_step_{step:05d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file(trainable_state(trainer.model), tmp / "weights.safetensors")
    user_mode(tmp / "weights.safetensors")
    torch.save({"opt": trainer.opt.state_dict(), "sched": trainer.sched.state_dict()}, tmp / "optimizer.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, "run_name": trainer.name,
                                                "model": trainer.cfg.model.name,
                                                "lora": trainer.cfg.model.lora.enabled,
                                                "baseline": trainer.baseline.state() if trainer.baseline else None,
                                                "intervention": trainer.intervention.state_dict()}))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in sorted(root.glob("step_*"))[:-keep]:
        shutil.rmtree(old)
    return final


def latest(root: Path) -> Path | None:
    done = sorted(p for p in root.glob("step_*") if (p / "state.json").exists()) if root.exists() else []
    return done[-1] if done else None


def load_weights(model, ckpt_dir: Path) -> None:
    device = next(model.parameters()).device
    state = load_file(str(Path(ckpt_dir) / "weights.safetensors"), device=str(device))
    missing_unexpected = model.load_state_dict(state, strict=False)
    if missing_unexpected.unexpected_keys:
        raise ValueError(f"{ckpt_dir}: weights not in the model: {missing_unexpected.unexpected_keys[:5]}")
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    if trainable - set(state):
        raise ValueError(f"{ckpt_dir}: checkpoint lacks trainable weights {sorted(trainable - set(state))[:5]}")


def load(trainer, ckpt_dir: Path) -> None:
    load_weights(trainer.model, ckpt_dir)
    # to the CPU whatever device wrote it: Optimizer.load_state_dict moves each state tensor to its
    # parameter's device and dtype (and keeps Adam's step counts on the CPU, as a fresh optimizer has them)
    opt = torch.load(ckpt_dir / "optimizer.pt", weights_only=True, map_location="cpu")
    trainer.opt.load_state_dict(opt["opt"])
    trainer.sched.load_state_dict(opt["sched"])
    state = read_json(ckpt_dir / "state.json")
    trainer.step = state["step"]
    if trainer.baseline is not None:
        trainer.baseline.load(state["baseline"])
    # checkpoints written before interventions kept state hold none: an arm that needs some says so
    trainer.intervention.load_state_dict(state.get("intervention", {}))
