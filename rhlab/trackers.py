"""Optional experiment trackers next to metrics.jsonl (which is always written): `log.report_to`.

- tensorboard: event files in <run_dir>/tensorboard
- wandb: offline mode, files in <run_dir>/wandb (sync later with `wandb sync`)
- trackio: local SQLite store in $TRACKIO_DIR (default <output_dir>/_trackio), project = output dir name

A tracker that fails to start or to log is reported once and switched off: a tracker must
never kill a run.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

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
