"""The padding-free log-prob pass (rhlab/models/packed.py) against the transformers forward on the padded batch."""

import copy

import pytest
import torch

from rhlab.algos.losses import policy_loss
from rhlab.models.loading import encode_prompts
from rhlab.models.packed import build_layout, packed_logprobs
from rhlab.models.sampler import Rollouts, generate
from rhlab.models.sampling import SamplingSpec
from rhlab.trainer import sequence_logprobs

PROMPTS = ["Mia was a little girl who lived by the sea.", "One day, Tom saw a dog.", "The sun was hot."]


@pytest.fixture(scope="module")
def rollouts(builtin):
    """Groups of 4 (each prompt repeated), prompts of different lengths (left padding), completions
    that end early (EOS) and ones that are truncated (right padding)."""
    model, tok = builtin
    prompts = [p for p in PROMPTS for _ in range(4)] + ["Lily"]
    r = generate(model, encode_prompts(tok, prompts), SamplingSpec(max_new_tokens=40, temperature=1.3),
                 tok.eos_token_id, tok.pad_token_id, torch.Generator().manual_seed(1), vocab_limit=len(tok))
    lens = r.completion_mask.sum(1)
    assert r.truncated.any() and (~r.truncated).any() and lens.min() < 40  # the cases this test is about
    assert (r.prompt_mask == 0).any()
    return r


def _both(model, r, V, temperature=0.7, with_entropy=False):
    return [sequence_logprobs(model, r, temperature, with_entropy, V, backend=b) for b in ("hf", "packed")]


def _assert_grad_close(got, want, name=""):
    """Float rounding only: the two passes sum the same terms in different orders (relative error ~1e-6)."""
    assert (got - want).norm() <= 2e-5 * want.norm() + 1e-7, name


def _grads(model, r, V, backend, weights):
    model.zero_grad()
    logp, _ = sequence_logprobs(model, r, 0.7, vocab_limit=V, backend=backend)
    (logp * weights).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def test_logprobs_entropy_and_gradients_match_the_padded_forward(builtin, rollouts):
    model, tok = copy.deepcopy(builtin[0]), builtin[1]
    r, V, m = rollouts, len(tok), rollouts.completion_mask.bool()
    (a, ea), (b, eb) = _both(model, r, V, with_entropy=True)
    torch.testing.assert_close(b[m], a[m], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(eb[m], ea[m], atol=2e-5, rtol=1e-5)
    assert (b[~m] == 0).all() and (eb[~m] == 0).all()
    w = torch.randn(m.shape, generator=torch.Generator().manual_seed(0)) * m  # any loss over real tokens
    ga, gb = _grads(model, r, V, "hf", w), _grads(model, r, V, "packed", w)
    assert ga.keys() == gb.keys() and len(ga) > 10
    for n in ga:
        assert ga[n].norm() > 0, n
        _assert_grad_close(gb[n], ga[n], n)


def test_grpo_loss_and_its_gradient_match_a_straightforward_computation(builtin, rollouts):
    """The quantity training uses: the GRPO loss (KL to a moved reference) on identical inputs."""
    model, tok = copy.deepcopy(builtin[0]), builtin[1]
    ref = copy.deepcopy(model).requires_grad_(False)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    r, V = rollouts, len(tok)
    adv = torch.linspace(-1, 1, len(r))
    out = {}
    for backend in ("hf", "packed"):
        model.zero_grad()
        logp, _ = sequence_logprobs(model, r, 1.0, vocab_limit=V, backend=backend)
        with torch.no_grad():
            ref_logp, _ = sequence_logprobs(ref, r, 1.0, vocab_limit=V, backend=backend)
        res = policy_loss(logp, logp.detach() + 0.05, adv, r.completion_mask, loss_type="grpo", epsilon=0.2,
                          beta=0.04, ref_logp=ref_logp)
        res.loss.backward()
        out[backend] = (res.loss.detach(), res.kl, [p.grad.clone() for p in model.parameters()])
    (la, ka, ga), (lb, kb, gb) = out["hf"], out["packed"]
    assert abs(ka) > 1e-3
    torch.testing.assert_close(lb, la, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(kb, ka, atol=1e-6, rtol=1e-4)
    for x, y in zip(ga, gb):
        _assert_grad_close(y, x)


def test_lora_adapter_and_its_disabled_reference(builtin, rollouts):
    from rhlab.config import LoraSpec
    from rhlab.models.checkpoint import add_lora

    model = add_lora(copy.deepcopy(builtin[0]), LoraSpec(enabled=True, r=4))
    with torch.no_grad():  # LoRA starts as a no-op (B = 0): move it so the adapter matters
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n))))
    r, V, m = rollouts, len(builtin[1]), rollouts.completion_mask.bool()
    (a, _), (b, _) = _both(model, r, V)
    torch.testing.assert_close(b[m], a[m], atol=2e-5, rtol=1e-5)
    with model.disable_adapter():
        (ra, _), (rb, _) = _both(model, r, V)
    torch.testing.assert_close(rb[m], ra[m], atol=2e-5, rtol=1e-5)
    assert (a[m] - ra[m]).abs().max() > 1e-2  # the adapter does change the policy
    w = m.float()
    ga, gb = _grads(model, r, V, "hf", w), _grads(model, r, V, "packed", w)
    assert all("lora_" in n for n in ga) and len(ga) == 4 * 7 * 2
    for n in ga:
        _assert_grad_close(gb[n], ga[n], n)


