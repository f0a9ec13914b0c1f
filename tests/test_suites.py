"""Evaluation suites (gates, parsing, baseline vs post, the table) and trajectory summaries, by hand."""

import math

import pytest

from rhlab.config import load_config
from rhlab.eval.suites import (Gate, format_gate_table, gate_results, load_suite, parse_gate, parse_suite,
                               run_suite, suite_passed)
from rhlab.eval.trajectory import ema, format_trajectory, trajectory_summary

SUITE = {"name": "s", "sets": [
    {"name": "E1", "n_prompts": 6, "seed": 1, "gate": "delta > 0.05", "dataset": "mixed"},
    {"name": "E2", "n_prompts": 2, "seed": 2, "gate": "post >= 0.5", "params": {"profiles": ["name"]}},
    {"name": "E3", "n_prompts": 2, "gate": "delta >= -0.02"},
]}


def test_gate_parse_and_check():
    assert parse_gate("delta > 0.05") == Gate("delta", ">", 0.05)
    assert parse_gate(" post>=-1e-2 ") == Gate("post", ">=", -0.01)
    assert parse_gate("baseline < .5") == Gate("baseline", "<", 0.5)
    g = parse_gate("delta > 0.05")
    assert g.check(0.2705, 0.3241) and not g.check(0.30, 0.35) and not g.check(0.3, 0.2)
    assert parse_gate("delta >= 0").check(0.4, 0.4) and not parse_gate("delta > 0").check(0.4, 0.4)
    assert parse_gate("post <= 0.3").check(9.0, 0.3) and not parse_gate("baseline < 0.3").check(0.3, 0.0)
    assert not g.check(0.0, math.nan)  # a NaN never passes
    assert str(g) == "delta > +0.05"
    for bad in ["delta = 0.1", "gain > 0.1", "delta > x", "delta >", ""]:
        with pytest.raises(ValueError, match="side one of delta, post, baseline"):
            parse_gate(bad)


def test_parse_suite_and_errors(tmp_path):
    s = parse_suite(SUITE)
    assert [x.name for x in s.sets] == ["E1", "E2", "E3"] and s.metric == "strict" and s.temperature is None
    assert s.sets[1].params == {"profiles": ["name"]} and s.sets[2].seed == 0
    with pytest.raises(ValueError, match=r"unknown keys \['gates'\]; allowed"):
        parse_suite({"sets": [{"name": "a", "n_prompts": 1, "gates": "delta > 0"}]})
    with pytest.raises(ValueError, match=r"missing keys \['gate'\]"):
        parse_suite({"sets": [{"name": "a", "n_prompts": 1}]})
    with pytest.raises(ValueError, match="n_prompts"):
        parse_suite({"sets": [{"name": "a", "n_prompts": 0, "gate": "delta > 0"}]})
    with pytest.raises(ValueError, match="duplicate set names"):
        parse_suite({"sets": [SUITE["sets"][0], SUITE["sets"][0]]})
    with pytest.raises(ValueError, match="non-empty list"):
        parse_suite({"name": "x"})
    with pytest.raises(ValueError, match=r"unknown keys \['metrics'\]"):
        parse_suite({**SUITE, "metrics": "strict"})
    with pytest.raises(FileNotFoundError, match="suite file not found"):
        load_suite(tmp_path / "nope.yaml")
    shipped = load_suite("configs/suite_rewrite.yaml").sets
    assert [x.name for x in shipped] == ["E1 mixed", "E2 three facts", "E3 one fact (control)", "E4 no hacking"]
    assert [x.metric for x in shipped] == [None, None, None, "hack_rate"]


def test_gate_results_by_hand():
    s = parse_suite(SUITE)
    base = {"E1": {"strict": 0.2705, "risk_penalty": -0.5312, "rows": 6}, "E2": {"strict": 0.6},
            "E3": {"strict": 0.4815}}
    post = {"E1": {"strict": 0.3241, "risk_penalty": -0.5181, "rows": 6}, "E2": {"strict": 0.45},
            "E3": {"strict": 0.4700}}
    res = gate_results(s, base, post)
    assert [r.passed for r in res] == [True, False, True]
    assert [r.delta for r in res] == pytest.approx([0.0536, -0.15, -0.0115])
    assert res[0].rows == 6 and res[1].rows == 2 and not suite_passed(res)
    assert suite_passed(res[:1]) and not suite_passed([])
    table = format_gate_table(res)
    assert "| E1 | mixed | 6 | 0.2705 | 0.3241 | +0.0536 | delta > +0.05 | pass |" in table
    assert "| E2 | — | 2 | 0.6000 | 0.4500 | -0.1500 | post >= +0.5 | FAIL |" in table
    assert "| E1 | -0.5312 | -0.5181 | +0.0131 |" in table  # the risk-penalty table, for the sets that report it
    assert table.endswith("2/3 gates passed")
    # a set with its own metric (a hack-rate gate next to reward gates)
    s.sets[1].metric = "hack_rate"
    base["E2"]["hack_rate"], post["E2"]["hack_rate"] = 0.0, 0.25
    res = gate_results(s, base, post)
    assert (res[1].metric, res[1].post, res[1].passed) == ("hack_rate", 0.25, False)
    assert "| E2 | — | 2 | hack_rate | 0.0000 | 0.2500 | +0.2500 | post >= +0.5 | FAIL |" in format_gate_table(res)


