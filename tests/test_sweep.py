"""Sweeps: expansion and naming, local parallel runs with skip/resume, failures reported, Ray backend."""

import json
import os

import pytest
import yaml

from rhlab.config import ConfigError
from rhlab.sweep.grid import expand, load_sweep
from rhlab.sweep.runner import run_local

TINY = {"train.batch_size": 4, "train.num_generations": 2, "sampling.max_new_tokens": 8, "train.steps": 2,
        "log.eval_prompts": 2, "log.save_every": 0}


def _sweep(tmp_path, **kw):
    spec = {"config": {"env": {"name": "happy_stories"}}, "output_dir": str(tmp_path / "runs"), "seeds": [1, 2],
            "fixed": TINY, "arms": {"vanilla": {}, "kl": {"train.beta": 0.3}}, **kw}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return load_sweep(path)


def test_expansion_names_carry_grid_values(tmp_path):
    spec, base = _sweep(tmp_path, grid={"train.lr": [1e-4, 3e-4]})
    runs = expand(spec, base)
    assert len(runs) == 2 * 2 * 2
    names = [r.name for r in runs]
    assert len(set(names)) == 8
    assert any("_vanilla_" in n and "_lr1e-4_" in n and n.endswith("_s2") for n in names)  # default lr still named
    assert any("_kl_" in n and "_beta0.3_" in n and "_lr3e-4_" in n for n in names)
    assert all(r.config.run_name == r.name and r.config.threads == 1 for r in runs)


def test_sweep_summary_shows_arm_grid_values_and_seed(tmp_path):
    import io

    from rich.console import Console

    from rhlab.cli import _sweep_table
    from rhlab.sweep.runner import RunResult

    spec, base = _sweep(tmp_path, seeds=[7], grid={"train.lr": [1e-4, 3e-4]})
    runs = expand(spec, base)
    results = [RunResult(r.name, r.arm, r.seed, "complete", 2.0, final={"hack_rate": 0.25}) for r in runs]
    con = Console(file=io.StringIO(), width=200, record=True)
    con.print(_sweep_table(results, runs, ["train.lr"]))
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in con.export_text().splitlines() if "│" in line]
    assert [r[:4] for r in rows] == [["kl", "0.0001", "7", "complete"], ["kl", "0.0003", "7", "complete"],
                                     ["vanilla", "0.0001", "7", "complete"], ["vanilla", "0.0003", "7", "complete"]]
    assert all(r[7] == "0.250" and r[4] == "—" for r in rows)  # hack, and reward not reported


def test_paths_in_a_sweep_file_are_relative_to_it(tmp_path, monkeypatch):
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "s.yaml").write_text("sets: []\n")
    (tmp_path / "mine.yaml").write_text("sets: []\n")
    spec, base = _sweep(tmp_path, seeds=[1], fixed={**TINY, "log.suite": "suites/s.yaml"},
                        arms={"a": {}, "b": {"log.suite": "mine.yaml"}})
    monkeypatch.chdir(tmp_path / "suites")  # the working directory does not matter
    assert [r.config.log.suite for r in expand(spec, base)] == [str(tmp_path / "suites" / "s.yaml"),
                                                                str(tmp_path / "mine.yaml")]


def test_bad_sweep_fails_before_running(tmp_path):
    spec, base = _sweep(tmp_path, arms={"typo": {"train.lrr": 1}})
    with pytest.raises(ConfigError, match="(?s)sweep arm 'typo'.*train.lrr: unknown key"):
        expand(spec, base)
    spec, base = _sweep(tmp_path, arms={"gone": {"model.name": str(tmp_path / "missing")}})
    with pytest.raises(ConfigError, match="sweep arm 'gone'.*model.name: directory not found: .*missing"):
        expand(spec, base)  # a missing input path fails when the sweep is planned, not in a worker


@pytest.mark.slow
def test_unknown_intervention_param_fails_the_dry_run(tmp_path):
    from typer.testing import CliRunner

    from rhlab.cli import app

    _sweep(tmp_path, arms={"vanilla": {"intervention.params.foo": 1}})
    res = CliRunner().invoke(app, ["sweep", str(tmp_path / "sweep.yaml"), "--dry-run"])
    assert res.exit_code != 0
    out = " ".join(res.output.split())  # the console wraps long lines at its width
    assert "intervention.params.foo: unknown key for intervention 'vanilla'; allowed: none" in out


def test_arm_option_keeps_the_named_arms_and_refuses_unknown_ones(tmp_path):
    from typer.testing import CliRunner

    from rhlab.cli import app

    _sweep(tmp_path, seeds=[1, 2], arms={"vanilla": {}, "kl": {"train.beta": 0.3}})
    res = CliRunner().invoke(app, ["sweep", str(tmp_path / "sweep.yaml"), "--dry-run", "--arm", "kl"])
    assert res.exit_code == 0 and "2 runs (1 arms x 1 grid points x 2 seeds)" in res.output
    names = [line.strip() for line in res.output.splitlines() if line.startswith("  ")]
    assert len(names) == 2 and all("beta0.3" in n for n in names), names
    res = CliRunner().invoke(app, ["sweep", str(tmp_path / "sweep.yaml"), "--dry-run", "--arm", "kll"])
    assert res.exit_code != 0 and "--arm 'kll' is not an arm" in " ".join(res.output.split())


