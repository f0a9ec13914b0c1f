"""Config validation errors name the key and the allowed values; run names carry hyperparameters."""

import pytest

from rhlab.config import ConfigError, load_config, run_name


@pytest.mark.parametrize("override, message", [
    ("train.lrr=1", "train.lrr: unknown key; allowed: adam_betas, algo, baseline_momentum, batch_size"),
    ("train.lr=abc", "train.lr: Input should be a valid number"),
    ("train.loss_type=ppo", "'grpo', 'bnpo', 'dr_grpo', 'dapo', 'cispo' or 'sapo'"),
    ("train.num_generations=5", "train.num_generations=5 must divide train.batch_size=32"),
    ("env.rewards=[{name: happy_count, wt: 1}]", "env.rewards.0.wt: unknown key; allowed: name, params, weight"),
    ("bogus=1", "bogus: unknown key; allowed: arm, env, intervention, log, model"),
    ("train.num_generations=1", "grpo needs groups of at least 2"),
    ("train.scale_rewards=groups", "'group', 'batch' or 'none'"),
])
def test_bad_overrides(override, message):
    with pytest.raises(ConfigError, match=None) as e:
        load_config(None, [override])
    assert message in str(e.value)


def test_missing_file_and_bad_override_syntax(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="key.path=value"):
        load_config(None, ["train.lr"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(bad)


def test_unknown_reward_and_detector_names_fail_when_building():
    from rhlab.envs.base import build_env

    cfg = load_config(None, ["env.rewards=[{name: happy_cnt}]"])
    with pytest.raises(ValueError, match="unknown reward 'happy_cnt'; allowed: happy_binary, happy_count"):
        build_env(cfg.env)
    cfg = load_config(None, ["env.detector.name=nope"])
    with pytest.raises(ValueError, match="unknown hack detector 'nope'; allowed:"):
        build_env(cfg.env)
    cfg = load_config(None, ["env.rewards=[{name: happy_count, params: {max: 3}}]"])
    with pytest.raises(ValueError, match=r"unknown params \['max'\]; allowed: \['max_count'\]"):
        build_env(cfg.env)
    with pytest.raises(ValueError, match="unknown environment 'nope'; allowed: happy_stories"):
        build_env(load_config(None, ["env.name=nope"]).env)


def test_run_name_carries_non_default_hyperparameters_and_seed():
    cfg = load_config(None, ["train.lr=3e-4", "model.lora.enabled=true", "model.lora.r=4", "seed=7"])
    assert run_name(cfg) == "happy_stories_happy_count_grpo_vanilla_loraon_r4_lr3e-4_s7"
    assert run_name(load_config(None, ["run_name=mine"])) == "mine"