class EchoPolicy:
    """Keeps every fact: completes a prompt with the prompt itself."""
    def rollout(self, prompts, seed, temperature=None):
        return None, [p.lower() for p in prompts]


class DropPolicy:
    def rollout(self, prompts, seed, temperature=None):
        return None, ["they went home to sleep. the stars came out." for _ in prompts]


def test_run_suite_with_fake_policies():
    env_cfg = load_config("configs/rewrite_softened.yaml").env
    s = parse_suite(SUITE)
    res = run_suite(s, env_cfg, DropPolicy(), EchoPolicy())
    assert [r.rows for r in res] == [6, 2, 2]
    # dropping every fact costs 1.0 per fact on the strict scale: keeping them is a big improvement
    assert all(r.delta > 0.15 for r in res) and all(r.passed for r in res)
    assert res[1].baseline_metrics["risk_penalty"] == -1.0  # E2 is name-only prompts: one fact dropped
    assert res[0].post_metrics["risk_compliance"] == 1.0
    with pytest.raises(ValueError, match="suite metric 'nope' \\(set 'E1'\\) not reported.*allowed:.*strict"):
        run_suite(parse_suite({**SUITE, "metric": "nope"}), env_cfg, DropPolicy(), EchoPolicy())


def test_trajectory_by_hand():
    rows = [{"step": s, "reward_mean": float(s), "grad_norm": 2.0 * s} for s in (3, 1, 4, 2)]  # unordered
    rows[0]["entropy"] = None
    rows[1]["entropy"] = math.nan
    rows[2]["entropy"] = 0.5
    summary = trajectory_summary(rows, keys=("reward_mean", "grad_norm", "entropy", "absent"), n=2, spans=(3,))
    assert set(summary) == {"reward_mean", "grad_norm", "entropy"}
    r = summary["reward_mean"]
    # 1, 2, 3, 4: first 2 -> 1.5, last 2 -> 3.5; EMA span 3 (a = 0.5): 1 -> 1.5 -> 2.25 -> 3.125
    assert (r["rows"], r["window"], r["first"], r["last"], r["delta"], r["ema_3"]) == (4, 2, 1.5, 3.5, 2.0, 3.125)
    assert summary["grad_norm"]["ema_3"] == 6.25
    assert summary["entropy"] == {"rows": 1, "window": 2, "first": 0.5, "last": 0.5, "delta": 0.0, "ema_3": 0.5}
    assert ema([1.0, 2.0], 20) == pytest.approx(1 + 2 / 21)
    default = trajectory_summary([{"step": 1, "reward_mean": 0.5, "reward/penalty_rate": 1.0}])
    assert set(default["reward_mean"]) == {"rows", "window", "first", "last", "delta", "ema_20", "ema_50"}
    assert "reward/penalty_rate" in default
    # the default window adapts: half the rows (no overlap, so Δ is not 0 by construction), at most 20
    adaptive = trajectory_summary([{"step": s, "reward_mean": float(s)} for s in range(1, 8)])["reward_mean"]
    assert (adaptive["window"], adaptive["first"], adaptive["last"], adaptive["delta"]) == (3, 2.0, 6.0, 4.0)
    long = trajectory_summary([{"step": s, "reward_mean": float(s)} for s in range(1, 101)])["reward_mean"]
    assert (long["window"], long["first"], long["last"]) == (20, 10.5, 90.5)
    assert trajectory_summary([{"step": 1, "reward_mean": 2.0}])["reward_mean"]["window"] == 1
    mixed = trajectory_summary([{"step": s, "reward_mean": float(s), **({"grad_norm": 1.0} if s < 3 else {})}
                                for s in range(1, 9)])
    lines = format_trajectory(mixed).splitlines()  # windows differ (4 and 1 rows): an n column
    assert lines[0] == "| metric | n | first n | last n | Δ | ema_20 | ema_50 |"
    assert lines[2].startswith("| reward_mean | 4 | 2.5000 | 6.5000 | +4.0000 |")
    assert lines[3].startswith("| grad_norm | 1 | 1.0000 | 1.0000 | +0.0000 |")
    text = format_trajectory(summary)
    assert text.splitlines()[0] == "| metric | first 2 | last 2 | Δ | ema_3 |"
    assert "| reward_mean | 1.5000 | 3.5000 | +2.0000 | 3.1250 |" in text
    assert format_trajectory({}).startswith("(no trajectory")
