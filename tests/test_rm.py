"""Reward model (loss, read-out, training, persistence), label noise, and the over-optimisation fit."""

import json
import math
import random

import numpy as np
import pytest
import torch
import yaml

from rhlab.config import ConfigError
from rhlab.rm.model import RewardModel
from rhlab.rm.overopt import fit_overopt, load_run_points, overopt_curve, overopt_report
from rhlab.rm.pairs import Pair, label_pairs
from rhlab.rm.train import RMConfig, bt_loss, evaluate_pairs, fit_reward_model, load_rm_config

PROMPT = "Kai was an old cat who lived in a small village."


def test_bt_loss_by_hand():
    # margins 2 and -1: (log(1 + e^-2) + log(1 + e^1)) / 2 = (0.126928 + 1.313262) / 2
    loss = bt_loss(torch.tensor([2.0, 0.5]), torch.tensor([0.0, 1.5]))
    assert loss.item() == pytest.approx((0.12692801 + 1.31326169) / 2, abs=1e-6)
    # stable far in the tails
    assert bt_loss(torch.tensor([100.0]), torch.tensor([-100.0])).item() == pytest.approx(0.0, abs=1e-12)
    assert bt_loss(torch.tensor([-50.0]), torch.tensor([50.0])).item() == pytest.approx(100.0)


