"""Many runs per machine: aggregate RL steps per second for N concurrent runs.

Each run is its own process with a fixed torch thread count (the sweep runner's layout),
running the step_speed shape (32 completions x 64 new tokens, built-in model). Prints, per
layout, the median seconds per step of each process and the aggregate steps per second.

    .venv/bin/python benchmarks/concurrent_runs.py [--layouts 1x2,2x1] [--steps 6]
    .venv/bin/python benchmarks/concurrent_runs.py --device cuda --dtype bfloat16 --layouts 1x1,4x1,20x1

A layout NxT is N processes with T threads each. On a GPU all processes share it (run them under
MPS for real concurrency); the published figure to compare with: about 9.4 aggregate steps/s for
20 concurrent 1.25M-model runs on one H200 under MPS.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import tempfile
import time


def _worker(threads: int, steps: int, warmup: int, seed: int, device: str, dtype: str, barrier, out):
    import torch

    from rhlab.config import load_config
    from rhlab.trainer import Trainer

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(None, [f"output_dir={tmp}", f"threads={threads}", f"seed={seed}", "log.progress=false",
                                 "train.batch_size=32", "train.num_generations=16", "sampling.max_new_tokens=64",
                                 f"model.device={device}", f"model.dtype={dtype}"])
        trainer = Trainer(cfg)
        for s in range(1, warmup + 1):
            trainer.train_step(s)
        barrier.wait()  # all processes measure at the same time
        t0 = time.perf_counter()
        times = [trainer.train_step(warmup + s)[0]["step_time"] for s in range(1, steps + 1)]
        out.put((statistics.median(times), time.perf_counter() - t0))


def measure(n: int, threads: int, steps: int, warmup: int, device: str = "cpu", dtype: str = "float32") -> dict:
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(threads, steps, warmup, i, device, dtype, barrier, out)) for i in range(n)]
    for p in procs:
        p.start()
    res = [out.get() for _ in procs]
    for p in procs:
        p.join()
    wall = max(w for _, w in res)
    return {"median_step": statistics.median(m for m, _ in res), "aggregate": n * steps / wall}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layouts", default="1x2,2x1")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (model.device)")
    ap.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16 (model.dtype)")
    args = ap.parse_args()
    print(f"device {args.device}, dtype {args.dtype}, {args.steps} measured steps after {args.warmup} warm-up")
    print(f"{'layout':<10}{'s/step per run':>16}{'aggregate steps/s':>20}")
    for layout in args.layouts.split(","):
        n, t = map(int, layout.split("x"))
        m = measure(n, t, args.steps, args.warmup, args.device, args.dtype)
        print(f"{layout:<10}{m['median_step']:>16.3f}{m['aggregate']:>20.2f}")


if __name__ == "__main__":
    main()