def test_local_sweep_runs_skips_and_reports_failures(tmp_path):
    (tmp_path / "empty").mkdir()  # a model directory without config.json: the run crashes loading it
    spec, base = _sweep(tmp_path, seeds=[1], arms={"vanilla": {}, "kl": {"train.beta": 0.3},
                                                   "broken": {"model.name": str(tmp_path / "empty")}})
    results = run_local(expand(spec, base), workers=2)
    status = {r.arm: r.status for r in results}
    assert status == {"vanilla": "complete", "kl": "complete", "broken": "failed"}
    broken = next(r for r in results if r.arm == "broken")
    assert "config.json" in broken.error
    ok = next(r for r in results if r.arm == "kl")
    summary = json.loads((tmp_path / "runs" / ok.name / "summary.json").read_text())
    assert summary["arm"] == "kl" and summary["final"] == ok.final
    again = run_local([r for r in expand(spec, base) if r.arm != "broken"], workers=2)
    assert [r.status for r in again] == ["skipped", "skipped"]


def test_a_run_in_use_is_reported_locked_and_left_alone(tmp_path):
    from rhlab.rundir import RunDirLock
    from rhlab.sweep.runner import _ray_task

    spec, base = _sweep(tmp_path, seeds=[1], arms={"vanilla": {}})
    runs = expand(spec, base)
    with RunDirLock(runs[0].run_dir):  # another holder (flock: a second open file conflicts in-process too)
        results = run_local(runs, workers=1)
        ray_result = _ray_task(runs[0].config.dump(), runs[0].name, "vanilla", 1)  # what a Ray worker runs
    assert ray_result["status"] == "locked" and "is in use by pid" in ray_result["error"]
    assert [r.status for r in results] == ["locked"]
    assert f"{runs[0].run_dir} is in use by pid {os.getpid()}" in results[0].error
    assert [p.name for p in runs[0].run_dir.iterdir()] == ["run.lock"]  # nothing read, nothing written


@pytest.mark.slow
def test_ray_backend_reports_a_crash_and_finishes_the_rest(tmp_path):
    pytest.importorskip("ray")
    import ray

    from rhlab.sweep.runner import run_ray

    (tmp_path / "empty").mkdir()  # a model directory without config.json: the run crashes loading it
    spec, base = _sweep(tmp_path, seeds=[1], arms={"vanilla": {}, "broken": {"model.name": str(tmp_path / "empty")}})
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        results = run_ray(expand(spec, base))
    finally:
        ray.shutdown()
    status = {r.arm: r.status for r in results}
    assert status == {"vanilla": "complete", "broken": "failed"}
    assert (tmp_path / "runs" / next(r.name for r in results if r.arm == "vanilla") / "summary.json").exists()


@pytest.mark.slow
def test_one_command_runs_the_sweep_then_reports(tmp_path):
    """`rhlab sweep FILE` with a report section: runs, then prints the arm table and writes the report."""
    from typer.testing import CliRunner

    from rhlab.cli import app

    out = tmp_path / "report"
    with pytest.raises(ConfigError, match="report.reference 'nope' is not an arm; allowed: kl, vanilla"):
        _sweep(tmp_path, report={"out": str(out), "reference": "nope"})
    with pytest.raises(ConfigError, match="report.hypotheses not found"):
        _sweep(tmp_path, report={"out": str(out), "hypotheses": "missing.yaml"})
    _sweep(tmp_path, seeds=[1], report={"out": str(out), "reference": "vanilla"})
    res = CliRunner().invoke(app, ["sweep", str(tmp_path / "sweep.yaml"), "--workers", "2"])
    assert res.exit_code == 0, res.output
    assert "kl" in res.output and "vanilla" in res.output and "hack_rate" in res.output.replace("\n", "")
    assert "┃ arm     ┃ seed ┃ status   ┃ reward ┃" in res.output  # the summary: one column per run property
    assert (out / "report.html").exists() and (out / "pareto.png").exists()
    res = CliRunner().invoke(app, ["sweep", str(tmp_path / "sweep.yaml"), "--no-report"])
    assert res.exit_code == 0 and "skipped" in res.output and "report:" not in res.output
    _sweep(tmp_path, seeds=[1], report={"out": str(out), "tables": ["overopt"]})  # not a preference sweep
    res = CliRunner().invoke(app, ["sweep", str(tmp_path / "sweep.yaml")])
    assert res.exit_code == 2 and "report table 'overopt'" in res.output and "reward/gold" in res.output


def test_arm_override_paths_nested_in_a_section_are_relative_to_the_sweep_file():
    from pathlib import Path

    from rhlab.sweep.grid import load_sweep

    spec, _ = load_sweep(Path(__file__).resolve().parents[1] / "configs" / "sweep_projection_engage.yaml")
    path = Path(spec.arms["projected_g3"]["intervention.params.pair_params"]["path"])
    assert path.is_absolute() and path.exists() and path.name == "happy_g3.jsonl"
