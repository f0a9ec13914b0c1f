"""Evaluate a saved run or checkpoint on held-out prompts."""

from __future__ import annotations

from pathlib import Path

import yaml

from rhlab.config import RunConfig
from rhlab.models import checkpoint as ckpt
from rhlab.utils import write_json


def resolve_checkpoint(target: Path) -> tuple[Path, Path]:
    """(run_dir, checkpoint_dir) from a run directory or a checkpoint directory."""
    target = Path(target)
    if not target.exists():
        raise FileNotFoundError(f"no such run or checkpoint: {target}")
    if (target / "state.json").exists():
        return target.parent.parent, target
    last = ckpt.latest(target / "checkpoints")
    if last is None:
        raise FileNotFoundError(f"{target} has no checkpoints/step_* (is it a run directory?)")
    return target, last


def evaluate_checkpoint(target: Path, n_prompts: int = 64) -> tuple[dict, list[dict], str]:
    from rhlab.trainer import Trainer

    run_dir, ck = resolve_checkpoint(target)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.exists():
        raise FileNotFoundError(f"{cfg_path} missing")
    cfg = RunConfig.model_validate(yaml.safe_load(cfg_path.read_text()))
    trainer = Trainer(cfg, run_dir, lock=False)  # reads the run: may run beside its training
    ckpt.load_weights(trainer.model, ck)
    trainer.cfg.log.eval_prompts = n_prompts  # so the intervention's extra modes use the same prompts
    m, samples = trainer.evaluate(n_prompts)
    for mode, extra in trainer.intervention.extra_evals(trainer).items():  # e.g. routing's adapter ablations
        m.update({f"{mode}/{k}": v for k, v in extra.items()})
    write_json(run_dir / "eval" / f"cli_{ck.name}.json", {"checkpoint": str(ck), "metrics": m, "samples": samples})
    return m, samples, str(ck)