def test_bfloat16_model_stays_close(builtin, rollouts):
    model = copy.deepcopy(builtin[0]).to(torch.bfloat16)
    m = rollouts.completion_mask.bool()
    (a, _), (b, _) = _both(model, rollouts, len(builtin[1]))
    assert b.dtype == torch.float32
    assert (b[m] - a[m]).abs().mean() < 0.02  # bf16 rounding differs between the two orders of operations


def test_layout_each_prompt_once_and_only_real_tokens():
    pid = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 8, 9], [0, 5, 6]])
    pm = (pid != 0).long()
    cid = torch.tensor([[1, 2, 3], [4, 1, 0], [9, 0, 0], [2, 2, 2]])
    cm = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]])
    lay = build_layout(pid, pm, cid, cm, torch.float32)
    # 2 distinct prompts (5 tokens) + completion inputs: all but each row's last token (2 + 1 + 0 + 2)
    assert lay.ids.tolist() == [5, 6, 7, 8, 9, 1, 2, 4, 2, 2]
    assert lay.pos.tolist() == [0, 1, 0, 1, 2, 2, 3, 2, 2, 3]  # completion j of a prompt of length p: p + j
    assert len(lay.pred_src) == 2 + 5 and lay.pred[2].tolist() == [1, 0, 0]
    with pytest.raises(AssertionError, match="ones then zeros"):
        build_layout(pid, pm, cid, torch.tensor([[1, 0, 1]] * 4), torch.float32)
    with pytest.raises(AssertionError, match="left-padded"):
        build_layout(pid.flip(1), pm.flip(1), cid, cm, torch.float32)


def test_one_token_completions_and_distinct_prompts(builtin):
    """No completion inputs at all (every completion is one token) and no repeated prompt."""
    model, tok = builtin
    ids, V = encode_prompts(tok, PROMPTS), len(tok)
    from rhlab.models.sampler import left_pad

    pid, pm = left_pad(ids, tok.pad_token_id)
    cid = torch.tensor([[5], [9], [tok.eos_token_id]])
    r = Rollouts(pid, pm, cid, torch.ones(3, 1, dtype=torch.long), torch.zeros(3, dtype=torch.bool), torch.zeros(3, 1))
    (a, _), (b, _) = _both(model, r, V)
    torch.testing.assert_close(b, a, atol=2e-5, rtol=1e-5)
    b2, _ = packed_logprobs(model, pid, pm, torch.tensor([[5, 6], [9, 9], [4, 4]]), torch.ones(3, 2, dtype=torch.long),
                            0.7, vocab_limit=V)
    assert b2.shape == (3, 2) and torch.isfinite(b2).all()


def test_backend_choice_fails_loudly(builtin, rollouts):
    class Bare(torch.nn.Module):  # not a LLaMA model as far as the packed pass can tell
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, **kw):
            return self.m(**kw)

    with pytest.raises(ValueError, match="needs a LLaMA-architecture model"):
        sequence_logprobs(Bare(builtin[0]), rollouts, 1.0, backend="packed")
    with pytest.raises(ValueError, match="allowed: auto, packed, hf"):
        sequence_logprobs(builtin[0], rollouts, 1.0, backend="fast")
    auto, _ = sequence_logprobs(Bare(builtin[0]), rollouts, 1.0, vocab_limit=len(builtin[1]))  # auto falls back
    assert torch.isfinite(auto).all()


def test_fast_lora_path_applies_only_to_plain_lora(builtin):
    """The packed pass and the sampler fold a peft LoRA layer only when its forward is base + B A x * scaling."""
    from rhlab.config import LoraSpec
    from rhlab.models.checkpoint import add_lora
    from rhlab.models.fast_llama import peft_lora_parts

    model = add_lora(copy.deepcopy(builtin[0]), LoraSpec(enabled=True, r=4, alpha=16))
    q = model.get_base_model().model.layers[0].self_attn.q_proj
    base, adapters = peft_lora_parts(q)
    assert base is q.base_layer and len(adapters) == 1 and adapters[0][2] == 4.0
    with model.disable_adapter():
        assert peft_lora_parts(q) is None  # the reference: the base layer alone (packed unwraps it)
    drop = add_lora(copy.deepcopy(builtin[0]), LoraSpec(enabled=True, r=4, dropout=0.1)).train()
    q = drop.get_base_model().model.layers[0].self_attn.q_proj
    assert peft_lora_parts(q) is None  # active dropout: the module itself is called
    drop.eval()
    assert peft_lora_parts(q) is not None
    assert peft_lora_parts(builtin[0].model.layers[0].self_attn.q_proj) is None  # a plain Linear
