"""Doc tables are generated from the committed artifacts in results/ (rhlab.report.results)."""

import json
import shutil

import pytest
import yaml

from rhlab.report.results import BLOCK, ROOT, arms_block, demo_block, doc_files, render, sync_docs
from rhlab.report.runs import ReportError


def test_every_doc_block_is_current():
    stale = sync_docs(check=True)
    assert not stale, "stale results blocks (run `make docs`): " + "; ".join(stale)


def test_blocks_exist_and_name_their_artifacts():
    specs = [m["spec"] for doc in doc_files() for m in BLOCK.finditer(doc.read_text())]
    assert "demo results/demo" in specs
    for spec in specs:
        assert (ROOT / spec.split()[1]).exists(), spec


def test_an_edited_artifact_changes_its_table(tmp_path):
    shutil.copytree(ROOT / "results" / "demo", tmp_path / "demo")
    before = demo_block(tmp_path / "demo")
    s = tmp_path / "demo" / "seed3" / "summary.json"
    summary = json.loads(s.read_text())
    summary["final"]["task_score"] += 0.1
    s.write_text(json.dumps(summary))
    assert demo_block(tmp_path / "demo") != before


def test_unknown_kind_and_bad_options_fail_loudly():
    with pytest.raises(ReportError, match="unknown kind 'nope'; allowed: arms"):
        render("nope results/demo")
    with pytest.raises(ReportError, match="expected key=value"):
        render("arms results/demo hack_rate")
    with pytest.raises(ReportError, match="results block arms: unknown option 'metric'; allowed: metrics,"):
        render("arms results/demo metric=hack_rate")


def test_an_edited_run_artifact_changes_the_arm_and_overopt_tables(tmp_path, monkeypatch):
    import rhlab.report.results as results

    monkeypatch.setattr(results, "ROOT", tmp_path)
    shutil.copytree(ROOT / "results" / "pref_overopt", tmp_path / "exp")
    spec = "arms exp metrics=hack_rate,task_score reference=rm1000_beta0"
    before, fits = render(spec), render("overopt exp")
    assert "| rm250_beta0 | 5 |" in before and "Welch 95 % interval" in before
    run = next(p for p in (tmp_path / "exp" / "runs").iterdir() if p.name.endswith("beta0.05_lr4e-4_schedconstant_g8_steps150_s1"))
    s = json.loads((run / "summary.json").read_text())
    s["final"]["hack_rate"] = 0.99
    (run / "summary.json").write_text(json.dumps(s))
    assert render(spec) != before
    rows = (run / "metrics.jsonl").read_text().splitlines()
    last = json.loads(rows[-1])
    last["reward/gold"] -= 1.0
    (run / "metrics.jsonl").write_text("\n".join(rows[:-1] + [json.dumps(last)]) + "\n")
    assert render("overopt exp") != fits


def _projection_copy(tmp_path, monkeypatch, arm="_vanilla_", seeds=(1, 2)):
    """Two vanilla projection runs copied to tmp_path/exp; returns their run dirs."""
    import rhlab.report.results as results

    monkeypatch.setattr(results, "ROOT", tmp_path)
    src = sorted(p for p in (ROOT / "results" / "projection" / "runs").iterdir()
                 if arm in p.name and int(p.name.rsplit("_s", 1)[1]) in seeds)
    for p in src:
        shutil.copytree(p, tmp_path / "exp" / "runs" / p.name)
    return sorted((tmp_path / "exp" / "runs").iterdir())


def test_seeds_block_lists_every_run_and_its_training_mean(tmp_path, monkeypatch):
    runs = _projection_copy(tmp_path, monkeypatch)
    for i, run in enumerate(runs):  # a training metric set to (i + 1) * step on every logged step
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        (run / "metrics.jsonl").write_text("".join(json.dumps({**r, "x": (i + 1) * r["step"]}) + "\n" for r in rows))
    text = render("seeds exp arms=vanilla final=hack_rate train=x")
    steps = [json.loads(line)["step"] for line in (runs[0] / "metrics.jsonl").read_text().splitlines()]
    hack = json.loads((runs[1] / "summary.json").read_text())["final"]["hack_rate"]
    assert f"| vanilla | 2 | {hack:.3f} | {2 * sum(steps) / len(steps):.3f} |" in text
    assert text.count("| vanilla |") == 2
    windowed = render("seeds exp arms=vanilla train=x config=train.lr window=10")  # logged steps > steps - 10
    late = [s for s in steps if s > steps[-1] - 10]
    lr = yaml.safe_load((runs[0] / "config.yaml").read_text())["train"]["lr"]
    assert windowed.splitlines()[0] == "| arm | train.lr | seed | x (last 10 steps mean) |"
    assert f"| vanilla | {lr} | 1 | {sum(late) / len(late):.3f} |" in windowed
    labelled = render("seeds exp arms=vanilla train=x:late_x,hack_rate window=10 final=pass_rate:final_pass")
    assert labelled.splitlines()[0] == "| arm | seed | final_pass | late_x | hack_rate (last 10 steps mean) |"
    with pytest.raises(ReportError, match="config has no 'train.nope'"):
        render("seeds exp arms=vanilla train=x config=train.nope")
    with pytest.raises(ReportError, match="unknown option 'labels'"):  # labels sit beside their metrics, not in a list
        render("seeds exp arms=vanilla final=hack_rate labels=h")
    with pytest.raises(ReportError, match="unknown arm 'nope'"):
        render("seeds exp arms=nope final=hack_rate")
    with pytest.raises(ReportError, match="no final metric 'nope'"):
        render("seeds exp arms=vanilla final=nope")


