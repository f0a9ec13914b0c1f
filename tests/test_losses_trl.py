"""TRL 1.16 parity of the losses: kl_bias_correction, cispo and sapo by hand, and every loss type
against TRL's own GRPOTrainer._compute_loss on identical inputs (when trl is installed)."""

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from rhlab.algos.losses import LOSS_TYPES, Norm, policy_loss
from rhlab.config import ConfigError, load_config

# Two sequences, T=3; mask drops the last token of the second (the values of tests/test_algos.py).
LOGP = [[-1.0, -2.0, -0.5], [-0.3, -1.2, -0.7]]
OLD = [[-1.1, -1.5, -0.5], [-0.3, -1.0, -0.2]]
REF = [[-1.2, -2.0, -0.4], [-0.5, -1.0, -0.9]]
MASK = [[1, 1, 1], [1, 1, 0]]
ADV = [1.0, -2.0]


def _grads(loss_type, **kw):
    """The loss and d loss / d logp, on the fixed inputs (float64)."""
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    out = policy_loss(logp, torch.tensor(OLD, dtype=torch.float64), torch.tensor(ADV, dtype=torch.float64),
                      torch.tensor(MASK), loss_type=loss_type, ref_logp=torch.tensor(REF, dtype=torch.float64), **kw)
    out.loss.backward()
    return out, logp.grad


def _per_seq_mean(rows):
    """grpo / sapo aggregation of per-token values: the mean over each sequence's tokens, then over sequences."""
    return sum(sum(v * m for v, m in zip(r, mr)) / sum(mr) for r, mr in zip(rows, MASK)) / len(rows)


def _token_mean(rows):
    """dapo / cispo aggregation (one micro-batch): the mean over all masked tokens."""
    return sum(v * m for r, mr in zip(rows, MASK) for v, m in zip(r, mr)) / sum(map(sum, MASK))


def _table(f):
    return [[f(i, t) for t in range(3)] for i in range(2)]


# ---- kl_bias_correction ---------------------------------------------------------------------
def test_kl_bias_correction_by_hand():
    """The k3 term times rho = exp(logp - old): value k3 * rho; gradient beta * rho * (1 - e^d + k3),
    d = ref - logp; on-policy (rho = 1, old = logp) that is beta * (logp - ref), the k1 (unbiased
    reverse-KL) gradient, where the uncorrected k3 gives beta * (1 - e^d)."""
    beta, eps = 0.1, 0.2

    def rho(i, t):
        return math.exp(LOGP[i][t] - OLD[i][t])

    def d(i, t):
        return REF[i][t] - LOGP[i][t]

    def k3(i, t):
        return math.exp(d(i, t)) - d(i, t) - 1

    def pg(i, t):
        r, a = rho(i, t), ADV[i]
        return -min(r * a, min(max(r, 1 - eps), 1 + eps) * a)

    plain, g_plain = _grads("grpo", epsilon=eps, beta=beta)
    corr, g_corr = _grads("grpo", epsilon=eps, beta=beta, kl_bias_correction=True)
    assert plain.loss.item() == pytest.approx(_per_seq_mean(_table(lambda i, t: pg(i, t) + beta * k3(i, t))))
    assert corr.loss.item() == pytest.approx(
        _per_seq_mean(_table(lambda i, t: pg(i, t) + beta * k3(i, t) * rho(i, t))))
    # the KL part of the gradient alone: the difference to the beta = 0 gradient (same pg term)
    _, g0 = _grads("grpo", epsilon=eps)
    n = [sum(m) for m in MASK]
    want_plain = _table(lambda i, t: MASK[i][t] * beta * (1 - math.exp(d(i, t))) / n[i] / 2)
    want_corr = _table(lambda i, t: MASK[i][t] * beta * rho(i, t) * (1 - math.exp(d(i, t)) + k3(i, t)) / n[i] / 2)
    torch.testing.assert_close(g_plain - g0, torch.tensor(want_plain, dtype=torch.float64))
    torch.testing.assert_close(g_corr - g0, torch.tensor(want_corr, dtype=torch.float64))
    assert corr.kl.item() == plain.kl.item()  # the logged KL is the k3 mean either way

    # on-policy: rho = 1, the loss value is unchanged but the gradient is the k1 one
    lp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    out = policy_loss(lp, lp.detach(), torch.zeros(2, dtype=torch.float64), torch.tensor(MASK), loss_type="grpo",
                      epsilon=eps, beta=beta, ref_logp=torch.tensor(REF, dtype=torch.float64),
                      kl_bias_correction=True)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(_per_seq_mean(_table(lambda i, t: beta * k3(i, t))))
    want_k1 = _table(lambda i, t: MASK[i][t] * beta * (LOGP[i][t] - REF[i][t]) / n[i] / 2)
    torch.testing.assert_close(lp.grad, torch.tensor(want_k1, dtype=torch.float64))


