"""The fast sampler runner (fast_llama.LlamaRunner) and the packed log-prob pass against transformers, on tiny
random models of each architecture supports() accepts (LLaMA, Qwen2 with q/k/v biases, Qwen3 with q/k
RMSNorm; tied and untied heads, grouped and equal q/kv heads, each static RoPE type), the clean decline
to the hf path for the rest (GPT-2, dynamic RoPE, sliding-window attention), and gradient checkpointing
(train.gradient_checkpointing) giving the same gradients on both paths."""

import copy
from contextlib import nullcontext

import pytest
import torch
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

from rhlab.models.fast_llama import supports
from rhlab.models.packed import supports_packed
from rhlab.models.sampler import generate, pick_backend
from rhlab.models.sampling import SamplingSpec
from rhlab.trainer import enable_gradient_checkpointing, sequence_logprobs

V, EOS, PAD = 96, 2, 0
SIZE = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=256, eos_token_id=EOS, pad_token_id=PAD)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16, "rope_theta": 10000.0}
SUPPORTED = {
    "llama_gqa_tied": lambda: LlamaForCausalLM(LlamaConfig(**SIZE, num_key_value_heads=2, tie_word_embeddings=True)),
    "llama_mha_untied_biases": lambda: LlamaForCausalLM(LlamaConfig(
        **SIZE, num_key_value_heads=4, tie_word_embeddings=False, attention_bias=True, mlp_bias=True)),
    "llama_rope_linear": lambda: LlamaForCausalLM(LlamaConfig(
        **SIZE, num_key_value_heads=2, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})),
    "llama_rope_llama3": lambda: LlamaForCausalLM(LlamaConfig(**SIZE, num_key_value_heads=1, rope_parameters=LLAMA3)),
    "qwen2_gqa_untied": lambda: Qwen2ForCausalLM(Qwen2Config(**SIZE, num_key_value_heads=2, tie_word_embeddings=False)),
    "qwen2_mha_tied": lambda: Qwen2ForCausalLM(Qwen2Config(**SIZE, num_key_value_heads=4, tie_word_embeddings=True)),
    "qwen3_gqa_tied": lambda: Qwen3ForCausalLM(Qwen3Config(**SIZE, num_key_value_heads=2, head_dim=16,
                                                            tie_word_embeddings=True)),
    "qwen3_mha_untied_bias": lambda: Qwen3ForCausalLM(Qwen3Config(**SIZE, num_key_value_heads=4, head_dim=8,
                                                                   tie_word_embeddings=False, attention_bias=True)),
}
DECLINED = {
    "gpt2": lambda: GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=256,
                                               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                               eos_token_id=EOS, pad_token_id=PAD)),
    "llama_rope_dynamic": lambda: LlamaForCausalLM(LlamaConfig(
        **SIZE, num_key_value_heads=2, rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})),
    "qwen3_sliding_window": lambda: Qwen3ForCausalLM(Qwen3Config(**SIZE, num_key_value_heads=2, head_dim=16,
                                                                  use_sliding_window=True, sliding_window=8,
                                                                  max_window_layers=1)),
}


def _model(build):
    """Weights far from init (norm weights around 1, biases non-zero) so each feature changes the outputs."""
    torch.manual_seed(0)
    model = build().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if "norm" in name or "ln_" in name else 0.0))
    return model


def _prompts():
    g = torch.Generator().manual_seed(3)
    lens = [5, 9, 2]  # different lengths: left padding; each repeated for a group
    return [torch.randint(3, V, (n,), generator=g).tolist() for n in lens for _ in range(3)]


def _rollouts(model, backend):
    cfg = SamplingSpec(max_new_tokens=12, temperature=1.0, backend=backend)
    return generate(model, _prompts(), cfg, EOS, PAD, torch.Generator().manual_seed(5))


@pytest.fixture(scope="module", params=sorted(SUPPORTED))
def supported(request):
    return _model(SUPPORTED[request.param])


def test_supported_models_take_the_fast_paths(supported):
    assert supports(supported) and supports_packed(supported) and pick_backend(supported, "auto") == "fast"


def test_fast_sampler_equals_transformers(supported):
    """Same samples (same seed) and log-probs as the transformers forward with a DynamicCache."""
    a, b = _rollouts(supported, "hf"), _rollouts(supported, "fast")
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.completion_mask, b.completion_mask)
    torch.testing.assert_close(b.logprobs, a.logprobs, atol=1e-4, rtol=1e-4)


def _grads(model, r, backend, checkpoint=False, saved=None):
    """(log-probs, entropy, gradients); `saved` (a list) collects the numel of every tensor autograd keeps."""
    model.zero_grad()

    def pack(t):
        saved.append(t.numel())
        return t

    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t) if saved is not None else nullcontext()
    with hooks:
        logp, ent = sequence_logprobs(model, r, 0.7, with_entropy=True, backend=backend, checkpoint=checkpoint)
    w = torch.randn(logp.shape, generator=torch.Generator().manual_seed(0)) * r.completion_mask
    (logp * w).sum().backward()
    return logp.detach(), ent, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_packed_logprobs_and_gradients_equal_transformers(supported):
    model = copy.deepcopy(supported)
    r = _rollouts(model, "fast")
    m = r.completion_mask.bool()
    la, ea, ga = _grads(model, r, "hf")
    lb, eb, gb = _grads(model, r, "packed")
    torch.testing.assert_close(lb[m], la[m], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(eb[m], ea[m], atol=2e-5, rtol=1e-5)
    assert ga.keys() == gb.keys() and any("bias" in n or "norm" in n for n in ga)
    for n in ga:
        assert ga[n].norm() > 0, n
        assert (gb[n] - ga[n]).norm() <= 2e-5 * ga[n].norm() + 1e-7, n


@pytest.mark.parametrize("name", sorted(DECLINED))
def test_other_models_decline_to_hf(name):
    model = _model(DECLINED[name])
    assert not supports(model) and not supports_packed(model)
    assert pick_backend(model, "auto") == "hf"
    with pytest.raises(ValueError, match="sampling.backend=fast needs"):
        pick_backend(model, "fast")
    r = _rollouts(model, "auto")  # the hf paths run them
    with pytest.raises(ValueError, match="logprob_backend=packed needs"):
        sequence_logprobs(model, r, 1.0, backend="packed")
    logp, _ = sequence_logprobs(model, r, 1.0, backend="auto")
    torch.testing.assert_close(logp * r.completion_mask, r.logprobs, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name,backend", [("qwen3_gqa_tied", "packed"), ("qwen3_gqa_tied", "hf"),
                                          ("llama_gqa_tied", "packed"), ("gpt2", "hf")])
def test_gradient_checkpointing_gives_the_same_gradients(name, backend):
    """CPU, float32: the packed pass's per-layer checkpointing and transformers' (enabled as the Trainer does)
    recompute the same numbers, so log-probs and gradients are those of the plain pass."""
    model = _model({**SUPPORTED, **DECLINED}[name]).train()
    r = _rollouts(model.eval(), "auto")
    model.train()
    plain, ckpt = [], []
    la, _, ga = _grads(model, r, backend, saved=plain)
    if backend == "hf":
        enable_gradient_checkpointing(model)
        assert model.is_activation_checkpointing
    lb, _, gb = _grads(model, r, backend, checkpoint=True, saved=ckpt)
    assert sum(ckpt) < 0.7 * sum(plain)  # it checkpoints: the layers' activations are not kept
    assert torch.equal(la, lb) and ga.keys() == gb.keys()
    for n in ga:
        torch.testing.assert_close(gb[n], ga[n], atol=1e-7, rtol=1e-6)
