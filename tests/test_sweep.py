"""Sweeps: expansion and naming, local parallel runs with skip/resume, failures reported, Ray backend."""

import json

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


def test_bad_sweep_fails_before_running(tmp_path):
    spec, base = _sweep(tmp_path, arms={"typo": {"train.lrr": 1}})
    with pytest.raises(ConfigError, match="(?s)sweep arm 'typo'.*train.lrr: unknown key"):
        expand(spec, base)


@pytest.mark.slow
def test_unknown_intervention_param_fails_the_dry_run(tmp_path):
    from typer.testing import CliRunner

    from rhlab.cli import app

    _sweep(tmp_path, arms={"vanilla": {"intervention.params.foo": 1}})
    res = CliRunner().invoke(app, ["sweep", str(tmp_path / "sweep.yaml"), "--dry-run"])
    assert res.exit_code != 0
    out = " ".join(res.output.split())  # the console wraps long lines at its width
    assert "intervention.params.foo: unknown key for intervention 'vanilla'; allowed: none" in out


def test_local_sweep_runs_skips_and_reports_failures(tmp_path):
    spec, base = _sweep(tmp_path, seeds=[1], arms={"vanilla": {}, "kl": {"train.beta": 0.3},
                                                   "broken": {"model.name": str(tmp_path / "missing")}})
    results = run_local(expand(spec, base), workers=2)
    status = {r.arm: r.status for r in results}
    assert status == {"vanilla": "complete", "kl": "complete", "broken": "failed"}
    broken = next(r for r in results if r.arm == "broken")
    assert "missing" in broken.error or "config.json" in broken.error
    ok = next(r for r in results if r.arm == "kl")
    summary = json.loads((tmp_path / "runs" / ok.name / "summary.json").read_text())
    assert summary["arm"] == "kl" and summary["final"] == ok.final
    again = run_local([r for r in expand(spec, base) if r.arm != "broken"], workers=2)
    assert [r.status for r in again] == ["skipped", "skipped"]


@pytest.mark.slow
def test_ray_backend_reports_a_crash_and_finishes_the_rest(tmp_path):
    pytest.importorskip("ray")
    import ray

    from rhlab.sweep.runner import run_ray

    spec, base = _sweep(tmp_path, seeds=[1], arms={"vanilla": {}, "broken": {"model.name": str(tmp_path / "nope")}})
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
    assert (out / "report.html").exists() and (out / "pareto.png").exists()
    res = CliRunner().invoke(app, ["sweep", str(tmp_path / "sweep.yaml"), "--no-report"])
    assert res.exit_code == 0 and "skipped" in res.output and "report:" not in res.output
    _sweep(tmp_path, seeds=[1], report={"out": str(out), "tables": ["overopt"]})  # not a preference sweep
    res = CliRunner().invoke(app, ["sweep", str(tmp_path / "sweep.yaml")])
    assert res.exit_code == 2 and "report table 'overopt'" in res.output and "reward/gold" in res.output
