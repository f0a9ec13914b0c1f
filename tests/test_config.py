"""Config validation errors name the key and the allowed values; run names carry hyperparameters."""

import pytest

from conftest import LEETCODE_MINI
from rhlab.config import ConfigError, EnvConfig, load_config, run_name


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


@pytest.mark.parametrize("overrides, message", [
    (["env.rewards=[{name: happy_cnt}]"], "env.rewards[0].name: unknown reward 'happy_cnt'; allowed: happy_binary"),
    (["env.detector.name=nope"], "env.detector.name: unknown hack detector 'nope'; allowed:"),
    (["env.rewards=[{name: happy_count, params: {max: 3}}]"],
     "env.rewards[0].params.max: unknown key for reward 'happy_count'; allowed: max_count"),
    (["env.name=nope"], "env.name: unknown environment 'nope'; allowed: happy_stories"),
    (["env.params.foo=1"], "env.params.foo: unknown key for env 'happy_stories'; allowed: n_prompt_sentences, "
                           "pass_threshold, prompt_pool"),
    (["env.params.prompt_pool=many"], "env.params.prompt_pool: Input should be a valid integer"),
    (["intervention.params.foo=1"], "intervention.params.foo: unknown key for intervention 'vanilla'; allowed: none"),
    (["intervention.name=screening", "intervention.params.foo=1"],
     "intervention.params.foo: unknown key for intervention 'screening'; allowed: accuracy, detector, svd"),
    (["intervention.name=screening", "intervention.params.accuracy=high"],
     "intervention.params.accuracy: Input should be a valid number"),
    (["intervention.name=nope"], "intervention.name: unknown intervention 'nope'; allowed:"),
    # a detector named inside an arm's params: checked against the DETECTORS registry too
    (["intervention.name=monitor_penalty", "intervention.params.detector={name: nope}"],
     "intervention.params.detector.name: unknown hack detector 'nope'; allowed:"),
    (["intervention.name=screening", "intervention.params.detector={name: happy_density, params: {min_cout: 1}}"],
     "intervention.params.detector.params.min_cout: unknown key for hack detector 'happy_density'; allowed: min_count"),
    (["intervention.name=screening", "intervention.params.detector={params: {min_count: 1}}"],
     "intervention.params.detector.name: required by a detector ({name, params})"),
    (["intervention.name=routing", "intervention.params.detector=nope"],
     "intervention.params.detector: unknown hack detector 'nope'; allowed:"),
    (["intervention.name=routing", "intervention.params.detector=happy_density",
      "intervention.params.detector_params={min_count: many}"],
     "intervention.params.detector_params.min_count: Input should be a valid integer"),
    (["intervention.name=routing", "intervention.params.detector_params={min_count: 1}"],
     "intervention.params.detector_params: routing detector 'env' (the environment's hack flag) takes none"),
])
def test_nested_params_fail_at_load_in_one_line(overrides, message):
    """env, reward, detector and intervention params are checked against their declared params at load."""
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("env, rewards, detector", [
    ("happy_stories", ["happy_count"], "happy_density"),
    ("minicode", ["correct_or_hinted_compile"], None),
    ("leetcode", ["correct_or_hinted_compile"], None),
    ("preference", ["proxy_rm"], None),
    ("rewrite", ["style", "rules", "risk_penalty"], "fact_drop_or_short"),
])
def test_unset_rewards_and_detector_are_each_environments_own(env, rewards, detector):
    cfg = EnvConfig(name=env)
    assert [r.name for r in cfg.rewards] == rewards and (cfg.detector and cfg.detector.name) == detector
    given = EnvConfig(name=env, rewards=[{"name": "x", "weight": 2.0}])
    assert [(r.name, r.weight) for r in given.rewards] == [("x", 2.0)]


def test_detector_params_alone_keep_the_default_detector():
    assert load_config(None, ["env.detector.params.min_count=2"]).env.detector.model_dump() == \
        {"name": "happy_density", "params": {"min_count": 2}}
    with pytest.raises(ConfigError, match="env.detector.name: Field required"):  # minicode has no default detector
        load_config(None, ["env.name=minicode", "env.detector.params.x=1"])


def test_range_errors_in_arms_are_value_errors_not_asserts():
    from rhlab.interventions.penalties import Monitor
    from rhlab.interventions.projection import Projection

    with pytest.raises(ValueError, match=r"intervention.params.accuracy must be in \[0, 1\], got 1.5"):
        Monitor(1.5, None)
    with pytest.raises(ValueError, match="intervention.params.window must be > 0, got 0"):
        Projection(window=0)


