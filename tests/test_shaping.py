"""Composite shaped rewards: weights, caps, softening and the strict reward against hand-computed values."""

import pytest

from rhlab.rewards.shaping import CompositeSpec, PartSpec, build_spec, combine, shape_penalty

KINDS = {"style": "score", "rules": "score", "risk_penalty": "penalty"}
PARTS = [{"name": "style", "weight": 0.45}, {"name": "rules", "weight": 0.35},
         {"name": "risk_penalty", "weight": 0.20}]
# four completions: raw risk penalties 2 (past the cap), 0, 4.5 (far past), 1 (under)
VALUES = {"style": [0.8, 1.0, 0.5, 0.6], "rules": [2 / 3, 1.0, 0.0, 1.0], "risk_penalty": [2.0, 0.0, 4.5, 1.0]}
SCORE_SIDE = [0.36 + 0.35 * 2 / 3, 0.8, 0.225, 0.27 + 0.35]  # 0.45 * style + 0.35 * rules


def spec(mode):
    return build_spec(PARTS, KINDS, mode, 1.5)


def test_shape_penalty_by_hand():
    assert shape_penalty(2.0, "strict", 1.5) == 2.0
    assert shape_penalty(2.0, "scalar_capped", 1.5) == 1.5
    assert shape_penalty(2.0, "scalar_softened", 1.5) == pytest.approx(1.5 * 0.8700617)  # tanh(4/3)
    assert shape_penalty(0.0, "scalar_softened", 1.5) == 0.0
    # past the cap, the hard cap is flat but the softened penalty still grows: the gradient survives
    assert shape_penalty(3.0, "scalar_capped", 1.5) == shape_penalty(4.5, "scalar_capped", 1.5)
    soft = [shape_penalty(x, "scalar_softened", 1.5) for x in (1.0, 2.0, 3.0, 4.5)]
    assert soft == sorted(soft) and len(set(soft)) == 4 and max(soft) < 1.5
    with pytest.raises(AssertionError):
        shape_penalty(-0.1, "strict", 1.5)


def test_combine_strict_softened_capped_by_hand():
    strict = [SCORE_SIDE[0] - 0.4, 0.8, 0.225 - 0.9, 0.62 - 0.2]
    for mode, pen in [("strict", [2.0, 0.0, 4.5, 1.0]),
                      ("scalar_softened", [1.3050925, 0.0, 1.4925821, 0.8741744]),
                      ("scalar_capped", [1.5, 0.0, 1.5, 1.0])]:
        out = combine(spec(mode), VALUES)
        assert out.reward == pytest.approx([s - 0.2 * p for s, p in zip(SCORE_SIDE, pen)]), mode
        assert out.strict == pytest.approx(strict), mode  # strict whatever the training mode
        assert out.parts["strict"] == out.strict
        assert out.parts["risk_penalty"] == [-2.0, -0.0, -4.5, -1.0]
        assert out.parts["risk_penalty_shaped"] == pytest.approx([-p for p in pen])
        assert out.parts["style"] == VALUES["style"] and out.parts["rules"] == VALUES["rules"]
        assert out.parts["penalty_rate"] == [1.0, 0.0, 1.0, 1.0]
        assert out.parts["penalty_saturated"] == [1.0, 0.0, 1.0, 0.0]
    assert combine(spec("strict"), VALUES).reward == pytest.approx(strict)
    # softened sits between strict and capped for penalties past the cap, and equals neither
    r = {m: combine(spec(m), VALUES).reward[0] for m in ("strict", "scalar_softened", "scalar_capped")}
    assert r["strict"] < r["scalar_capped"] < r["scalar_softened"]


def test_weights_scale_parts_and_zero_weight_drops_them():
    s = build_spec([{"name": "style", "weight": 2.0}, {"name": "risk_penalty", "weight": 0.0}], KINDS, "strict", 1.0)
    out = combine(s, {"style": [0.5], "risk_penalty": [3.0]})
    assert out.reward == [1.0] and out.parts["risk_penalty"] == [-3.0]


def test_spec_errors_name_the_bad_key():
    with pytest.raises(ValueError, match="reward_mode.*allowed: strict, scalar_softened, scalar_capped"):
        build_spec(PARTS, KINDS, "soft", 1.5)
    with pytest.raises(ValueError, match="penalty_cap"):
        build_spec(PARTS, KINDS, "strict", 0)
    with pytest.raises(ValueError, match="'happy_count' unknown; allowed: risk_penalty, rules, style"):
        build_spec([{"name": "happy_count"}], KINDS, "strict", 1.5)
    with pytest.raises(ValueError, match="duplicate"):
        build_spec(PARTS + PARTS[:1], KINDS, "strict", 1.5)
    with pytest.raises(ValueError, match="weight"):
        build_spec([{"name": "style", "weight": -1}], KINDS, "strict", 1.5)
    with pytest.raises(ValueError, match="kind"):
        CompositeSpec((PartSpec("x", 1.0, "bonus"),))
    with pytest.raises(AssertionError, match="no values for parts"):
        combine(spec("strict"), {"style": [1.0]})