def test_module_cos_block_averages_layers_then_windows_then_seeds(tmp_path, monkeypatch):
    runs = _projection_copy(tmp_path, monkeypatch)
    with pytest.raises(ReportError, match="no run logs per-module cosines"):
        render("module_cos exp")
    for i, run in enumerate(runs):  # q_proj: layer 0 at 0.1, layer 1 at 0.3 (+ 0.2 on seed 2); lm_head -0.5
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        late = [{**r, "proj/cos/L0.q_proj": 0.1 + 0.2 * i, "proj/cos/L1.q_proj": 0.3 + 0.2 * i,
                 "proj/cos/lm_head": -0.5} for r in rows]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in late))
    text = render("module_cos exp window=25")
    # q_proj per run: 0.2 and 0.4 -> mean 0.3, SEM 0.1, t(1) 95 % half width 12.706 * 0.1
    assert "| q_proj | 0.300 ± 0.100 [-0.971, 1.571] → 0.300 ± 0.100 [-0.971, 1.571] |" in text
    assert "| lm_head | -0.500 ± 0.000" in text and "vanilla (n = 2)" in text


def test_routing_block_picks_its_columns(tmp_path, monkeypatch):
    _projection_copy(tmp_path, monkeypatch)  # arms without adapter modes show their evaluation as `both`
    text = render("routing exp metrics=hack_rate,kl")
    assert text.splitlines()[0] == "| arm | mode | n | hack_rate | kl |" and "| vanilla | both | 2 |" in text
    with pytest.raises(AssertionError, match="unknown metric 'nope'"):
        render("routing exp metrics=nope")


def test_grade_rounds_reads_paired_rounds_and_refuses_unpaired(tmp_path, monkeypatch):
    import rhlab.report.results as results

    monkeypatch.setattr(results, "ROOT", tmp_path)
    text = (ROOT / "results" / "grade_speed" / "rounds_quiet.log").read_text()
    (tmp_path / "r.log").write_text(text)
    assert "| 1 | 20.7 | C=77 I=3 | 21.3 | C=79 I=1 | 1.03x |" in render("grade_rounds r.log")
    (tmp_path / "r.log").write_text(text[:text.index("### round 1: after")])
    with pytest.raises(ReportError, match="paired"):
        render("grade_rounds r.log")


