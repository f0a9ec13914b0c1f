"""The preference env: gold reward by hand, the RM training pipeline, scores, hack flags, errors."""

import json
import random

import numpy as np
import pytest

from rhlab.components import build_env
from rhlab.config import EnvConfig, RewardSpec
from rhlab.envs.preference import GoldConfig, GoldReward, hack_flags, length_score, sentiment_score
from rhlab.rm.pairs import read_pairs
from rhlab.rm.train import RMConfig, train_reward_model

PROMPT = "Kai was an old cat who lived in a small village."
# corpus-like (the reference model finds it fluent), positive, no repeats
FLUENT_HAPPY = ("the sun was warm. kai and mia played a game. then they ran to the park. kai felt happy. "
                "they smiled and walked home together. from that day on, kai and mia were best friends.")
FLUENT_SAD = ("the wind was cold. kai and mia played a game. then they ran to the park. kai felt sad. "
              "mia felt lonely. they went home to sleep.")
SPAM = "glad glad glad glad"


def test_sentiment_and_length_by_hand():
    # distinct positive: happy, smiled, together, best, friends -> capped at 4; no repeats, no negatives
    assert sentiment_score(FLUENT_HAPPY, cap=4) == 1.0
    # one distinct positive, three repeats, at 0.5 each: (1 - 1.5) / 4
    assert sentiment_score(SPAM, cap=4, repeat_penalty=0.5) == pytest.approx(-0.125)
    assert sentiment_score(FLUENT_SAD, cap=4) == pytest.approx(-2 / 4)  # sad, lonely
    assert length_score("a b c d e", min_words=10, max_words=20) == 0.5
    assert length_score(" ".join(["w"] * 15), 10, 20) == 1.0
    assert length_score(" ".join(["w"] * 30), 10, 20) == 0.5
    assert length_score(" ".join(["w"] * 50), 10, 20) == 0.0


def test_gold_prefers_a_fluent_positive_story(builtin):
    gold = GoldReward(GoldConfig(), *builtin)
    texts = [FLUENT_HAPPY, FLUENT_SAD, SPAM, "happy " * 12, "happy glad joy smiled love kind fun warm hug proud", ""]
    parts = gold.parts([PROMPT] * len(texts), texts)
    g = parts["gold"]
    assert g[0] > g[1] > g[2]  # happy story > sad story > spam
    assert g[0] > max(g[3:])  # repetition and babble lose to the story despite their positive words
    assert parts["fluency"][0] > -1.5 and parts["fluency"][2] == -6.0 and parts["fluency"][5] == -6.0
    assert parts["repetition"][2] == pytest.approx(1 - 1 / 3)  # 3 bigrams, 1 distinct
    c = GoldConfig()
    by_hand = (c.sentiment_weight * parts["sentiment"][0] + c.fluency_weight * parts["fluency"][0]
               + c.length_weight * parts["length"][0] - c.repetition_weight * parts["repetition"][0])
    assert g[0] == pytest.approx(by_hand)


def test_hack_flags_by_hand():
    assert hack_flags([2, 2, 0, 2, 1], [0, 1, 0, 0.5, 0], proxy_hi=1.0, gold_lo=0.5) == [True, False, False, False,
                                                                                          False]


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("rm")
    cfg = RMConfig(n_pairs=24, max_new_tokens=16, sample_batch_size=48, epochs=1, batch_size=8, label_noise=0.25,
                   seed=1)
    metrics = train_reward_model(cfg, out, log=None)
    return out, metrics


@pytest.mark.slow
def test_train_reward_model_writes_a_usable_directory(rm_dir):
    out, m = rm_dir
    for f in ("model.safetensors", "rm_config.json", "pairs.jsonl", "base_stats.json", "metrics.json", "rm_train.yaml"):
        assert (out / f).exists(), f
    assert (m["n_pairs"], m["n_train"] + m["n_held_out"]) == (24, 24)
    assert 0 <= m["held_out_acc"] <= 1 and m["initial_held_out_acc"] == 0.5
    pairs = read_pairs(out / "pairs.jsonl")
    assert all((x.gold_chosen < x.gold_rejected) == x.flipped for x in pairs if x.gold_chosen != x.gold_rejected)
    assert m["flip_frac"] == sum(x.flipped for x in pairs) / 24
    stats = json.loads((out / "base_stats.json").read_text())
    assert len(stats["proxy"]) == len(stats["gold"]) == 48
    assert np.mean(stats["proxy"]) == pytest.approx(0, abs=1e-4) and np.std(stats["proxy"], ddof=1) == pytest.approx(1, abs=1e-3)
    assert stats["gold"][:24] == [x.gold_chosen for x in pairs]


@pytest.mark.slow
def test_env_scores_proxy_gold_and_hacks(rm_dir):
    out, _ = rm_dir
    env = build_env(EnvConfig(name="preference", params={"rm_dir": str(out)}))
    texts = [FLUENT_HAPPY, SPAM, FLUENT_SAD]
    s = env.score([PROMPT] * 3, texts)
    assert s.reward == s.parts["proxy"] == pytest.approx(env.rm.score([PROMPT] * 3, texts))
    assert s.task_score == s.parts["gold"] and s.task_score[0] > s.task_score[1]
    assert {"gold_sentiment", "gold_fluency", "gold_length", "gold_repetition"} <= set(s.parts)
    th = env.thresholds
    assert s.hack == [p > th["proxy_hack"] and g < th["gold_hack"] for p, g in zip(s.parts["proxy"], s.task_score)]
    assert s.passed == [g >= th["gold_pass"] for g in s.task_score]
    assert th["proxy_loose"] <= th["proxy_hack"]
    assert len(env.eval_prompts(8)) == 8 and len(env.sample_prompts(random.Random(0), 5)) == 5

    # a proxy weight via env.rewards; a different gold re-derives the gold thresholds from the stored pairs
    env2 = build_env(EnvConfig(name="preference", rewards=[RewardSpec(name="proxy_rm", weight=2.0)],
                               params={"rm_dir": str(out), "gold": {"length_weight": 0.0}}))
    s2 = env2.score([PROMPT] * 3, texts)
    assert s2.reward == pytest.approx([2 * x for x in s.reward], abs=1e-5)
    assert env2.thresholds["proxy_hack"] == th["proxy_hack"] and env2.thresholds["gold_hack"] != th["gold_hack"]


@pytest.mark.slow
def test_env_fails_loudly(rm_dir, tmp_path):
    out, _ = rm_dir
    with pytest.raises(ValueError, match="env.params.rm_dir is required"):
        build_env(EnvConfig(name="preference"))
    with pytest.raises(ValueError, match="env.params.rm_dri: unknown key for env 'preference'; allowed: .*rm_dir"):
        build_env(EnvConfig(name="preference", params={"rm_dir": str(out), "rm_dri": 1}))
    with pytest.raises(ValueError, match="env.params.gold.fluency: unknown key for the gold reward; allowed: .*fluency_weight"):
        build_env(EnvConfig(name="preference", params={"rm_dir": str(out), "gold": {"fluency": 1}}))
    with pytest.raises(FileNotFoundError, match="env.params.rm_dir"):
        build_env(EnvConfig(name="preference", params={"rm_dir": str(tmp_path / "none")}))
    with pytest.raises(ValueError, match="env.rewards"):
        build_env(EnvConfig(name="preference", rewards=[RewardSpec(name="happy_binary")], params={"rm_dir": str(out)}))
