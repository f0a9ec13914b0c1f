"""Advantages and the four GRPO-family losses against hand-computed values."""

import math

import pytest
import torch

from rhlab.algos.advantages import grpo_advantages
from rhlab.algos.losses import Norm, k3_kl, policy_loss


def test_group_advantages_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0])  # groups of 3: [1,0,0], [0,2,2]
    adv = grpo_advantages(r, 3, "group")
    std = math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)  # unbiased std of [1,0,0] (and of [0,2,2]/2)
    expected = [2 / 3 / (std + 1e-4), -1 / 3 / (std + 1e-4), -1 / 3 / (std + 1e-4),
                -4 / 3 / (2 * std + 1e-4), 2 / 3 / (2 * std + 1e-4), 2 / 3 / (2 * std + 1e-4)]
    assert adv.tolist() == pytest.approx(expected, rel=1e-6)


def test_batch_and_no_scaling():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0])
    centred = torch.tensor([2 / 3, -1 / 3, -1 / 3, -4 / 3, 2 / 3, 2 / 3])
    assert grpo_advantages(r, 3, "none").tolist() == pytest.approx(centred.tolist())
    assert grpo_advantages(r, 3, "batch").tolist() == pytest.approx((centred / (r.std() + 1e-4)).tolist())
    with pytest.raises(ValueError, match="allowed: group, batch, none"):
        grpo_advantages(r, 3, "bogus")


def test_equal_reward_group_gets_exactly_zero_advantage():
    adv = grpo_advantages(torch.tensor([0.5, 0.5, 0.5, 0.0, 1.0, 1.0]), 3)
    assert adv[:3].tolist() == [0.0, 0.0, 0.0]
    assert adv[3:].abs().sum() > 0