# ---- cispo, sapo -------------------------------------------------------------------------------
def test_cispo_by_hand():
    """l = -min(rho, eps_high) * A * logp with the weight detached: gradient -min(rho, eps_high) * A, no
    token ever dropped; aggregated as dapo (tokens of the whole generation batch)."""
    eps_max = 1.05  # ratios: seq0 e^0.1 = 1.105 (capped), e^-0.5, 1; seq1 1, e^-0.2, e^-0.5 (masked)

    def w(i, t):
        return min(math.exp(LOGP[i][t] - OLD[i][t]), eps_max)

    out, g = _grads("cispo", epsilon=0.2, epsilon_high=eps_max)
    assert out.loss.item() == pytest.approx(_token_mean(_table(lambda i, t: -w(i, t) * ADV[i] * LOGP[i][t])))
    want = _table(lambda i, t: -MASK[i][t] * w(i, t) * ADV[i] / 5)
    torch.testing.assert_close(g, torch.tensor(want, dtype=torch.float64))
    # a cap below the ratios: every weight is the cap; TRL's cispo_clip_ratio counts rho > cap with A > 0
    out, g = _grads("cispo", epsilon=0.2, epsilon_high=0.5)
    torch.testing.assert_close(g, torch.tensor(_table(lambda i, t: -MASK[i][t] * 0.5 * ADV[i] / 5),
                                               dtype=torch.float64))
    assert out.clip_high.item() == pytest.approx(3 / 5) and out.clip_low.item() == 0  # seq0's 3 tokens, A > 0


def test_sapo_by_hand():
    """l = -sigmoid(tau (rho - 1)) * 4 / tau * A, tau = 1.0 for A > 0 and 1.05 otherwise; gradient
    -4 s (1 - s) rho A with s the sigmoid: exactly the policy gradient -A at rho = 1."""
    def tau(i):
        return 1.0 if ADV[i] > 0 else 1.05

    def s(i, t):
        return 1 / (1 + math.exp(-tau(i) * (math.exp(LOGP[i][t] - OLD[i][t]) - 1)))

    out, g = _grads("sapo", epsilon=0.2)
    assert out.loss.item() == pytest.approx(_per_seq_mean(_table(lambda i, t: -s(i, t) * 4 / tau(i) * ADV[i])))
    n = [sum(m) for m in MASK]
    want = _table(lambda i, t: -MASK[i][t] * 4 * s(i, t) * (1 - s(i, t)) * math.exp(LOGP[i][t] - OLD[i][t])
                  * ADV[i] / n[i] / 2)
    torch.testing.assert_close(g, torch.tensor(want, dtype=torch.float64))
    assert out.clip_low.item() == 0 and out.clip_high.item() == 0
    # other temperatures are used as given
    out2, _ = _grads("sapo", epsilon=0.2, sapo_temperature_pos=2.0, sapo_temperature_neg=0.5)
    s2 = [[1 / (1 + math.exp(-T * (math.exp(LOGP[i][t] - OLD[i][t]) - 1))) for t in range(3)]
          for i, T in enumerate([2.0, 0.5])]
    assert out2.loss.item() == pytest.approx(_per_seq_mean(
        [[-s2[i][t] * 4 / [2.0, 0.5][i] * ADV[i] for t in range(3)] for i in range(2)]))
    # on-policy the gradient equals grpo's
    lp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    grads = []
    for lt in ("sapo", "grpo"):
        loss = policy_loss(lp, lp.detach(), torch.tensor(ADV, dtype=torch.float64), torch.tensor(MASK),
                           loss_type=lt, epsilon=0.2).loss
        grads.append(torch.autograd.grad(loss, lp)[0])
    torch.testing.assert_close(grads[0], grads[1])


