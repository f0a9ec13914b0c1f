"""Sweep files: arms x grid x seeds -> one list of overrides per run.

```yaml
base: demo.yaml            # run config, relative to this file (or an inline `config:` mapping)
output_dir: runs/my_sweep  # relative to the working directory (an output)
seeds: [1, 2, 3]
fixed: {train.steps: 40}   # applied to every run
arms:                      # name -> overrides; the arm name is set as `arm`
  vanilla: {}
  kl: {train.beta: 0.2}
grid: {train.lr: [1e-4, 2e-4]}   # cartesian product, crossed with arms and seeds
workers: 2                 # local processes (default: one per core)
threads_per_worker: 1
report:                    # optional: `rhlab sweep` builds the report when the runs are done
  out: reports/my_sweep    # report.html, tables, pareto.png (relative to the working directory)
  reference: vanilla       # arm for delta SafePass
  hypotheses: hyp.yaml     # preregistered claims (relative to this file)
  tables: [projection]     # extra tables by name (rhlab/report/extra.py): projection, overopt, routing
```
Paths inside the sweep's own values (config, fixed, arms, grid: e.g. env.params.rm_dir) are
relative to this file, like those of a run config; --grid / --fixed values on the command line
are relative to the working directory.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from rhlab.config import (
    PATH_KEYS,
    ConfigError,
    RunConfig,
    load_config,
    load_yaml_file,
    resolve_paths,
    run_name,
)
from rhlab.report.extra import check_table
from rhlab.utils import format_validation_error


class ReportSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    out: str
    reference: str | None = None
    hypotheses: str | None = None
    tables: list[Annotated[str, AfterValidator(check_table)]] = Field(default_factory=list,
        description="extra tables by name (rhlab.report.extra.TABLES), each printed and written to OUT/NAME_table.md")


class SweepSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    base: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    output_dir: str = "runs/sweep"
    seeds: list[int] = Field(default_factory=lambda: [42], min_length=1, description="one run per seed")
    fixed: dict[str, Any] = Field(default_factory=dict)
    arms: dict[str, dict[str, Any]] = Field(default_factory=lambda: {"vanilla": {}}, min_length=1,
                                            description="arm name -> its overrides")
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    workers: int = Field(0, ge=0)  # 0 = one per core
    threads_per_worker: int = Field(1, gt=0)
    gpus_per_run: float = Field(0.0, ge=0)  # ray backend only
    report: ReportSpec | None = None


@dataclass
class PlannedRun:
    name: str
    arm: str
    seed: int
    overrides: list[str]
    config: RunConfig = field(repr=False)

    @property
    def run_dir(self) -> Path:
        return Path(self.config.output_dir) / self.name


def _kv(d: dict[str, Any]) -> list[str]:
    return [f"{k}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}"
            for k, v in d.items()]


def load_sweep(path: str | Path, extra_grid: dict[str, list] | None = None,
               extra_fixed: dict[str, Any] | None = None) -> tuple[SweepSpec, Path | None]:
    path = Path(path)
    try:
        spec = SweepSpec.model_validate(load_yaml_file(path, "sweep file") or {})
    except ValidationError as e:
        raise ConfigError(f"invalid config (sweep {path}): {format_validation_error(e, SweepSpec)}") from None
    _resolve_sweep_paths(spec, path.parent)
    spec.grid.update(extra_grid or {})
    spec.fixed.update(extra_fixed or {})
    if spec.base and spec.config:
        raise ConfigError(f"{path}: give either base or config, not both")
    base = (path.parent / spec.base) if spec.base else None
    if base is not None and not base.exists():
        raise ConfigError(f"{path}: base config not found: {base}")
    for k, vals in spec.grid.items():
        if not isinstance(vals, list) or not vals:
            raise ConfigError(f"{path}: grid.{k} must be a non-empty list")
    if spec.report and spec.report.hypotheses:
        hyp = path.parent / spec.report.hypotheses
        if not hyp.exists():
            raise ConfigError(f"{path}: report.hypotheses not found: {hyp}")
        spec.report.hypotheses = str(hyp)
    if spec.report and spec.report.reference and spec.report.reference not in spec.arms:
        raise ConfigError(f"{path}: report.reference {spec.report.reference!r} is not an arm; "
                          f"allowed: {', '.join(spec.arms)}")
    return spec, base


def _resolve_sweep_paths(spec: SweepSpec, base: Path) -> None:
    """The sweep file's own path values, relative to its directory (see the module docstring)."""
    resolve_paths(spec.config, base)
    spec.fixed = {k: _resolve_value(k, v, base) for k, v in spec.fixed.items()}
    spec.arms = {arm: {k: _resolve_value(k, v, base) for k, v in over.items()} for arm, over in spec.arms.items()}
    spec.grid = {k: [_resolve_value(k, v, base) for v in vals] if isinstance(vals, list) else vals
                 for k, vals in spec.grid.items()}


def _resolve_value(key: str, value: Any, base: Path) -> Any:
    """The value of one `key.path: value` override, made absolute when the key holds a path."""
    keys = key.split(".")
    if not any(tuple(keys) == pk[:len(keys)] for pk in PATH_KEYS) and key != "model.name":
        return value  # neither a path key nor a section holding one (e.g. intervention.params.pair_params)
    nested = value
    for k in reversed(keys):
        nested = {k: nested}
    resolve_paths(nested, base)
    for k in keys:
        nested = nested[k]
    return nested


def expand(spec: SweepSpec, base: Path | None) -> list[PlannedRun]:
    """Every arm x grid point x seed, validated now so a typo fails before any run starts."""
    keys = list(spec.grid)
    runs, names = [], set()
    for arm, arm_over in spec.arms.items():
        for values in itertools.product(*(spec.grid[k] for k in keys)):
            for seed in spec.seeds:
                over = (_kv(spec.config) if base is None else []) + _kv(spec.fixed) + _kv(arm_over) + \
                       _kv(dict(zip(keys, values))) + [f"arm={arm}", f"seed={seed}",
                                                       f"output_dir={spec.output_dir}",
                                                       f"threads={spec.threads_per_worker}"]
                try:
                    cfg = load_config(base, over)
                except ConfigError as e:
                    raise ConfigError(f"sweep arm {arm!r}, {dict(zip(keys, values))}, seed {seed}: {e}") from None
                name = run_name(cfg, always=tuple(keys))
                if name in names:
                    raise ConfigError(f"two sweep runs share the name {name}: make arms differ in config")
                names.add(name)
                over.append(f"run_name={name}")
                cfg.run_name = name
                runs.append(PlannedRun(name, arm, seed, over, cfg))
    return runs


def default_workers(spec: SweepSpec) -> int:
    return spec.workers or max(1, (os.cpu_count() or 1) // spec.threads_per_worker)
