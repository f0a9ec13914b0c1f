"""The arms' oversight metrics: the training detector against the env's hack flag, by hand."""

import math
from types import SimpleNamespace as NS

import pytest
import torch
import yaml

from rhlab.interventions.oversight import base_flags, oversight_stats
from rhlab.interventions.penalties import MonitorPenalty, Screening

T, F = True, False
OVERSEEN = ("monitor_penalty", "screening", "routing")


def test_oversight_stats_by_hand():
    env = [T, T, T, F, F, F, F, F]
    base = torch.tensor([T, T, F, T, F, F, F, F])  # the detector: misses one hack, flags one clean
    used = torch.tensor([T, F, F, T, T, F, F, F])  # after noise: loses a true flag, adds a false one
    s = oversight_stats(base, used, env)
    assert s["overseer/base_flag_rate"] == 3 / 8 and s["overseer/flag_rate"] == 3 / 8
    assert s["overseer/env_hack_rate"] == 3 / 8
    assert s["overseer/base_disagree"] == 2 / 8 and s["overseer/disagree"] == 4 / 8
    assert s["overseer/recall"] == 1 / 3 and s["overseer/fpr"] == 2 / 5 and s["overseer/precision"] == 1 / 3
    none = oversight_stats(torch.zeros(4, dtype=torch.bool), torch.zeros(4, dtype=torch.bool), [F] * 4)
    assert math.isnan(none["overseer/recall"]) and math.isnan(none["overseer/precision"]) and none["overseer/fpr"] == 0
    with pytest.raises(AssertionError, match="3 base, 3 used, 2 env"):
        oversight_stats(base[:3], used[:3], env[:2])


def test_base_flags_from_the_env_or_a_detector():
    batch = NS(prompts=["p"] * 3, completions=["happy happy", "x", "happy"], scores=NS(hack=[F, T, F]))
    assert base_flags(None, batch).tolist() == [F, T, F]
    assert base_flags(lambda p, c: ["happy" in x for x in c], batch).tolist() == [T, F, T]
    with pytest.raises(AssertionError, match="detector returned 1 flags for 3 completions"):
        base_flags(lambda p, c: [T], batch)


@pytest.mark.parametrize("arm", [MonitorPenalty, Screening])
def test_monitor_arms_log_the_flags_they_acted_on(arm):
    # happy_prefix(min_count 2, prefix_words 4) at accuracy 1: the flags are the detector's; the env flags
    # (happy_density >= 3 on these texts) differ on the late hack and the early pair
    comps = ["happy happy happy.", "a b c d happy happy happy.", "happy happy.", "mia ran home."]
    batch = NS(prompts=["p"] * 4, completions=comps, scores=NS(hack=[T, T, F, F]), extra={},
               rewards=torch.tensor([1.0, 1.0, 0.5, 0.0]))
    trainer = NS(cfg=NS(seed=0, train=NS(num_generations=4, algo="grpo", kl_in_reward=False)), step=1)
    a = arm(accuracy=1.0, detector={"name": "happy_prefix", "params": {"min_count": 2, "prefix_words": 4}})
    a.on_scored(trainer, batch)
    flags = batch.extra["monitor_flag" if arm is MonitorPenalty else "exclude"]
    assert flags.tolist() == [T, F, T, F]
    m = a.metrics()
    assert m["overseer/flag_rate"] == m["overseer/base_flag_rate"] == 0.5
    assert (m["overseer/disagree"], m["overseer/recall"], m["overseer/fpr"]) == (0.5, 0.5, 0.5)
    if arm is MonitorPenalty:  # penalty 1 on the flagged ones
        assert batch.rewards.tolist() == [0.0, 1.0, -0.5, 0.0]


def test_every_shipped_overseen_arm_flags_with_a_detector_the_evaluation_does_not_use():
    from pathlib import Path

    from rhlab.config import load_config
    from rhlab.sweep.grid import expand, load_sweep

    configs = Path(__file__).resolve().parents[1] / "configs"
    cfgs = []
    for f in sorted(configs.glob("*.yaml")):
        if f.name.startswith("sweep_") and any(n in f.read_text() for n in OVERSEEN):  # others need data files
            # a model that `make minicode-share` pretrains is not in a fresh clone: the built-in one stands in
            fixed = {"model.name": "builtin:tiny-code"} if "runs/models/" in f.read_text() else {}
            cfgs += [(f"{f.name}:{r.arm}", r.config) for r in expand(*load_sweep(f, extra_fixed=fixed))]
        elif (yaml.safe_load(f.read_text()).get("intervention") or {}).get("name") in OVERSEEN:
            cfgs.append((f.name, load_config(f)))
    seen = set()
    for where, cfg in cfgs:
        iv = cfg.intervention
        if iv.name in OVERSEEN[:2]:
            detector = (iv.params.get("detector") or {}).get("name", "env")
        elif iv.name == "routing":
            detector = iv.params.get("detector", "env")
        else:
            continue
        seen.add(where)
        env_detector = cfg.env.detector.name if cfg.env.detector else None  # mini-code: labels from grading
        assert detector not in ("env", env_detector), f"{where}: the arm flags with {detector}"
    assert {"proj_monitor.yaml", "proj_screening.yaml", "sweep_projection.yaml:monitor", "routing_group.yaml",
            "sweep_routing.yaml:routing_group_recall0.5", "sweep_minicode_projection.yaml:screening"} <= seen