@pytest.mark.parametrize("loss_type", ["cispo", "sapo"])
def test_new_losses_split_into_micro_batches_and_subgroups_sum_to_the_batch_loss(loss_type):
    torch.manual_seed(1)
    logp, old, ref = (torch.randn(8, 5, dtype=torch.float64) - 2 for _ in range(3))
    mask = (torch.rand(8, 5) > 0.3).long()
    adv = torch.randn(8, dtype=torch.float64)
    kw = dict(loss_type=loss_type, epsilon=0.2, epsilon_high=5.0 if loss_type == "cispo" else None, beta=0.1,
              kl_bias_correction=True)
    whole = policy_loss(logp, old, adv, mask, ref_logp=ref, **kw).loss
    total = 0.0
    for idx in torch.arange(8).chunk(2):
        norm = Norm(8, float(mask.sum()), float(mask[idx].sum()), 2, 5)
        for sub in (idx[:1], idx[1:]):
            total = total + policy_loss(logp[sub], old[sub], adv[sub], mask[sub], norm=norm, ref_logp=ref[sub],
                                        **kw).loss
    assert total.item() == pytest.approx(whole.item(), rel=1e-12)


# ---- the config --------------------------------------------------------------------------------
def test_config_defaults_and_errors():
    t = load_config(None).train
    assert (t.kl_bias_correction, t.sapo_temperature_pos, t.sapo_temperature_neg) == (False, 1.0, 1.05)
    load_config(None, ["train.loss_type=cispo", "train.epsilon_high=5.0"])
    load_config(None, ["train.loss_type=sapo", "train.kl_bias_correction=true"])
    for over, msg in [(["train.kl_bias_correction=true", "train.kl_in_reward=true"], "train.kl_in_reward=true"),
                      (["train.loss_type=cispo"], "set it explicitly"),
                      (["train.loss_type=sapo", "train.delta=2.0"], "train.delta=2.0"),
                      (["train.loss_type=cispo", "train.epsilon_high=5", "train.delta=2.0"], "train.delta=2.0"),
                      (["train.loss_type=sapo", "train.epsilon_high=0.28"], "train.epsilon_high=0.28"),
                      (["train.loss_type=luspo"], "cispo"),
                      (["train.sapo_temperature_neg=0"], "train.sapo_temperature_neg")]:
        with pytest.raises(ConfigError, match=msg):
            load_config(None, over)


# ---- TRL's own loss on identical inputs --------------------------------------------------------
def trl_loss(loss_type, logp, old, ref, adv, mask, *, beta, epsilon, epsilon_high, delta=None,
             bias_kl=False, n_micro=1, batch_tokens=None, max_completion_length=None):
    """GRPOTrainer._compute_loss (TRL 1.16) on one micro-batch of a generation batch split into n_micro,
    with the model's log-probs given (a stub for the forward pass) and one process."""
    from trl import GRPOTrainer

    args = SimpleNamespace(use_bias_correction_kl=bias_kl, delta=delta, sapo_temperature_pos=1.0,
                           sapo_temperature_neg=1.05, steps_per_generation=n_micro)
    accel = SimpleNamespace(num_processes=1, sync_gradients=True, gather=lambda x: x,
                            gather_for_metrics=lambda x: x, reduce=lambda x, reduction: x)
    stub = SimpleNamespace(
        args=args, accelerator=accel, loss_type=loss_type, beta=beta, epsilon_low=epsilon,
        epsilon_high=epsilon if epsilon_high is None else epsilon_high, importance_sampling_level="token",
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, use_vllm=False, aux_loss_enabled=False,
        _entropy_bonus_enabled=False, model=SimpleNamespace(training=True), current_gradient_accumulation_steps=n_micro,
        max_completion_length=max_completion_length or mask.shape[1], _metrics=defaultdict(lambda: defaultdict(list)),
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros_like(logp), None))
    inputs = {"prompt_ids": torch.zeros(len(mask), 1, dtype=torch.long), "prompt_mask": torch.ones(len(mask), 1),
              "completion_ids": torch.zeros_like(mask, dtype=torch.long), "completion_mask": mask,
              "advantages": adv, "old_per_token_logps": old, "ref_per_token_logps": ref,
              "num_items_in_batch": torch.tensor(float(mask.sum()) if batch_tokens is None else batch_tokens)}
    return GRPOTrainer._compute_loss(stub, None, inputs)


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(8, 6, generator=g) * 3
    old = logp + 0.3 * torch.randn(8, 6, generator=g)  # ratios on both sides of every clip bound
    ref = logp + 0.5 * torch.randn(8, 6, generator=g)
    mask = (torch.rand(8, 6, generator=g) > 0.3).float()
    mask[:, 0] = 1
    return logp, old, ref, torch.randn(8, generator=g), mask


