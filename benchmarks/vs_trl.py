"""rhlab's RL step vs TRL's GRPOTrainer on the built-in model, side by side in one process.

Same model, prompts and reward (happy_count); num_generations 16, 32 completions x 64 new
tokens per step, beta 0.02, loss grpo, temperature 1; full fine-tuning and LoRA r8 on all
linear layers. Prints median seconds per step after warm-up, the ratio, and the split into
phases. Needs the optional extra: pip install 'rhlab[trl]'.

    .venv/bin/python benchmarks/vs_trl.py [--steps 6] [--warmup 2] [--threads 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings

import torch

from rhlab.config import load_config
from rhlab.models.loading import load_model, resolve_model_path
from rhlab.rewards.registry import REWARDS
from rhlab.trainer import Trainer

MODEL = "builtin:tiny-stories"
SHAPE = dict(batch=32, generations=16, new_tokens=64, beta=0.02, lr=1e-5)


def rhlab_step_times(lora: bool, steps: int, warmup: int, threads: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        over = [f"output_dir={tmp}", f"model.name={MODEL}", f"train.batch_size={SHAPE['batch']}",
                f"train.num_generations={SHAPE['generations']}", f"sampling.max_new_tokens={SHAPE['new_tokens']}",
                f"train.beta={SHAPE['beta']}", f"train.lr={SHAPE['lr']}", "train.loss_type=grpo",
                f"threads={threads}", "log.progress=false"]
        if lora:
            over += ["model.lora.enabled=true", "model.lora.r=8", "model.lora.alpha=16"]
        trainer = Trainer(load_config(None, over))
        rows = [trainer.train_step(s)[0] for s in range(1, warmup + steps + 1)][warmup:]
    phases = {"generate": "time/generate", "score": "time/score", "logprobs": "time/logprobs",
              "backward": "time/backward", "optimizer": "time/optimizer"}
    out = {k: statistics.median(r[v] for r in rows) for k, v in phases.items()}
    out["step"] = statistics.median(r["step_time"] for r in rows)
    return out


class _Timer:
    """Accumulates wall time of wrapped calls into a per-step dict."""

    def __init__(self):
        self.cur: dict[str, float] = {}

    def wrap(self, name: str, fn):
        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.cur[name] = self.cur.get(name, 0.0) + time.perf_counter() - t0
        return timed


def trl_step_times(lora: bool, steps: int, warmup: int, threads: int, checkpointing: bool) -> dict:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rhlab.components import build_env
    from rhlab.config import load_config as lc

    torch.set_num_threads(threads)
    env = build_env(lc().env)
    prompts = env.prompts[:200]
    happy = REWARDS.build("happy_count", {"max_count": 8})

    def reward(prompts, completions, **kw):
        return happy(prompts, completions)

    timer, step_times, phase_rows = _Timer(), [], []

    class StepClock(TrainerCallback):
        def on_step_begin(self, *a, **kw):
            timer.cur = {}
            self.t0 = time.perf_counter()

        def on_pre_optimizer_step(self, *a, **kw):
            self.t_opt = time.perf_counter()

        def on_optimizer_step(self, *a, **kw):
            timer.cur["optimizer"] = time.perf_counter() - self.t_opt

        def on_step_end(self, *a, **kw):
            step_times.append(time.perf_counter() - self.t0)
            phase_rows.append(dict(timer.cur))

    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = GRPOConfig(output_dir=tmp, use_cpu=True, bf16=False, per_device_train_batch_size=SHAPE["batch"],
                          num_generations=SHAPE["generations"], max_completion_length=SHAPE["new_tokens"],
                          beta=SHAPE["beta"], loss_type="grpo", learning_rate=SHAPE["lr"], temperature=1.0,
                          max_steps=warmup + steps, logging_steps=1, report_to="none", save_strategy="no",
                          seed=0, gradient_checkpointing=checkpointing, disable_tqdm=True)
        tok = load_model(MODEL)[1]
        trainer = GRPOTrainer(model=resolve_model_path(MODEL), reward_funcs=reward, args=args,
                              train_dataset=Dataset.from_dict({"prompt": prompts}), processing_class=tok,
                              peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear") if lora else None,
                              callbacks=[StepClock()])
        trainer.remove_callback(PrinterCallback)  # its per-step log dicts would bury the printed table
        trainer._generate_and_score_completions = timer.wrap("generate+score", trainer._generate_and_score_completions)
        trainer.compute_loss = timer.wrap("logprobs+loss", trainer.compute_loss)
        trainer.accelerator.backward = timer.wrap("backward", trainer.accelerator.backward)
        trainer.train()
    keep = phase_rows[warmup:]
    out = {k: statistics.median(r.get(k, 0.0) for r in keep) for k in ("generate+score", "logprobs+loss",
                                                                      "backward", "optimizer")}
    out["step"] = statistics.median(step_times[warmup:])
    return out


def _median_dicts(ds: list[dict]) -> dict:
    return {k: statistics.median(d[k] for d in ds) for k in ds[0]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat TRL default / TRL no-ckpt / rhlab this many times, interleaved: a VM whose "
                         "speed drifts then hits all three alike; the ratio is taken within each round")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads; shape: {SHAPE}; median of {args.steps} steps "
          f"after {args.warmup} warm-up; {args.rounds} interleaved round(s)")
    rows = []
    for lora in (False, True):
        name = "LoRA r8 all-linear" if lora else "full fine-tune"
        rounds = []
        for _ in range(args.rounds):
            rounds.append((trl_step_times(lora, args.steps, args.warmup, args.threads, checkpointing=True),
                           trl_step_times(lora, args.steps, args.warmup, args.threads, checkpointing=False),
                           rhlab_step_times(lora, args.steps, args.warmup, args.threads)))
        ratios = [a["step"] / c["step"] for a, _, c in rounds]
        ratios_nc = [b["step"] / c["step"] for _, b, c in rounds]
        rows.append((name, *(_median_dicts([r[i] for r in rounds]) for i in range(3)), ratios, ratios_nc))
    # the ratio is paired: TRL / rhlab within each round (measured minutes apart), then the median over
    # rounds; a ratio of the medians would pair a fast round of one with a slow round of the other
    print(f"\n{'setup':<20}{'TRL default':>12}{'TRL no-ckpt':>12}{'rhlab':>8}{'ratio':>8}{'ratio vs no-ckpt':>18}"
          + ("   ratio per round" if args.rounds > 1 else ""))
    for name, a, b, c, ratios, ratios_nc in rows:
        print(f"{name:<20}{a['step']:>12.3f}{b['step']:>12.3f}{c['step']:>8.3f}{statistics.median(ratios):>7.1f}x"
              f"{statistics.median(ratios_nc):>17.1f}x"
              + ("   " + " ".join(f"{x:.1f}x" for x in ratios) if args.rounds > 1 else ""))
    print("\nphases (median seconds per step" + (", median over rounds)" if args.rounds > 1 else ")"))
    for name, a, b, c, *_ in rows:
        print(f"  {name}")
        print("    TRL default : " + "  ".join(f"{k} {v:.3f}" for k, v in a.items() if k != "step"))
        print("    TRL no-ckpt : " + "  ".join(f"{k} {v:.3f}" for k, v in b.items() if k != "step"))
        print("    rhlab       : " + "  ".join(f"{k} {v:.3f}" for k, v in c.items() if k != "step"))


if __name__ == "__main__":
    main()
