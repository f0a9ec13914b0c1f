"""Every anticipated failure of the CLI is one line `error: ...` on stderr and exit 2, never a traceback.

Each case runs the real `python -m rhlab` in a subprocess (what a user sees), from a scratch
working directory that holds the bad inputs.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
TINY = ["train.steps=1", "train.batch_size=4", "train.num_generations=2", "sampling.max_new_tokens=8",
        "log.eval_prompts=2", "log.progress=false", "threads=1"]


def rhlab(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "rhlab", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=600)


@pytest.fixture
def scratch(tmp_path):
    (tmp_path / "bad.yaml").write_text("train:\n  steps: 3\n lr: 1\n")  # line 3: bad indentation
    (tmp_path / "bad_sweep.yaml").write_text("base: x.yaml\narms: {a: {}\n")
    (tmp_path / "typo_sweep.yaml").write_text(f"base: {CONFIGS / 'happy_vanilla.yaml'}\nworkerz: 2\n")
    (tmp_path / "no_seeds.yaml").write_text(f"base: {CONFIGS / 'happy_vanilla.yaml'}\nseeds: []\n")
    (tmp_path / "table_sweep.yaml").write_text(f"base: {CONFIGS / 'happy_vanilla.yaml'}\n"
                                               "report: {out: rep, tables: [projection, nope]}\n")
    (tmp_path / "a_file").write_text("")
    (tmp_path / "problems.jsonl").write_text("")
    (tmp_path / "completions.jsonl").write_text("")
    (tmp_path / "run.yaml").write_text("run_name: r\n")
    return tmp_path


HAPPY = str(CONFIGS / "happy_vanilla.yaml")
CASES = [  # id, argv (in the scratch folder), key words of the one-line message
    ("train-bad-yaml", ["train", "bad.yaml"], ["bad.yaml:3:2", "invalid YAML"]),
    ("sweep-bad-yaml", ["sweep", "bad_sweep.yaml"], ["bad_sweep.yaml:3:1", "invalid YAML"]),
    ("sweep-unknown-key", ["sweep", "typo_sweep.yaml", "--dry-run"], ["typo_sweep.yaml", "workerz: unknown key"]),
    ("sweep-no-seeds", ["sweep", "no_seeds.yaml", "--dry-run"],
     ["no_seeds.yaml", "seeds: List should have at least 1"]),
    ("config-not-found", ["train", "nope.yaml"], ["config file not found: nope.yaml"]),
    ("validation", ["train", HAPPY, "train.steps=0"], ["train.steps: Input should be greater than 0"]),
    ("unknown-key", ["train", HAPPY, "train.lrr=1"], ["train.lrr: unknown key; allowed:"]),
    ("bad-override-yaml", ["train", HAPPY, "train.lr=[1,"], ["override 'train.lr=[1,'", "not valid YAML"]),
    ("adam-betas", ["train", HAPPY, "train.adam_betas=[1.0,0.9]"], ["train.adam_betas", "[0, 1)"]),
    ("missing-suite", ["train", str(CONFIGS / "rewrite_softened.yaml"), "log.suite=missing.yaml"],
     ["log.suite: file not found", "missing.yaml"]),
    ("unwritable-output-dir", ["train", "run.yaml", "output_dir=a_file/runs", *TINY],
     ["cannot write the run directory", "a_file/runs/r", "Not a directory"]),
    ("report-out-unwritable", ["report", ".", "--out", "a_file/report"], ["--out: cannot create", "a_file/report"]),
    ("report-unknown-table", ["report", ".", "--out", "rep", "--table", "nope"],
     ["--table: unknown report table 'nope'; allowed: projection, overopt, routing"]),
    ("sweep-unknown-table", ["sweep", "table_sweep.yaml", "--dry-run"],
     ["table_sweep.yaml", "report.tables.1: unknown report table 'nope'; allowed: projection, overopt, routing"]),
    ("eval-prompts-0", ["eval", ".", "--prompts", "0"], ["--prompts must be >= 1 (got 0)"]),
    ("grade-timeout-0", ["grade", "problems.jsonl", "completions.jsonl", "--timeout", "0"],
     ["--timeout must be > 0 (got 0.0)"]),
    ("grade-timeout-negative", ["grade", "problems.jsonl", "completions.jsonl", "--timeout", "-1"],
     ["--timeout must be > 0 (got -1.0)"]),
    ("grade-workers-0", ["grade", "problems.jsonl", "completions.jsonl", "--workers", "0"],
     ["--workers must be >= 1 (got 0)"]),
    ("sweep-workers-0", ["sweep", str(CONFIGS / "sweep_happy_kl.yaml"), "--workers", "0"],
     ["--workers must be >= 1 (got 0)"]),
    ("sweep-arm-detector-params", ["sweep", str(CONFIGS / "sweep_happy_kl.yaml"), "--dry-run",
                                   "--fixed", "intervention.name=screening",
                                   "--fixed", "intervention.params.detector={name: happy_density, params: {x: 1}}"],
     ["intervention.params.detector.params.x: unknown key for hack detector 'happy_density'; allowed: min_count"]),
    ("sweep-grid-no-value", ["sweep", str(CONFIGS / "sweep_happy_kl.yaml"), "--grid", "train.lr", "--dry-run"],
     ["--grid: override 'train.lr' must look like key.path=value"]),
    ("sweep-fixed-bad-yaml", ["sweep", str(CONFIGS / "sweep_happy_kl.yaml"), "--fixed", "train.lr=[1,", "--dry-run"],
     ["--fixed: override 'train.lr=[1,'", "not valid YAML"]),
    ("pretrain-steps-0", ["pretrain", "--steps", "0"], ["--steps must be >= 1 (got 0)"]),
    ("filter-generations-1", ["filter-prompts", HAPPY, "--out", "pool.json", "--generations", "1"],
     ["--generations must be >= 2 (got 1)"]),
    ("not-an-integer", ["eval", ".", "--prompts", "abc"], ["rhlab eval", "Invalid value for '--prompts'"]),
    ("missing-argument", ["train"], ["rhlab train", "Missing argument"]),
]


def _check(res: subprocess.CompletedProcess, words: list[str]) -> None:
    assert "Traceback" not in res.stdout + res.stderr, res.stderr
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


@pytest.mark.parametrize("argv, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(scratch, argv, words):
    _check(rhlab(scratch, *argv), words)


@pytest.mark.slow
def test_run_directory_holding_another_config_is_refused(scratch):
    """The documented refusal: a run directory written by a different config (here: another seed)."""
    out = scratch / "runs"
    (out / "r").mkdir(parents=True)
    (out / "r" / "config.yaml").write_text(yaml.safe_dump({"run_name": "r", "seed": 1}))
    _check(rhlab(scratch, "train", "run.yaml", f"output_dir={out}", *TINY),
           [f"{out / 'r'} holds a run with a different config", "use another run_name or output_dir"])


def test_run_directory_in_use_is_refused_naming_the_holder(scratch):
    hold = subprocess.Popen([sys.executable, "-c", "import sys, time; from rhlab.rundir import RunDirLock; "
                             "lock = RunDirLock(sys.argv[1]); print('held', flush=True); time.sleep(600)",
                             str(scratch / "runs" / "r")], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert hold.stdout.readline() == "held\n"
        _check(rhlab(scratch, "train", "run.yaml", f"output_dir={scratch / 'runs'}", *TINY),
               [f"{scratch / 'runs' / 'r'} is in use by pid {hold.pid} on host"])
    finally:
        hold.kill()
        hold.wait()