def test_trajectory_block_keeps_the_named_arms_and_skips_nan(tmp_path, monkeypatch):
    runs = _projection_copy(tmp_path, monkeypatch)
    rows = [json.loads(line) for line in (runs[0] / "metrics.jsonl").read_text().splitlines()]
    rows[0]["hack_rate"] = float("nan")  # a nan step (e.g. a ratio with nothing to divide) is left out
    (runs[0] / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = render("trajectory exp metrics=hack_rate window=20 arms=vanilla")
    assert "| vanilla | 2 |" in text and "nan" not in text
    with pytest.raises(ReportError, match="unknown arm 'nope'"):
        render("trajectory exp metrics=hack_rate arms=nope")


VS_TRL_OUT = """torch 2.13.0+cpu, 2 threads; shape: {...}; median of 6 steps after 2 warm-up; 2 interleaved round(s)

setup                TRL default TRL no-ckpt   rhlab   ratio  ratio vs no-ckpt   ratio per round
full fine-tune             1.235       1.089   0.260    4.3x             4.1x   3.8x 4.6x
LoRA r8 all-linear         1.274       1.211   0.272    4.7x             4.5x   3.6x 5.5x

phases (median seconds per step, median over rounds)
  full fine-tune
    TRL default : generate+score 0.688  logprobs+loss 0.170  backward 0.362  optimizer 0.010
"""


def test_vs_trl_block_reads_the_benchmark_rows(tmp_path, monkeypatch):
    import rhlab.report.results as results

    monkeypatch.setattr(results, "ROOT", tmp_path)
    (tmp_path / "b.txt").write_text(VS_TRL_OUT)
    table = render("vs_trl b.txt")
    assert "| full fine-tune | 1.235 s | 1.089 s | **0.260 s** | **4.3x** | 3.8x 4.6x | 4.1x |" in table
    assert "over 2 interleaved round(s)" in table
    line = render("vs_trl b.txt line=1")
    assert ("0.26 s / 0.27 s (full fine-tune / LoRA r8 all-linear), 4.3x (3.8-4.6x per round) and 4.7x "
            "(3.6-5.5x per round) faster") in line
    (tmp_path / "b.txt").write_text("torch 2.13.0\n")
    with pytest.raises(ReportError, match="no result rows"):
        render("vs_trl b.txt")


def test_vhack_block_lists_each_distinct_direction_once(tmp_path, monkeypatch):
    import rhlab.report.results as results

    monkeypatch.setattr(results, "ROOT", tmp_path)

    def val(modes, med):
        per = {m: {"median_cos": med / 2, "frac_pos": 1.0, "n_modules": 3} for m in (modes or ["a", "b"])}
        return {"model": "m", "pair_set": "p", "modes": modes, "seed": 0, "per_module": {},
                "validation": {"median_cos": med, "frac_pos": 2 / 3, "n_modules": 3, "per_mode": per,
                               "n_train_pairs": 9, "n_heldout_pairs": 3}}

    for i, (modes, med) in enumerate([(None, 0.9), (None, 0.9), (["a"], 0.5)]):  # runs 0 and 1 share a direction
        (tmp_path / "exp" / f"r{i}").mkdir(parents=True)
        (tmp_path / "exp" / f"r{i}" / "v_hack.validation.json").write_text(json.dumps(val(modes, med)))
    text = render("vhack exp")
    assert text.count("| all | full | 9 / 3 | 0.900 | 67% of 3 | 0.45 | 0.45 |") == 1
    assert "| a | full | 9 / 3 | 0.500 | 67% of 3 | 0.25 |  |" in text and "seed 0:" in text
    with pytest.raises(ReportError, match="no \\*.validation.json"):
        render("vhack nothing")


def test_arms_block_at_initial_reads_the_step0_evaluation(tmp_path, monkeypatch):
    runs = _projection_copy(tmp_path, monkeypatch)
    summary = json.loads((runs[0] / "summary.json").read_text())
    summary["initial"]["hack_rate"] = 0.5  # one of vanilla's two seeds
    (runs[0] / "summary.json").write_text(json.dumps(summary))
    other = json.loads((runs[1] / "summary.json").read_text())["initial"]["hack_rate"]
    text = render("arms exp metrics=hack_rate arms=vanilla at=initial")
    assert f"| vanilla | 2 | {(0.5 + other) / 2:.3f}" in text and "step-0 evaluation" in text
    with pytest.raises(ReportError, match="at='start'"):
        render("arms exp metrics=hack_rate at=start")


def test_collect_refuses_a_config_path_outside_the_checkout(tmp_path, monkeypatch):
    """A run's config naming a path of another checkout would be committed as a machine's path: collect fails
    naming the key; the same run with an in-checkout path collects."""
    from rhlab.report.results import collect
    from rhlab.sweep.grid import expand, load_sweep

    monkeypatch.chdir(tmp_path)
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"base: {ROOT / 'configs' / 'proj_minicode_vanilla.yaml'}\noutput_dir: {tmp_path / 'runs'}\n"
                     "seeds: [1]\narms:\n  vanilla: {}\n")
    [run] = expand(*load_sweep(sweep))
    src = next((ROOT / "results" / "projection" / "runs").iterdir())
    run.run_dir.mkdir(parents=True)
    for name in ("summary.json", "metrics.jsonl"):
        shutil.copyfile(src / name, run.run_dir / name)
    config = yaml.safe_load((src / "config.yaml").read_text())
    config["model"]["name"] = "/elsewhere/runs/models/code_share10"
    (run.run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ReportError, match="model.name = '/elsewhere/runs/models/code_share10' is outside"):
        collect(sweep, tmp_path / "out")
    config["model"]["name"] = str(ROOT / "runs" / "models" / "code_share10")  # this checkout's: made relative
    (run.run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    assert collect(sweep, tmp_path / "out") == (1, [])
    assert yaml.safe_load((tmp_path / "out" / "runs" / run.name / "config.yaml").read_text())["model"]["name"] \
        == "runs/models/code_share10"
