"""The LeetCode recipe (configs/leetcode_qwen3_4b.yaml) on a GPU at the real model size: seconds per RL step
by phase and peak GPU memory of the sampling and training phases.

No model hub here, so the policy is a *random-weight* model of the named architecture (Qwen3-4B: 36 layers,
hidden 2560, ...) with the tests' small chat tokenizer (sampling stays inside its vocabulary; the head and the
logits keep the real 151,936 width). Random weights rarely emit EOS, so every completion runs to
max_new_tokens: the worst case for time and memory. Sampling uses rhlab's fast sampler (vLLM is not needed).

    python benchmarks/gpu_leetcode_step.py --arch qwen3-4b --prompts 4 --generations 16 --new-tokens 1536 \
        --steps 2 --out gpu_leetcode.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tests' chat tokenizer (trained on the shipped LeetCode fixture)

ARCHS = {  # published configs (config.json of the Qwen3 checkpoints)
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
                     rope_theta=1_000_000, max_position_embeddings=40960),
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
                       rope_theta=1_000_000, max_position_embeddings=40960),
}


def make_model(arch: str, out: Path) -> Path:
    from conftest import make_chat_tokenizer
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = make_chat_tokenizer()
    cfg = Qwen3Config(**ARCHS[arch], eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    with torch.device("cuda"):  # initialising 4B parameters on the CPU takes minutes
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    del model
    torch.cuda.empty_cache()
    return out


def run(model_dir: Path, args, tmp: str) -> dict:
    from rhlab.config import load_config
    from rhlab.trainer import Trainer

    batch = args.prompts * args.generations
    over = [f"model.name={model_dir}", f"output_dir={tmp}", "run_name=bench", "log.progress=false",
            f"env.params.train_file={ROOT / 'tests/data/leetcode_mini.jsonl'}", "env.params.eval_file=''",
            f"sampling.backend={args.backend}", f"sampling.max_new_tokens={args.new_tokens}",
            f"train.batch_size={batch}", f"train.num_generations={args.generations}",
            f"train.gradient_accumulation_steps={batch // args.micro}", "log.eval_every=0", "log.save_every=0",
            f"sandbox.isolation={args.isolation}"]
    trainer = Trainer(load_config(str(ROOT / "configs/leetcode_qwen3_4b.yaml"), over))
    peaks: dict[str, float] = {}
    rollout = trainer.rollout

    def measured_rollout(*a, **k):  # split the step's peak memory into sampling and training
        torch.cuda.reset_peak_memory_stats()
        out = rollout(*a, **k)
        torch.cuda.synchronize()
        peaks["sample"] = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.reset_peak_memory_stats()
        return out

    trainer.rollout = measured_rollout
    rows = []
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        row, _ = trainer.train_step(step)
        torch.cuda.synchronize()
        rows.append({**row, "wall": time.perf_counter() - t0, "peak_sample_gib": peaks["sample"],
                     "peak_train_gib": torch.cuda.max_memory_allocated() / 2**30})
        print(json.dumps({k: v for k, v in rows[-1].items() if k.startswith(("time/", "peak", "wall",
                                                                               "completion_len", "step"))}))
    timed = rows[1:] or rows  # the first step includes CUDA warm-up
    keys = ["time/generate", "time/score", "time/logprobs", "time/backward", "time/optimizer", "wall"]
    return {"arch": args.arch, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "batch": batch, "generations": args.generations, "new_tokens": args.new_tokens, "micro": args.micro,
            "backend": args.backend, "steps_timed": len(timed),
            "median_s": {k: round(statistics.median(r[k] for r in timed), 2) for k in keys},
            "completion_len": statistics.mean(r["completion_len"] for r in rows),
            "peak_sample_gib": round(max(r["peak_sample_gib"] for r in rows), 2),
            "peak_train_gib": round(max(r["peak_train_gib"] for r in rows), 2),
            "n_trainable": sum(p.numel() for p in trainer.params)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=sorted(ARCHS), default="qwen3-4b")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--generations", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=1536)
    ap.add_argument("--micro", type=int, default=4, help="completions per micro-batch (the config's is 4)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--backend", default="fast")
    ap.add_argument("--isolation", default="bwrap")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA device"
    with tempfile.TemporaryDirectory() as tmp:
        result = run(make_model(args.arch, Path(tmp) / "model"), args, tmp)
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