# Two sequences, T=3; mask drops the last token of the second.
LOGP = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -0.7]])
OLD = torch.tensor([[-1.1, -1.5, -0.5], [-0.3, -1.0, -0.2]])
REF = torch.tensor([[-1.2, -2.0, -0.4], [-0.5, -1.0, -0.9]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
ADV = torch.tensor([1.0, -2.0])


def _per_token(eps=0.2, eps_high=None, delta=None, beta=0.0):
    """The TRL formula written out element by element in plain Python."""
    eh = eps if eps_high is None else eps_high
    out = []
    for i in range(2):
        row = []
        for t in range(3):
            ratio = math.exp(LOGP[i, t] - OLD[i, t])
            clipped = min(max(ratio, 1 - eps), 1 + eh)
            capped = min(ratio, delta) if delta else ratio
            a = ADV[i].item()
            loss = -min(capped * a, clipped * a)
            d = (REF[i, t] - LOGP[i, t]).item()
            loss += beta * (math.exp(d) - d - 1)
            row.append(loss)
        out.append(row)
    return out


def _call(loss_type, **kw):
    return policy_loss(LOGP, OLD, ADV, MASK, loss_type=loss_type, epsilon=kw.get("eps", 0.2),
                       epsilon_high=kw.get("eps_high"), delta=kw.get("delta"), beta=kw.get("beta", 0.0),
                       ref_logp=REF, norm=Norm(batch_seqs=2, batch_tokens=10.0, micro_tokens=5.0, n_micro=1,
                                               max_new_tokens=4))


@pytest.mark.parametrize("kw", [{}, {"eps_high": 0.28}, {"delta": 1.5}, {"beta": 0.04}, {"eps": 0.1, "beta": 0.1}])
def test_losses_by_hand(kw):
    pt = _per_token(kw.get("eps", 0.2), kw.get("eps_high"), kw.get("delta"), kw.get("beta", 0.0))
    m = MASK.tolist()
    masked = [[pt[i][t] * m[i][t] for t in range(3)] for i in range(2)]
    expected = {
        "grpo": (sum(masked[0]) / 3 + sum(masked[1]) / 2) / 2,
        "bnpo": (sum(masked[0]) + sum(masked[1])) / 5,
        "dr_grpo": (sum(masked[0]) + sum(masked[1])) / (2 * 4),
        "dapo": (sum(masked[0]) + sum(masked[1])) / 10.0,
    }
    for lt, val in expected.items():
        assert _call(lt, **kw).loss.item() == pytest.approx(val, rel=1e-5), lt


def test_k3_kl_is_nonnegative_and_zero_at_equality():
    a = torch.randn(100)
    assert (k3_kl(a, a + torch.randn(100)) >= 0).all()
    assert k3_kl(a, a).abs().max() == 0


def test_clip_fractions():
    out = _call("grpo")
    # ratios: seq0 exp(.1), exp(-.5)=0.61 (adv>0: not counted low), 1; seq1 1, exp(-.2)=.82, exp(-.5) masked
    # low-clipped needs ratio < 0.8 with A < 0: none unmasked; high-clipped needs ratio > 1.2 with A > 0: none
    assert out.clip_low.item() == 0 and out.clip_high.item() == 0
    lo = policy_loss(LOGP, OLD, torch.tensor([-1.0, -1.0]), MASK, loss_type="grpo", epsilon=0.2)
    assert lo.clip_low.item() == pytest.approx(1 / 5)  # only seq0 t1 (ratio 0.61) is below 0.8


def test_equal_reward_group_contributes_no_gradient():
    """With beta = 0 a group whose rewards are all equal leaves the gradient untouched."""
    torch.manual_seed(0)
    w = torch.randn(4, 5, requires_grad=True)
    x = torch.randn(6, 3, 4)
    tokens = torch.randint(5, (6, 3))

    def logp():
        return (x @ w).log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)

    adv = grpo_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0]), 3)
    mask = torch.ones(6, 3)
    full = policy_loss(logp(), logp().detach(), adv, mask, loss_type="bnpo", epsilon=0.2)
    g_full, = torch.autograd.grad(full.loss, w)
    # the same loss restricted to the second group, normalised the same way
    lp = logp()
    only = policy_loss(lp[3:], lp[3:].detach(), adv[3:], mask[3:], loss_type="bnpo", epsilon=0.2,
                       norm=Norm(6, 18.0, 18.0, 1, 3)).loss
    g_only, = torch.autograd.grad(only, w)
    torch.testing.assert_close(g_full, g_only)
    assert g_full.abs().sum() > 0


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_micro_batches_and_subgroups_sum_to_the_batch_loss(loss_type):
    """Splitting into micro-batches (and each into sub-groups, as routing does) changes nothing
    for grpo, dr_grpo and dapo; bnpo normalises per micro-batch as TRL does."""
    torch.manual_seed(1)
    logp, old, ref = torch.randn(8, 5) - 2, torch.randn(8, 5) - 2, torch.randn(8, 5) - 2
    mask = (torch.rand(8, 5) > 0.3).long()
    adv = torch.randn(8)
    kw = dict(loss_type=loss_type, epsilon=0.2, beta=0.1, ref_logp=ref)
    whole = policy_loss(logp, old, adv, mask, **kw).loss
    total = 0.0
    for idx in torch.arange(8).chunk(2):
        norm = Norm(8, float(mask.sum()), float(mask[idx].sum()), 2, 5)
        for sub in (idx[:1], idx[1:]):  # two sub-groups of the micro-batch, each its own pass
            total = total + policy_loss(logp[sub], old[sub], adv[sub], mask[sub], norm=norm,
                                        **{**kw, "ref_logp": ref[sub]}).loss
    if loss_type == "bnpo":
        by_micro = sum(policy_loss(logp[i], old[i], adv[i], mask[i], **{**kw, "ref_logp": ref[i]}).loss
                       for i in torch.arange(8).chunk(2)) / 2
        assert total.item() == pytest.approx(by_micro.item(), rel=1e-6)
    else:
        assert total.item() == pytest.approx(whole.item(), rel=1e-6)


def test_unknown_loss_type():
    with pytest.raises(ValueError, match="allowed: grpo, bnpo, dr_grpo, dapo"):
        _call("ppo")


def test_rloo_advantages_by_hand():
    from rhlab.algos.advantages import rloo_advantages

    adv = rloo_advantages(torch.tensor([1.0, 2.0, 6.0, 0.0, 0.0, 3.0]), 3)
    # group 1: 1-(2+6)/2=-3, 2-(1+6)/2=-1.5, 6-(1+2)/2=4.5; group 2: 0-1.5, 0-1.5, 3-0
    assert adv.tolist() == pytest.approx([-3.0, -1.5, 4.5, -1.5, -1.5, 3.0])


def test_reinforce_moving_baseline_by_hand():
    from rhlab.algos.advantages import MovingBaseline

    b = MovingBaseline(0.5)
    assert b.advantages(torch.tensor([1.0, 3.0])).tolist() == [-1.0, 1.0]  # first batch: its own mean 2
    assert b.advantages(torch.tensor([4.0, 6.0])).tolist() == [2.0, 4.0]  # baseline 2, then 0.5*2+0.5*5
    assert b.value == pytest.approx(3.5)
    b2 = MovingBaseline(0.5)
    b2.load(b.state())
    assert b2.advantages(torch.tensor([3.5])).tolist() == [0.0]
