"""Run a planned sweep: local worker processes (default) or Ray tasks.

Local: one subprocess per run (`python -m rhlab train <resolved config>`), at most `workers`
at once, each with its own thread count (one-thread processes, one per core, beat one multi-threaded
process in total throughput: docs/performance.md, concurrent runs). A crashed run is reported, never fatal.
Runs already complete are skipped; a partial run resumes from its last checkpoint. A run whose
directory another process holds (rhlab/rundir.py) is reported as `locked` and left alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rhlab.rundir import RunDirBusy, RunDirLock
from rhlab.sweep.grid import PlannedRun


@dataclass
class RunResult:
    name: str
    arm: str
    seed: int
    status: str  # complete | skipped (already complete) | locked (another process holds it) | failed
    seconds: float = 0.0
    final: dict = field(default_factory=dict)
    error: str = ""
    log: str = ""


def _is_complete(run: PlannedRun) -> bool:
    p = run.run_dir / "summary.json"
    return p.exists() and json.loads(p.read_text()).get("status") == "complete"


def _final(run: PlannedRun) -> dict:
    return json.loads((run.run_dir / "summary.json").read_text()).get("final", {})


def _busy(run: PlannedRun) -> str:
    """The refusal message when another process holds the run directory, else "".
    (A probe: a run that takes the directory after it still makes the worker exit with the message.)"""
    try:
        RunDirLock(run.run_dir).release()
    except RunDirBusy as e:
        return str(e)
    return ""


def _config_file(run: PlannedRun) -> Path:
    cfg = run.config.model_copy(deep=True)
    cfg.log.progress = False
    path = Path(cfg.output_dir) / "_configs" / f"{run.name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg.dump(), sort_keys=False))
    return path


def _run_local(run: PlannedRun) -> RunResult:
    if _is_complete(run):
        return RunResult(run.name, run.arm, run.seed, "skipped", final=_final(run))
    busy = _busy(run)
    if busy:
        return RunResult(run.name, run.arm, run.seed, "locked", error=busy)
    cfg_path = _config_file(run)
    log = Path(run.config.output_dir) / "_logs" / f"{run.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    threads = str(run.config.threads or 1)
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    t0 = time.time()
    with open(log, "w") as f:
        rc = subprocess.run([sys.executable, "-m", "rhlab", "train", str(cfg_path)], stdout=f,
                            stderr=subprocess.STDOUT, env=env).returncode
    secs = time.time() - t0
    if rc != 0 or not _is_complete(run):
        tail = log.read_text().strip().splitlines()[-3:]
        return RunResult(run.name, run.arm, run.seed, "failed", secs, error=f"exit {rc}: {' | '.join(tail)}",
                         log=str(log))
    return RunResult(run.name, run.arm, run.seed, "complete", secs, final=_final(run), log=str(log))


def run_local(runs: list[PlannedRun], workers: int, on_done=None) -> list[RunResult]:
    results: list[RunResult] = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for res in pool.map(_run_local, runs):
            results.append(res)
            if on_done:
                on_done(res)
    return results


def _ray_task(cfg_dict: dict, name: str, arm: str, seed: int) -> dict:
    """Runs inside a Ray worker: the whole run in-process; any exception becomes a failed result."""
    from rhlab.config import RunConfig
    from rhlab.trainer import Trainer

    t0 = time.time()
    try:
        summary = Trainer(RunConfig.model_validate(cfg_dict)).train()
        return {"name": name, "arm": arm, "seed": seed, "status": "complete", "seconds": time.time() - t0,
                "final": summary.get("final", {})}
    except RunDirBusy as e:
        return {"name": name, "arm": arm, "seed": seed, "status": "locked", "error": str(e)}
    except Exception as e:  # noqa: BLE001  (reported in the sweep summary, the sweep goes on)
        return {"name": name, "arm": arm, "seed": seed, "status": "failed", "seconds": time.time() - t0,
                "error": f"{type(e).__name__}: {e}", "log": traceback.format_exc(limit=3)}


def run_ray(runs: list[PlannedRun], address: str | None = None, gpus_per_run: float = 0.0,
            on_done=None) -> list[RunResult]:
    try:
        import ray
    except ImportError:
        raise RuntimeError("the ray backend needs Ray: pip install 'rhlab[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    results, pending = [], {}
    for run in runs:
        if _is_complete(run):
            res = RunResult(run.name, run.arm, run.seed, "skipped", final=_final(run))
            results.append(res)
            if on_done:
                on_done(res)
            continue
        cfg = run.config.model_copy(deep=True)
        cfg.log.progress = False
        task = ray.remote(num_cpus=cfg.threads or 1, num_gpus=gpus_per_run, max_retries=0)(_ray_task)
        pending[task.remote(cfg.dump(), run.name, run.arm, run.seed)] = run
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        pending.pop(done[0])
        res = RunResult(**ray.get(done[0]))
        results.append(res)
        if on_done:
            on_done(res)
    return results
