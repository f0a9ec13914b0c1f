"""Discover and load run directories written by the trainer.

A run directory holds ``config.yaml`` (required), ``metrics.jsonl``,
``samples.jsonl`` and ``summary.json`` (each optional: a run that crashed
early may lack them). Missing files make a run incomplete; malformed files
raise :class:`ReportError` naming the file.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

from rhlab.utils import read_jsonl

DEFAULT_ARM = "vanilla"


class ReportError(ValueError):
    """Bad input to the report (malformed file, unknown arm or metric, ...)."""


@dataclass
class Run:
    """One training run as read from its directory."""

    path: Path
    run_name: str
    arm: str
    seed: int | None
    status: str  # "complete" | "running" | "failed" | "incomplete" (no summary.json)
    steps: int | None
    final: dict[str, float] = field(default_factory=dict)
    initial: dict[str, float] = field(default_factory=dict)  # the step-0 evaluation, before training
    metrics: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""

    @property
    def complete(self) -> bool:
        """Only complete runs enter the tables, plots and hypothesis checks."""
        return self.status == "complete"


def discover_run_dirs(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Run dirs among ``paths``: a path with a config.yaml is a run dir, any other
    directory is searched recursively (not descending into run dirs)."""
    found: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise ReportError(f"run path does not exist: {p}")
        if (p / "config.yaml").is_file():
            found.append(p)
            continue
        if not p.is_dir():
            raise ReportError(f"not a run directory (no config.yaml): {p}")
        for root, dirs, files in os.walk(p):
            dirs.sort()
            if "config.yaml" in files:
                found.append(Path(root))
                dirs.clear()  # a run dir's subfolders are not runs
    unique: dict[Path, Path] = {}
    for d in found:
        unique.setdefault(d.resolve(), d)
    if not unique:
        raise ReportError("no run directories (with config.yaml) found under: " + ", ".join(map(str, paths)))
    return sorted(unique.values(), key=lambda d: str(d))


def load_runs(paths: Iterable[str | os.PathLike]) -> list[Run]:
    """Discover and load every run under ``paths``."""
    return [load_run(d) for d in discover_run_dirs(paths)]


def load_run(run_dir: str | os.PathLike) -> Run:
    """Load one run directory."""
    d = Path(run_dir)
    config = _read_yaml(d / "config.yaml")
    has_summary = (d / "summary.json").exists()
    summary = _read_json(d / "summary.json") if has_summary else {}
    status = str(summary.get("status", "incomplete"))
    metrics = _read_rows(d / "metrics.jsonl", torn_tail=status != "complete")  # a running run appends

    final, initial = (_numbers(summary, key, d / "summary.json") for key in ("final", "initial"))

    steps = summary.get("steps")
    if steps is None and metrics:
        steps = max((int(r["step"]) for r in metrics if _is_number(r.get("step"))), default=None)
    seed = config.get("seed", summary.get("seed"))
    return Run(
        path=d,
        run_name=str(config.get("run_name") or summary.get("run_name") or d.name),
        arm=str(config.get("arm") or summary.get("arm") or DEFAULT_ARM),
        seed=int(seed) if _is_number(seed) else None,
        status=status,
        steps=int(steps) if _is_number(steps) else None,
        final=final,
        initial=initial,
        metrics=metrics,
        note="" if has_summary else "no summary.json",
    )


def _numbers(summary: dict[str, Any], key: str, path: Path) -> dict[str, float]:
    """The numeric entries of one evaluation in summary.json ("final" or "initial"); absent is empty."""
    raw = summary.get(key, {}) or {}
    if not isinstance(raw, dict):
        raise ReportError(f"{path}: {key!r} must be a mapping, got {type(raw).__name__}")
    return {k: float(v) for k, v in raw.items() if _is_number(v)}


def _read_rows(path: Path, torn_tail: bool) -> list[dict[str, Any]]:
    """rhlab.utils.read_jsonl, its errors as ReportError."""
    try:
        return read_jsonl(path, torn_tail=torn_tail)
    except (OSError, UnicodeDecodeError) as e:
        raise ReportError(f"{path}: cannot read ({e})") from None
    except ValueError as e:  # names the file and line
        raise ReportError(str(e)) from None


def last_step_samples(run: Run, k: int = 3) -> tuple[int | None, list[dict[str, Any]]]:
    """The first ``k`` samples logged at the run's last sample step."""
    path = run.path / "samples.jsonl"
    if not path.exists():
        return None, []
    best_step: int | None = None
    picked: list[dict[str, Any]] = []
    for row in _read_rows(path, torn_tail=not run.complete):
        step = int(row["step"]) if _is_number(row.get("step")) else -1
        if best_step is None or step > best_step:
            best_step, picked = step, []
        if step == best_step and len(picked) < k:
            picked.append(row)
    return best_step, picked


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ReportError(f"{path}: cannot read ({e})") from None


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(_read_text(path))
    except yaml.YAMLError as e:
        raise ReportError(f"{path}: invalid YAML ({e})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ReportError(f"{path}: expected a mapping at top level, got {type(data).__name__}")
    return data


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(_read_text(path))
    except json.JSONDecodeError as e:
        raise ReportError(f"{path}: invalid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ReportError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not (isinstance(v, float) and math.isnan(v))