def test_run_name_carries_non_default_hyperparameters_and_seed():
    cfg = load_config(None, ["train.lr=3e-4", "model.lora.enabled=true", "model.lora.r=4", "seed=7"])
    assert run_name(cfg) == "happy_stories_happy_count_grpo_vanilla_loraon_r4_lr3e-4_s7"
    assert run_name(load_config(None, ["run_name=mine"])) == "mine"


def test_every_config_field_is_described_and_docs_config_md_is_current():
    """docs/config.md is what rhlab.config_doc generates (regenerate: python -m rhlab.config_doc > docs/config.md)."""
    from pathlib import Path

    from rhlab.config_doc import _rows, render
    from rhlab.config import RunConfig

    undocumented = [key for key, _, _, desc, _ in _rows(RunConfig) if not desc]
    assert not undocumented, f"config fields without a description: {undocumented}"
    doc = Path(__file__).resolve().parents[1] / "docs" / "config.md"
    assert doc.read_text() == render(), "docs/config.md is stale: python -m rhlab.config_doc > docs/config.md"
    assert "| `train.kl_bias_correction` | `bool` | `false` |" in doc.read_text()


def test_paths_in_a_config_are_relative_to_its_file_and_checked_at_load(tmp_path, monkeypatch):
    """log.suite / env.params.pool_file / rm_dir ...: relative to the config file's directory; on the
    command line, to the working directory; made absolute; a missing input fails at load."""
    conf = tmp_path / "conf"
    (conf / "data").mkdir(parents=True)
    (conf / "data" / "suite.yaml").write_text("sets: []\n")
    (conf / "rm").mkdir()
    (conf / "run.yaml").write_text("log: {suite: data/suite.yaml}\nenv: {name: preference, params: {rm_dir: rm}}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(conf / "run.yaml")
    assert cfg.log.suite == str(conf / "data" / "suite.yaml")
    assert cfg.env.params["rm_dir"] == str(conf / "rm")
    assert "_rm_dirrm_" in run_name(cfg)  # a path enters the run name as its last part, wherever it lives
    (conf / "models" / "share0").mkdir(parents=True)
    local = load_config(None, [f"model.name={conf / 'models' / 'share0'}"])
    name = run_name(local, always=("model.name",))  # a sweep's grid over local models
    assert name.startswith("share0_") and "_nameshare0_" in name and str(tmp_path).replace("/", "-") not in name
    assert "_namebuiltin:tiny-stories_" in run_name(load_config(None), always=("model.name",))
    (elsewhere / "mine.yaml").write_text("sets: []\n")
    assert load_config(conf / "run.yaml", ["log.suite=mine.yaml"]).log.suite == str(elsewhere / "mine.yaml")
    with pytest.raises(ConfigError, match=r"log.suite: file not found: .*elsewhere/nope.yaml \(.*run.yaml; a "
                                          "relative path in a config file is relative to the file's directory"):
        load_config(conf / "run.yaml", ["log.suite=nope.yaml"])
    with pytest.raises(ConfigError, match="env.params.rm_dir: dir not found: .*conf/gone"):
        (conf / "gone.yaml").write_text("env: {name: preference, params: {rm_dir: gone}}\n")
        load_config(conf / "gone.yaml")
    with pytest.raises(ConfigError, match="model.name: directory not found: .*conf/models/x"):
        (conf / "model.yaml").write_text("model: {name: ./models/x}\n")
        load_config(conf / "model.yaml")


def test_every_shipped_config_loads_from_another_working_directory(tmp_path, monkeypatch):
    from pathlib import Path

    configs = Path(__file__).resolve().parents[1] / "configs"
    monkeypatch.chdir(tmp_path)
    cfg = load_config(configs / "rewrite_softened.yaml")
    assert cfg.log.suite == str(configs / "suite_rewrite.yaml")
    for path in sorted(configs.glob("*.yaml")):
        if path.name.startswith(("suite_", "sweep_", "hypotheses_", "rm_")) or "rm_dir" in path.read_text():
            continue  # not run configs, or configs that need a trained reward model
        if "train_file:" in path.read_text():   # the LeetCode recipe: its data is downloaded, not shipped
            with pytest.raises(ConfigError, match=f"env.params.train_file: file not found: {configs.parent}/data/"):
                load_config(path)
            load_config(path, [f"env.params.train_file={LEETCODE_MINI}", "env.params.eval_file=''"])
            continue
        load_config(path)


def test_bad_yaml_names_file_line_and_column(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  steps: 3\n lr: 1\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:3:2: invalid YAML: expected <block end>"):
        load_config(bad)


def test_validation_errors_are_one_line_naming_every_key():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["train.steps=0", "log.eval_prompts=-1"])
    assert str(e.value) == ("invalid config (defaults): train.steps: Input should be greater than 0 (got 0); "
                            "log.eval_prompts: Input should be greater than 0 (got -1)")
