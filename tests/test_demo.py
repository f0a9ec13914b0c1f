"""The demo preset, its seed table (rhlab.report.demo) and the committed five-seed artifacts."""

import json
import re
import shutil
from pathlib import Path

import pytest

from rhlab.config import load_config
from rhlab.report.demo import collect, interval, load_seed, onset_step, table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "demo"
DOC = ROOT / "docs" / "happy_stories.md"
PRESET = ROOT / "rhlab" / "presets" / "demo.yaml"


def test_onset_step_by_hand():
    steps = list(range(1, 11))
    # trailing 5-step means: steps 5..10 -> 0.2, 0.4, 0.6 (first > 0.5 at step 7), ...
    hack = [0, 0, 0, 0, 1, 1, 1, 1, 1, 1]
    assert onset_step(steps, hack) == 7
    assert onset_step(steps, [0.5] * 10) is None  # exceeds, not reaches
    assert onset_step(steps[:4], [1.0] * 4) is None  # fewer rows than the window


def test_interval_by_hand():
    # mean 3, SEM = sqrt(2.5) / sqrt(5) = 0.7071, t_{0.975, 4} = 2.7764 -> half-width 1.9632
    assert interval([1, 2, 3, 4, 5]) == "3.000 ± 0.707 (95 % t-interval [1.037, 4.963])"


def test_preset_is_the_documented_one():
    cfg = load_config(PRESET)
    assert (cfg.seed, cfg.threads, cfg.train.steps, cfg.train.lr, cfg.train.beta) == (1, 1, 100, 5e-4, 0.02)
    assert cfg.env.rewards[0].params == {"max_count": 8}


def test_doc_table_is_generated_from_the_artifacts(tmp_path):
    doc = DOC.read_text()
    m = re.search(r"<!-- results demo results/demo -->\n(.*?)\n<!-- /results -->", doc, re.S)
    assert m, "docs/happy_stories.md lacks the demo's results block"
    assert m.group(1) == table(RESULTS), "doc table differs from `python -m rhlab.report.demo table results/demo`"
    # an edited artifact changes the table
    shutil.copytree(RESULTS, tmp_path / "demo")
    s = tmp_path / "demo" / "seed1" / "summary.json"
    summary = json.loads(s.read_text())
    summary["final"]["hack_rate"] = 0.25
    s.write_text(json.dumps(summary))
    assert table(tmp_path / "demo") != m.group(1)
    assert table(tmp_path / "demo").endswith("onset in the first 80 % of steps: NO")


def test_committed_seeds_meet_the_demo_criteria():
    seeds = [load_seed(d) for d in sorted(RESULTS.glob("seed*"))]
    assert sorted(r["seed"] for r in seeds) == [1, 2, 3, 4, 5]
    for r in seeds:
        assert r["hack1"] > 0.5 and r["task1"] < r["task0"], r
        assert r["onset"] is not None and r["onset"] <= 0.8 * r["steps"], r


def test_collect_round_trips_a_run_dir(tmp_path):
    """A run dir rebuilt from seed 1's artifacts (summary.json + metrics rows) collects back to the same numbers."""
    import csv

    run = tmp_path / "run"
    run.mkdir()
    shutil.copyfile(RESULTS / "seed1" / "summary.json", run / "summary.json")
    with open(RESULTS / "seed1" / "metrics.csv") as f:
        rows = [{k: int(v) if k == "step" else float(v) for k, v in r.items()} for r in csv.DictReader(f)]
    (run / "metrics.jsonl").write_text("".join(json.dumps({**r, "kl": 0.0}) + "\n" for r in rows))
    dest = collect(run, tmp_path / "results")
    assert dest == tmp_path / "results" / "seed1"
    assert load_seed(dest) == load_seed(RESULTS / "seed1")
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:-1]))
    with pytest.raises(AssertionError, match="metrics rows are not steps 1..N"):
        collect(run, tmp_path / "again")