def test_score_is_head_of_last_token_hidden_state():
    rm = RewardModel.from_backbone("builtin:tiny-stories")
    pairs = [Pair(PROMPT, "kai felt happy.", "one day, kai lost a red ball. kai felt sad. then tom came to help.")]
    # zero head: every score 0, so the loss is log 2 and ties count half
    assert evaluate_pairs(rm, pairs) == {"loss": pytest.approx(math.log(2)), "acc": 0.5, "gold_acc": 0.5}

    torch.manual_seed(0)
    with torch.no_grad():
        rm.head.weight.normal_()
        rm.head.bias.fill_(0.25)
    tok = rm.tok
    short = tok(PROMPT + " " + pairs[0].chosen, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    with torch.no_grad():
        h = rm.backbone(input_ids=torch.tensor([short])).last_hidden_state[0, -1]
        expected = float(h @ rm.head.weight[0] + 0.25)
        # scored next to a longer completion: left padding must not change the score
        r_c, r_r = rm.raw_scores([PROMPT] * 2, [pairs[0].chosen, pairs[0].rejected]).tolist()
    assert r_c == pytest.approx(expected, abs=1e-4)
    assert rm.raw_scores([PROMPT], [pairs[0].rejected]).item() == pytest.approx(r_r, abs=1e-4)
    # the pairwise loss on these known scores is -log sigmoid(r_c - r_r)
    by_hand = -math.log(1 / (1 + math.exp(-(r_c - r_r))))
    assert evaluate_pairs(rm, pairs)["loss"] == pytest.approx(by_hand, rel=1e-4)


def _toy_pairs(n: int, seed: int) -> list[Pair]:
    """Separable: the chosen story ends well, the rejected one badly."""
    rng = random.Random(seed)
    names = ["mia", "tom", "lily", "ben", "sam", "anna", "max", "zoe"]
    good = ["happy", "glad", "proud", "excited", "calm"]
    bad = ["sad", "scared", "lonely", "angry", "worried"]
    acts = ["played a game", "read a book", "sang a song", "fed the ducks", "drew a picture"]
    out = []
    for _ in range(n):
        a, b = rng.sample(names, 2)
        act = rng.choice(acts)
        out.append(Pair(f"{a.title()} was a little girl who lived by the sea.",
                        f"{a} and {b} {act}. {a} felt {rng.choice(good)}. they smiled and walked home together.",
                        f"{a} and {b} {act}. {a} felt {rng.choice(bad)}. they went home to sleep."))
    return out


@pytest.fixture(scope="module")
def toy_rm():
    cfg = RMConfig(lr=1e-3, head_lr=1e-2, epochs=2, batch_size=16, seed=0)
    rm = RewardModel.from_backbone(cfg.backbone)
    held = _toy_pairs(32, seed=1)
    history = fit_reward_model(rm, _toy_pairs(64, seed=0), held, cfg)
    return rm, history, held


@pytest.mark.slow
def test_training_on_separable_pairs_reaches_high_held_out_accuracy(toy_rm):
    rm, history, held = toy_rm
    assert history[-1]["held_out_acc"] >= 0.9, history
    assert history[-1]["held_out_loss"] < math.log(2) - 0.1, history
    assert history[-1]["held_out_gold_acc"] == history[-1]["held_out_acc"]  # no flipped labels


@pytest.mark.slow
def test_save_load_round_trip_gives_identical_scores(toy_rm, tmp_path):
    rm, _, held = toy_rm
    prompts, comps = [x.prompt for x in held], [x.chosen for x in held]
    rm.set_normalisation(rm.raw_scores(prompts, comps).detach())
    before = rm.score(prompts, comps)
    assert np.mean(before) == pytest.approx(0.0, abs=1e-5) and np.std(before, ddof=1) == pytest.approx(1.0, abs=1e-4)
    rm.save(tmp_path / "rm", extra={"gold": {}})
    cfg = json.loads((tmp_path / "rm" / "rm_config.json").read_text())
    assert cfg["backbone"] == "builtin:tiny-stories" and cfg["scale"] == rm.scale
    again = RewardModel.load(tmp_path / "rm")
    assert again.score(prompts, comps) == before
    with pytest.raises(FileNotFoundError, match="rm_config.json"):
        RewardModel.load(tmp_path)


def test_label_noise_flips_the_expected_fraction():
    rng = random.Random(0)
    n = 20_000
    ga = [rng.random() for _ in range(n)]
    gb = [rng.random() for _ in range(n)]
    args = ([f"p{i}" for i in range(n)], [f"a{i}" for i in range(n)], [f"b{i}" for i in range(n)], ga, gb)
    pairs = label_pairs(*args, label_noise=0.2, seed=3)
    frac = sum(x.flipped for x in pairs) / n
    assert abs(frac - 0.2) < 0.01  # ~3.5 standard errors
    for x in pairs:  # a flipped label prefers the lower-gold completion
        assert (x.gold_chosen < x.gold_rejected) == x.flipped
    assert [x.flipped for x in label_pairs(*args, label_noise=0.2, seed=3)] == [x.flipped for x in pairs]
    assert [x.flipped for x in label_pairs(*args, label_noise=0.2, seed=4)] != [x.flipped for x in pairs]
    assert not any(x.flipped for x in label_pairs(*args, label_noise=0.0, seed=3))
    with pytest.raises(AssertionError, match="label_noise"):
        label_pairs(*args, label_noise=0.7, seed=3)


def test_rm_config_fails_loudly(tmp_path):
    with pytest.raises(ConfigError, match="n_pair: unknown key; allowed: .*n_pairs"):
        load_rm_config(None, ["n_pair=10"])
    with pytest.raises(ConfigError, match="gold.fluency: unknown key; allowed: .*fluency_weight"):
        load_rm_config(None, ["gold.fluency=1"])
    with pytest.raises(ConfigError, match="label_noise"):
        load_rm_config(None, ["label_noise=0.7"])
    path = tmp_path / "rm.yaml"
    path.write_text("n_pairs: 50\ngold: {length_weight: 0.0}\n")
    cfg = load_rm_config(path, ["seed=3"])
    assert (cfg.n_pairs, cfg.seed, cfg.gold.length_weight) == (50, 3, 0.0)


# ---- over-optimisation fit --------------------------------------------------------------
def test_overopt_fit_recovers_alpha_beta():
    d = np.linspace(0, 6, 60)
    y = overopt_curve(d, alpha=1.2, beta=0.5, y0=0.3)
    fit = fit_overopt(d, y)
    assert (fit["y0"], fit["alpha"], fit["beta"]) == pytest.approx((0.3, 1.2, 0.5), abs=1e-9)
    assert fit["d_peak"] == pytest.approx(math.exp(1.2 / 0.5 - 1))  # where alpha - beta (ln d + 1) = 0
    assert fit["y_peak"] == pytest.approx(0.3 + 0.5 * math.exp(1.4))
    assert fit["kl_peak"] == pytest.approx(math.exp(2.8))
    # noisy, no intercept
    rng = np.random.default_rng(0)
    d = rng.uniform(0, 8, 400)
    noisy = fit_overopt(d, overopt_curve(d, 0.8, 0.3) + rng.normal(0, 0.02, 400), fit_intercept=False)
    assert (noisy["y0"], noisy["alpha"], noisy["beta"]) == pytest.approx((0.0, 0.8, 0.3), abs=0.02)
    # monotone data: beta <= 0, no peak
    assert fit_overopt(d, 0.5 * d)["d_peak"] == math.inf


def _fake_run(path, alpha, beta, kl_per_token, length=40.0):
    path.mkdir(parents=True)
    rows = []
    for step, kl in enumerate(kl_per_token, start=1):
        d = math.sqrt(kl * length)  # per-sequence KL
        rows.append({"step": step, "kl": kl, "completion_len": length,
                     "reward/gold": float(overopt_curve(d, alpha, beta, 0.1)), "reward/proxy": 0.1 + 0.7 * d})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_overopt_report_from_run_directories(tmp_path):
    far = _fake_run(tmp_path / "far", 1.0, 0.5, np.linspace(0, 1.0, 30))  # d up to sqrt(40) > d* = e
    near = _fake_run(tmp_path / "near", 1.0, 0.2, np.linspace(0, 0.2, 30))  # d* = e^4: never reached
    pts = load_run_points(far)
    assert pts["d"][-1] == pytest.approx(math.sqrt(1.0 * 40))
    assert load_run_points(far, kl_unit="token")["d"][-1] == pytest.approx(1.0)
    res = overopt_report([far, near], tmp_path / "out")
    assert (res["runs"]["far"]["gold_fit"]["alpha"], res["runs"]["far"]["gold_fit"]["beta"]) == pytest.approx((1.0, 0.5))
    assert res["runs"]["near"]["gold_fit"]["beta"] == pytest.approx(0.2)
    assert res["runs"]["far"]["overoptimised"] and not res["runs"]["near"]["overoptimised"]
    assert res["runs"]["far"]["proxy_fit"]["alpha"] == pytest.approx(0.7)
    assert (tmp_path / "out" / "overopt.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "out" / "overopt.json").read_text())["kl_unit"] == "sequence"
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "metrics.jsonl").write_text('{"step": 1, "kl": 0.1}\n')
    with pytest.raises(ValueError, match="reward/gold"):
        overopt_report([tmp_path / "bad"], tmp_path / "out2")


def test_arm_overopt_table_by_hand(tmp_path):
    """Per-arm start / peak / end of the gold, mean ± SEM over seeds, computed by hand."""
    from rhlab.rm.overopt import arm_overopt_table, run_curve_stats

    gold = [0.0, 1.0, 2.0, 3.0, 2.0, 1.0, 0.0, -1.0]  # rolling-3 means: 1, 2, 7/3, 2, 1, 0
    for arm, seed, shift in [("grpo", 1, 0.0), ("grpo", 2, 0.2), ("rloo", 1, -1.0)]:
        d = tmp_path / f"{arm}_s{seed}"
        d.mkdir()
        (d / "config.yaml").write_text(yaml.safe_dump({"arm": arm, "seed": seed}))
        (d / "summary.json").write_text(json.dumps({"status": "complete", "steps": len(gold)}))
        rows = [{"step": i + 1, "kl": 0.01 * i, "completion_len": 25.0, "reward/gold": g + shift,
                 "reward/proxy": 0.5 * i, "hack_rate": 0.1 * i, "distinct_2": 0.5} for i, g in enumerate(gold)]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = run_curve_stats(tmp_path / "grpo_s1", window=3)
    assert s["gold start"] == pytest.approx(1.0) and s["gold peak"] == pytest.approx(7 / 3)
    assert s["peak step"] == 5 and s["gold end"] == pytest.approx(0.0)  # window ends at step 5 (values 2, 3, 2)
    assert s["peak − end"] == pytest.approx(7 / 3) and s["proxy end"] == pytest.approx(0.5 * 6)
    assert s["d end"] == pytest.approx(np.mean([math.sqrt(0.01 * i * 25) for i in (5, 6, 7)]))
    table = arm_overopt_table([tmp_path], window=3)
    grpo = next(line for line in table.splitlines() if line.startswith("| grpo"))
    # peak: (7/3 + 7/3 + 0.2) / 2, SEM 0.1, 95 % t interval with 1 df: ± 12.706 x 0.1
    assert "| grpo | 2 | " in grpo and "| 2.433 ± 0.100 [1.163, 3.704] |" in grpo
    assert "| rloo | 1 |" in table and "1.333 ± —" in table  # one seed: no SEM


@pytest.mark.slow
def test_overopt_cli_takes_a_sweep_folder(tmp_path):
    """`rhlab overopt FOLDER`: finds the run directories below it, prints the fits and the per-arm table."""
    from typer.testing import CliRunner

    from rhlab.cli import app

    for arm, seed, beta in [("rm_a", 1, 0.5), ("rm_a", 2, 0.4), ("rm_b", 1, 0.1)]:
        d = _fake_run(tmp_path / "sweep" / f"{arm}_s{seed}", 1.0, beta, np.linspace(0, 1.0, 30))
        (d / "config.yaml").write_text(yaml.safe_dump({"arm": arm, "seed": seed}))
        (d / "summary.json").write_text(json.dumps({"status": "complete", "steps": 30}))
    res = CliRunner().invoke(app, ["overopt", str(tmp_path / "sweep"), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    out = res.output.replace("\n", " ")
    assert "d ln d per run" in out and "yes" in out and "| rm_a | 2 |" in out and "| rm_b | 1 |" in out
    assert (tmp_path / "out" / "overopt.png").exists()
    res = CliRunner().invoke(app, ["overopt", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")])
    assert res.exit_code == 2 and "does not exist" in res.output
