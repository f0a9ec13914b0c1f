"""Live progress and the per-run plot. Metrics JSONL is written by the trainer itself."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tqdm import tqdm

from rhlab.utils import read_jsonl


class EMA:
    def __init__(self, alpha: float):
        self.alpha, self.value = alpha, None

    def update(self, x: float) -> float:
        self.value = x if self.value is None else self.alpha * x + (1 - self.alpha) * self.value
        return self.value


class Progress:
    """A progress bar showing live reward and hack rate (EMA over ~10 steps)."""

    def __init__(self, total: int, initial: int, enabled: bool = True):
        self.bar = tqdm(total=total, initial=initial, disable=not enabled, file=sys.stderr,
                        dynamic_ncols=True, desc="train")
        self.ema = {k: EMA(0.2) for k in ("reward_mean", "hack_rate", "task_score")}

    def update(self, row: dict) -> None:
        vals = {k: e.update(row[k]) for k, e in self.ema.items()}
        self.bar.set_postfix(reward=f"{vals['reward_mean']:.3f}", hack=f"{vals['hack_rate']:.2f}",
                             task=f"{vals['task_score']:.2f}", s_step=f"{row['step_time']:.2f}")
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def plot_run(run_dir: str | Path) -> Path:
    """plots/training.png: reward, task score and hack rate over steps, with the held-out evaluations."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert rows, f"{run_dir}/metrics.jsonl is empty"
    steps = [r["step"] for r in rows]
    evals = [json.loads(p.read_text()) for p in sorted((run_dir / "eval").glob("step_*.json"))]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, key, title in zip(axes, ["reward_mean", "task_score", "hack_rate"], ["reward", "task score", "hack rate"]):
        ax.plot(steps, [r[key] for r in rows], color="0.7", lw=0.8, label="train batch")
        ema, smooth = EMA(0.1), []
        for r in rows:
            smooth.append(ema.update(r[key]))
        ax.plot(steps, smooth, color="C0", lw=2, label="EMA")
        ev = [(e["step"], e["metrics"][key]) for e in evals if key in e["metrics"]]
        if ev:
            ax.plot(*zip(*ev), "o", color="C3", label="eval")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(run_dir.name, fontsize=9)
    fig.tight_layout()
    out = run_dir / "plots" / "training.png"
    out.parent.mkdir(exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
