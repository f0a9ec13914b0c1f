"""Tracking a run: live progress, the per-run plot, and optional experiment trackers.

metrics.jsonl is written by the trainer itself, always. Next to it (`log.report_to`):
- tensorboard: event files in <run_dir>/tensorboard
- wandb: offline mode, files in <run_dir>/wandb (sync later with `wandb sync`)
- trackio: local SQLite store in $TRACKIO_DIR (default <output_dir>/_trackio), project = output dir name

A tracker that fails to start or to log is reported once and switched off: a tracker must
never kill a run.
"""

from __future__ import annotations

import json
import math
import os
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


# ---- optional experiment trackers (log.report_to) -----------------------------------------
TRACKERS = ("tensorboard", "wandb", "trackio")


def _numeric(row: dict) -> dict[str, float]:
    return {k: float(v) for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and k != "step"}


class _Tensorboard:
    def __init__(self, run_dir: Path, name: str, config: dict):
        from torch.utils.tensorboard import SummaryWriter

        self.w = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, row: dict, step: int):
        for k, v in _numeric(row).items():
            self.w.add_scalar(k, v, step)
        self.w.flush()

    def close(self):
        self.w.close()


class _Wandb:
    def __init__(self, run_dir: Path, name: str, config: dict):
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        self.run = wandb.init(mode="offline", dir=str(run_dir), project="rhlab", name=name, config=config,
                              reinit="finish_previous")

    def log(self, row: dict, step: int):
        self.run.log(_numeric(row), step=step)

    def close(self):
        self.run.finish()


class _Trackio:
    def __init__(self, run_dir: Path, name: str, config: dict):
        os.environ.setdefault("TRACKIO_DIR", str(run_dir.parent / "_trackio"))
        import trackio

        self.trackio = trackio
        self.run = trackio.init(project=run_dir.parent.name or "rhlab", name=name, config=config, embed=False,
                                auto_log_cpu=False, auto_log_gpu=False)

    def log(self, row: dict, step: int):
        self.trackio.log(_numeric(row), step=step)

    def close(self):
        self.trackio.finish()


_MAKERS = {"tensorboard": _Tensorboard, "wandb": _Wandb, "trackio": _Trackio}


class Trackers:
    def __init__(self, names: list[str], run_dir: Path, name: str, config: dict):
        unknown = set(names) - set(TRACKERS)
        if unknown:
            raise ValueError(f"log.report_to: unknown {sorted(unknown)}; allowed: {', '.join(TRACKERS)}")
        self.active = {}
        for n in names:
            try:
                self.active[n] = _MAKERS[n](run_dir, name, config)
            except Exception as e:  # noqa: BLE001  (a tracker never kills a run)
                self._warn(n, "start", e)

    @staticmethod
    def _warn(name: str, what: str, e: Exception):
        print(f"[rhlab] tracker {name} failed to {what} ({type(e).__name__}: {e}); continuing without it",
              file=sys.stderr)

    def _each(self, what: str, fn):
        for n, t in list(self.active.items()):
            try:
                fn(t)
            except Exception as e:  # noqa: BLE001
                self._warn(n, what, e)
                self.active.pop(n)

    def log(self, row: dict, step: int):
        self._each("log", lambda t: t.log(row, step))

    def close(self):
        self._each("close", lambda t: t.close())