CASES = [dict(beta=0.0), dict(beta=0.04), dict(beta=0.04, bias_kl=True), dict(beta=0.1, bias_kl=True, epsilon_high=0.28),
         dict(beta=0.0, delta=1.3)]


@pytest.mark.parametrize("loss_type, case", [(lt, c) for lt in LOSS_TYPES for c in CASES
                                              if not (c.get("delta") and lt in ("cispo", "sapo"))],  # rejected
                         ids=lambda x: x if isinstance(x, str) else ",".join(f"{k}={v}" for k, v in x.items()))
@pytest.mark.parametrize("n_micro", [1, 2])
def test_loss_and_gradient_equal_trl(loss_type, case, n_micro):
    """Loss and d loss / d logp equal TRL's on the same micro-batches (contiguous here; TRL shuffles the
    generation batch before splitting it, which matters only for bnpo: docs/losses.md)."""
    pytest.importorskip("trl", reason="trl not installed (pip install 'rhlab[trl]'): TRL cross-check skipped")
    eps_high = case.get("epsilon_high", 5.0 if loss_type == "cispo" else None)
    logp, old, ref, adv, mask = _inputs(n_micro)
    ours_total, trl_total = 0.0, 0.0
    g_ours, g_trl = torch.zeros_like(logp), torch.zeros_like(logp)
    for idx in torch.arange(8).chunk(n_micro):
        for grads, fn in ((g_ours, "ours"), (g_trl, "trl")):
            lp = logp[idx].clone().requires_grad_(True)
            if fn == "ours":
                norm = Norm(8, float(mask.sum()), float(mask[idx].sum()), n_micro, 6)
                loss = policy_loss(lp, old[idx], adv[idx], mask[idx], loss_type=loss_type, epsilon=0.2,
                                   epsilon_high=eps_high, delta=case.get("delta"), beta=case["beta"],
                                   ref_logp=ref[idx], norm=norm, kl_bias_correction=case.get("bias_kl", False)).loss
                ours_total += loss.item()
            else:
                loss = trl_loss(loss_type, lp, old[idx], ref[idx], adv[idx], mask[idx], beta=case["beta"], epsilon=0.2,
                                epsilon_high=eps_high, delta=case.get("delta"), bias_kl=case.get("bias_kl", False),
                                n_micro=n_micro, batch_tokens=float(mask.sum()))
                trl_total += loss.item()
            loss.backward()
            grads[idx] = lp.grad
    assert ours_total == pytest.approx(trl_total, rel=1e-6, abs=1e-9)
    torch.testing.assert_close(g_ours, g_trl, rtol=1e-6, atol=1e-9)
    assert g_ours.abs().sum() > 0


# ---- the trainer passes the options through ----------------------------------------------------
@pytest.mark.parametrize("extra", [["train.loss_type=sapo", "train.sapo_temperature_pos=2.0",
                                    "train.sapo_temperature_neg=0.5", "train.kl_bias_correction=true"],
                                   ["train.loss_type=cispo", "train.epsilon_high=5.0"]])
def test_trainer_step_uses_the_options(tmp_path, monkeypatch, extra):
    import rhlab.trainer as trainer_mod

    calls = []

    def spy(*a, **kw):
        calls.append(kw)
        return policy_loss(*a, **kw)

    monkeypatch.setattr(trainer_mod, "policy_loss", spy)
    cfg = load_config(None, [f"output_dir={tmp_path}", "train.batch_size=8", "train.num_generations=4",
                             "sampling.max_new_tokens=16", "log.progress=false", "threads=1", "train.beta=0.1",
                             "env.rewards=[{name: sentence_length_5}]", *extra])
    t = trainer_mod.Trainer(cfg)
    row, _ = t.train_step(1)
    want = {k.split("=")[0].removeprefix("train."): v for k, v in (e.split("=") for e in extra)}
    assert calls and all(c["loss_type"] == want["loss_type"] for c in calls)
    c = calls[0]
    assert c["kl_bias_correction"] == (want.get("kl_bias_correction") == "true")
    if want["loss_type"] == "sapo":
        assert (c["sapo_temperature_pos"], c["sapo_temperature_neg"]) == (2.0, 0.5)
    else:
        assert c["epsilon_high"] == 5.0
    assert row["grad_norm"] > 0 and math.isfinite(row["loss"])
