"""Seconds per RL step on the built-in model (32 completions x 64 new tokens), split by phase.

    .venv/bin/python benchmarks/step_speed.py [--steps 8] [--threads 2]
"""

import argparse
import statistics
import tempfile

import torch

from rhlab.config import load_config
from rhlab.trainer import Trainer

PHASES = ["generate", "score", "logprobs", "backward", "optimizer"]


def measure(overrides: list[str], steps: int, warmup: int = 2) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(None, [f"output_dir={tmp}", "train.batch_size=32", "train.num_generations=16",
                                 "sampling.max_new_tokens=64", "train.beta=0.02", "log.progress=false", *overrides])
        trainer = Trainer(cfg)
        rows = [trainer.train_step(s)[0] for s in range(1, warmup + steps + 1)][warmup:]
    out = {p: statistics.median(r[f"time/{p}"] for r in rows) for p in PHASES}
    out["total"] = statistics.median(r["step_time"] for r in rows)
    out["tokens"] = statistics.mean(r["completion_len"] for r in rows)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    setups = {"full fine-tune": [], "LoRA r8 all-linear": ["model.lora.enabled=true", "model.lora.r=8"]}
    print(f"torch {torch.__version__}, {args.threads} threads, median of {args.steps} steps after 2 warm-up")
    print(f"{'setup':<22}{'s/step':>8}" + "".join(f"{p:>11}" for p in PHASES) + f"{'tok/compl':>11}")
    for name, ov in setups.items():
        m = measure([f"threads={args.threads}", *ov], args.steps)
        print(f"{name:<22}{m['total']:>8.3f}" + "".join(f"{m[p]:>11.3f}" for p in PHASES) + f"{m['tokens']:>11.1f}")


if __name__ == "__main__":
    main()
