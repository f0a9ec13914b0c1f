"""Model loading (builtin, local directory, Hub id via a local cache) and the sampler."""

import pytest
import torch

from rhlab.models.loading import encode_prompts, load_model, resolve_model_path
from rhlab.models.sampler import filter_logits, generate
from rhlab.models.sampling import SamplingSpec
from rhlab.trainer import sequence_logprobs

PROMPTS = ["Mia was a little girl who lived by the sea.", "One sunny morning, Tom woke up early."]


def _gen(model, tok, prompts, seed=0, **kw):
    cfg = SamplingSpec(**{"max_new_tokens": 24, **kw})
    return generate(model, encode_prompts(tok, prompts), cfg, tok.eos_token_id, tok.pad_token_id,
                    torch.Generator().manual_seed(seed), vocab_limit=len(tok))


def test_hub_id_loads_from_cache_and_tokenizer_is_normalised(hub_cache):
    model, tok = load_model("SimpleStories/SimpleStories-1.25M", cache_dir=hub_cache, local_files_only=True)
    assert model.config.num_hidden_layers == 4 and model.config.vocab_size == 4096
    assert tok.eos_token == "[EOS]" and tok.eos_token_id == 1
    assert tok.pad_token_id == tok.eos_token_id  # no pad token in SimpleStories: EOS stands in
    with_special = tok("the cat sat.")["input_ids"]
    assert with_special[-1] == 1  # the post-processor appends EOS...
    assert encode_prompts(tok, ["the cat sat."])[0] == with_special[:-1]  # ...prompts must not have it
    r = _gen(model, tok, ["the cat sat."], max_new_tokens=5)
    assert r.completion_ids.shape == (1, 5)


def test_local_directory_and_errors(tmp_path, hub_cache):
    snap = next(hub_cache.glob("models--*/snapshots/*"))
    assert resolve_model_path(str(snap)) == str(snap)
    with pytest.raises(FileNotFoundError, match="config.json"):
        resolve_model_path(str(tmp_path))
    with pytest.raises(ValueError, match="allowed: builtin:tiny-stories"):
        resolve_model_path("builtin:nope")
    with pytest.raises(ValueError, match="Hub id"):
        resolve_model_path("not-a-model")


def test_sampler_is_deterministic(builtin):
    model, tok = builtin
    a, b = _gen(model, tok, PROMPTS * 2, seed=3), _gen(model, tok, PROMPTS * 2, seed=3)
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.logprobs, b.logprobs)
    c = _gen(model, tok, PROMPTS * 2, seed=4)
    assert not torch.equal(a.completion_ids, c.completion_ids)


def test_sampler_masks_eos_and_truncation(builtin):
    model, tok = builtin
    r = _gen(model, tok, PROMPTS * 4, max_new_tokens=120)
    for ids, m, trunc in zip(r.completion_ids, r.completion_mask, r.truncated):
        n = int(m.sum())
        assert m[:n].all() and not m[n:].any()  # mask is a prefix
        if trunc:
            assert n == 120 and tok.eos_token_id not in ids[:n].tolist()
        else:
            assert ids[n - 1] == tok.eos_token_id and tok.eos_token_id not in ids[:n - 1].tolist()
            assert (ids[n:] == tok.pad_token_id).all()
    assert (~r.truncated).any()  # the built-in model ends its stories
    short = _gen(model, tok, PROMPTS, max_new_tokens=3)
    assert short.truncated.all()


def test_sampler_logprobs_match_full_forward(builtin):
    model, tok = builtin
    r = _gen(model, tok, PROMPTS * 2, temperature=0.8)
    full, _ = sequence_logprobs(model, r, temperature=0.8, vocab_limit=len(tok))
    m = r.completion_mask.bool()
    torch.testing.assert_close(full[m], r.logprobs[m], atol=1e-4, rtol=1e-3)  # fp32 cache vs full pass


def test_rollouts_are_ordinary_tensors(builtin):
    """generate() decodes in inference mode but returns tensors that autograd may save (index, multiply)."""
    model, tok = builtin
    r = _gen(model, tok, PROMPTS, max_new_tokens=6)
    assert not any(getattr(r, f).is_inference() for f in r.__dataclass_fields__)
    w = torch.ones(len(tok), requires_grad=True)
    (w[r.completion_ids] * r.logprobs).sum().backward()
    assert w.grad.sum() != 0


def test_finished_rows_leave_the_batch_without_changing_samples(builtin, monkeypatch):
    """The fast decoder compacts its cache to the rows still decoding; samples stay those of the full batch."""
    import rhlab.models.sampler as sm

    model, tok = builtin
    sizes = []
    step = sm._FastDecoder.step

    def spy(self, *a):
        out = step(self, *a)
        sizes.append(len(self.rows))
        return out

    monkeypatch.setattr(sm._FastDecoder, "step", spy)
    a = _gen(model, tok, PROMPTS * 4, seed=2, max_new_tokens=80)
    assert min(sizes) < 8 and sizes[0] == 8  # rows did leave
    monkeypatch.setattr(sm._FastDecoder, "COMPACT_AT", 0.0)  # never compact
    sizes.clear()
    b = _gen(model, tok, PROMPTS * 4, seed=2, max_new_tokens=80)
    assert set(sizes) == {8}
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.completion_mask, b.completion_mask)
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=1e-5)


def test_left_padding_does_not_change_samples(builtin):
    """Greedy continuation of a short prompt is the same alone and next to a longer prompt."""
    model, tok = builtin
    alone = _gen(model, tok, PROMPTS[1:], temperature=1.0, top_k=1)
    batched = _gen(model, tok, PROMPTS, temperature=1.0, top_k=1)
    n = int(alone.completion_mask.sum())
    assert torch.equal(alone.completion_ids[0, :n], batched.completion_ids[1, :n])


def test_filter_logits_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, 2, 1.0)).tolist() == [[False, False, True, True]]
    # nucleus 0.7: 0.5 then 0.3 reaches it; 0.15 and 0.05 are dropped
    assert torch.isinf(filter_logits(logits, 0, 0.7)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, 0, 0.5)).tolist() == [[False, True, True, True]]


@pytest.mark.parametrize("lora", [False, True])
def test_fast_backend_matches_transformers_forward(builtin, lora):
    """The static-cache LLaMA runner gives the same samples and log-probs as transformers' forward,
    with left padding (prompts of different lengths), also through a peft LoRA wrapper."""
    import copy

    from rhlab.config import LoraSpec
    from rhlab.models.checkpoint import add_lora

    model, tok = builtin
    if lora:
        model = add_lora(copy.deepcopy(model), LoraSpec(enabled=True, r=4))
        with torch.no_grad():  # non-zero B so the adapter actually changes the outputs
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.05)
    prompts = PROMPTS + ["Leo was a kind bear who lived on a green hill. One day, Leo found a red ball."]
    a = _gen(model, tok, prompts * 3, seed=5, max_new_tokens=40, backend="hf")
    b = _gen(model, tok, prompts * 3, seed=5, max_new_tokens=40, backend="fast")
    assert torch.equal(a.completion_ids, b.completion_ids)
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-4, rtol=1e-4)


def test_backend_errors(hub_cache, builtin):
    with pytest.raises(ValueError, match="backend\n  Input should be 'auto', 'fast', 'hf' or 'vllm'"):
        _gen(*builtin, PROMPTS, backend="vllm-typo")  # the settings themselves reject it
    with pytest.raises(ValueError, match="not a generate\\(\\) backend.*Trainer"):
        _gen(*builtin, PROMPTS, backend="vllm")


def test_restricted_head_equals_full_logits(builtin):
    """Computing only the tokenizer's rows of the output layer gives exactly the full logits' rows."""
    from rhlab.models.fast_llama import policy_logits

    model, tok = builtin
    r = _gen(model, tok, PROMPTS, max_new_tokens=12)
    ids = torch.cat([r.prompt_ids, r.completion_ids], 1)
    attn = torch.cat([r.prompt_mask, r.completion_mask], 1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    P = r.prompt_ids.shape[1]
    full = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, P - 1:-1]
    part = policy_logits(model, ids, attn, pos, P, vocab_limit=len(tok))
    assert part.shape[-1] == len(tok) < full.shape[-1]
    torch.testing.assert_close(part, full[..., :len(tok)], atol=1e-5, rtol=1e-5)


def test_effective_linear_equals_each_adapter_forward(builtin, tmp_path):
    """The fast runner merges adapters by probing them: W.T = m(I) - m(0), b = m(0). Check it against
    each adapter's own forward on random inputs (peft LoRA, dual LoRA with an ablated side, SVD)."""
    import copy

    from rhlab.adapters.dual_lora import DualLoRALinear
    from rhlab.adapters.svd import svd_modules, wrap_svd
    from rhlab.config import LoraSpec
    from rhlab.models.checkpoint import add_lora
    from rhlab.models.fast_llama import effective_linear

    model, _ = builtin
    torch.manual_seed(0)
    lin = torch.nn.Linear(128, 48)
    dual = DualLoRALinear(copy.deepcopy(lin), 4, 8, 2, 4)
    for p in (dual.retain_B, dual.forget_B):
        torch.nn.init.normal_(p, 0, 0.1)
    peft_model = add_lora(copy.deepcopy(model), LoraSpec(enabled=True, r=4)).eval()
    lora_q = peft_model.get_base_model().model.layers[1].self_attn.q_proj
    torch.nn.init.normal_(lora_q.lora_B["default"].weight, 0, 0.1)
    svd_model = copy.deepcopy(model)
    wrap_svd(svd_model, "builtin:tiny-stories", targets=["down_proj", "lm_head"], rank=16, cache_dir=tmp_path)
    svd = svd_modules(svd_model)
    for m in svd.values():
        torch.nn.init.normal_(m.delta_S, 0, 0.3)
    modules = [lin, dual, lora_q] + list(svd.values())[:2] + [svd["lm_head"]]
    x = torch.randn(5, 3, 512)
    with torch.no_grad():
        for m in modules:
            W, b = effective_linear(m)
            xi = x[..., :W.shape[1]]
            torch.testing.assert_close(torch.nn.functional.linear(xi, W, b), m(xi), atol=2e-5, rtol=1e-4)
        dual.forget_scale = 0.0  # the routing arm's retain_only evaluation
        W, b = effective_linear(dual)
        torch.testing.assert_close(torch.nn.functional.linear(x[..., :128], W, b), dual(x[..., :128]))
    assert effective_linear(lin)[0] is lin.weight  # a plain layer: its own tensor, nothing computed


def test_fast_backend_runs_svd_wrapped_head(builtin, tmp_path):
    """With every linear (output layer included) an SVD adapter, the fast runner still samples what
    transformers' forward samples."""
    import copy

    from rhlab.adapters.svd import svd_modules, wrap_svd
    from rhlab.models.sampler import pick_backend

    model, tok = builtin
    model = copy.deepcopy(model)
    wrap_svd(model, "builtin:tiny-stories", targets=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                     "down_proj", "lm_head"], cache_dir=tmp_path)
    torch.manual_seed(1)
    for m in svd_modules(model).values():
        torch.nn.init.normal_(m.delta_S, 0, 0.05)
    assert pick_backend(model, "auto") == "fast"
    a = _gen(model, tok, PROMPTS * 4, seed=3, max_new_tokens=32, backend="hf")
    b = _gen(model, tok, PROMPTS * 4, seed=3, max_new_tokens=32, backend="fast")
    assert torch.equal(a.completion_ids, b.completion_ids)
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-4, rtol=1e-4)


def _wrapped_copy(model, kind: str, tmp_path):
    """A copy of the built-in model under one adapter, with non-zero adapter weights (so merging matters)."""
    import copy

    from rhlab.adapters import dual_lora
    from rhlab.adapters.svd import svd_modules, wrap_svd
    from rhlab.adapters import ALL_LINEAR
    from rhlab.config import LoraSpec
    from rhlab.models.checkpoint import add_lora

    torch.manual_seed(0)
    m = copy.deepcopy(model)
    if kind == "peft_lora":
        m = add_lora(m, LoraSpec(enabled=True, r=4, dropout=0.1))
        params = [p for n, p in m.named_parameters() if "lora_B" in n]
    elif kind == "dual_lora":
        dual_lora.install(m, list(ALL_LINEAR), None, 4, 8, 2, 4)
        params = [p for d in dual_lora.dual_modules(m) for p in (d.retain_B, d.forget_B)]
    else:  # svd, the output layer too: that unties it from the input embedding
        wrap_svd(m, "builtin:tiny-stories", targets=list(ALL_LINEAR) + ["lm_head"], rank=16, cache_dir=tmp_path)
        params = [d.delta_S for d in svd_modules(m).values()]
    with torch.no_grad():
        for p in params:
            p.normal_(0, 0.3 if kind == "svd" else 0.05)
    return m.eval()


@pytest.mark.parametrize("kind", ["plain", "peft_lora", "dual_lora", "dual_lora_retain_only", "svd"])
def test_merged_state_dict_loads_into_a_plain_model(builtin, tmp_path, kind):
    """merged_state_dict (what the vLLM backend pushes) of a wrapped policy, loaded strictly into a fresh
    plain LlamaForCausalLM, gives the wrapped model's logits (padding included)."""
    import copy

    from transformers import LlamaForCausalLM

    from rhlab.adapters import dual_lora
    from rhlab.models.fast_llama import merged_state_dict

    model, tok = builtin
    wrapped = model if kind == "plain" else _wrapped_copy(model, kind.removesuffix("_retain_only"), tmp_path)
    if kind == "dual_lora_retain_only":  # the routing arm's ablation: the merge follows the current scales
        dual_lora.set_scales(wrapped, 1.0, 0.0)
    sd = merged_state_dict(wrapped)
    assert not any("lora" in k or "base_layer" in k or "delta_S" in k for k in sd)
    cfg = copy.deepcopy(model.config)
    if kind == "svd":
        assert not torch.equal(sd["lm_head.weight"], sd["model.embed_tokens.weight"])  # the head moved
        cfg.tie_word_embeddings = False  # a tied model cannot hold a head of its own
    plain = LlamaForCausalLM(cfg).eval()
    plain.load_state_dict(sd, strict=True)
    if kind == "plain":
        assert all(torch.equal(v, model.state_dict()[k]) for k, v in sd.items())
    r = _gen(model, tok, PROMPTS * 2, max_new_tokens=16)  # left-padded prompts + completions
    ids = torch.cat([r.prompt_ids, r.completion_ids], 1)
    attn = torch.cat([r.prompt_mask, r.completion_mask], 1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        want = wrapped(input_ids=ids, attention_mask=attn, position_ids=pos).logits
        got = plain(input_ids=ids, attention_mask=attn, position_ids=pos).logits
        if kind != "plain":  # the adapters do change the model: the check has teeth
            assert (want - model(input_ids=ids, attention_mask=attn, position_ids=pos).logits).abs().max() > 1e-2
    m = attn.bool()
    torch.testing.assert_close(got[m], want[m], atol=1e-4, rtol=1e-4)


def test_rollouts_from_completions_reproduces_generate_layout(builtin):
    """The vLLM backend's conversion from token lists gives exactly generate()'s tensors: left-padded
    prompts, right-padded completions cut after EOS, masks, truncation flags, log-probs (0 on padding)."""
    from rhlab.models.vllm_backend import rollouts_from_completions

    model, tok = builtin
    prompts = encode_prompts(tok, (PROMPTS + ["Leo was a kind bear who lived on a green hill."]) * 4)
    T = 60
    r = generate(model, prompts, SamplingSpec(max_new_tokens=T), tok.eos_token_id, tok.pad_token_id,
                 torch.Generator().manual_seed(2), vocab_limit=len(tok))
    assert r.truncated.any() and (~r.truncated).any()  # both kinds of row, and prompts of three lengths
    n = r.completion_mask.sum(1).tolist()
    comps = [row[:k] for row, k in zip(r.completion_ids.tolist(), n)]
    lps = [row[:k] for row, k in zip(r.logprobs.tolist(), n)]
    out = rollouts_from_completions(prompts, comps, lps, tok.eos_token_id, tok.pad_token_id, T)
    for f in r.__dataclass_fields__:
        a, b = getattr(r, f), getattr(out, f)
        assert a.dtype == b.dtype and torch.equal(a, b), f
    # tokens after EOS or past max_new_tokens are dropped; no log-probs means zeros
    longer = [c + [5, 6] if c[-1] == tok.eos_token_id else c + [5] * 3 for c in comps]
    again = rollouts_from_completions(prompts, longer, None, tok.eos_token_id, tok.pad_token_id, T)
    assert torch.equal(again.completion_ids, r.completion_ids) and torch.equal(again.truncated, r.truncated)
    assert not again.logprobs.any()


def test_effective_linear_probes_in_the_model_dtype(builtin, tmp_path):
    """Under a bfloat16 model the SVD adapter keeps delta_S in float32: the probe must use the model's
    dtype (the fast sampler used to fail on bf16 + SVD)."""
    import copy

    from rhlab.adapters.svd import svd_modules, wrap_svd
    from rhlab.models.fast_llama import effective_linear

    model = copy.deepcopy(builtin[0]).to(torch.bfloat16)
    wrap_svd(model, "builtin:tiny-stories", targets=["down_proj"], rank=16, cache_dir=tmp_path)
    m = next(iter(svd_modules(model).values()))
    assert m.delta_S.dtype == torch.float32
    with torch.no_grad():
        torch.nn.init.normal_(m.delta_S, 0, 0.3)
        W, b = effective_linear(m)
        x = torch.randn(3, W.shape[1], dtype=torch.bfloat16)
        assert W.dtype == torch.bfloat16 and b is None
        torch.testing.assert_close(torch.nn.functional.linear(x, W), m(x), atol=5e-2, rtol=5e-2)


def test_step_pieces_stay_on_the_model_device(builtin, monkeypatch):
    """No CUDA here, so the 'meta' device stands in for it: with the model on meta, any tensor a step
    creates on the CPU and mixes with a model tensor raises a device error. Covers the log-prob pass
    (both logits paths), the fast runner's buffers and masks, the sampler's penalty/filter math, the
    loss and backward, and LoRA / dual LoRA. (Data-dependent ops, e.g. the sampler's loop, cannot run on
    meta.)"""
    import copy

    import transformers.masking_utils as mu

    from rhlab.adapters.dual_lora import grad_mask, install
    from rhlab.algos.advantages import (
        grpo_advantages,
        rloo_advantages,
        screened_advantages,
    )
    from rhlab.algos.losses import Norm, policy_loss
    from rhlab.adapters import ALL_LINEAR
    from rhlab.config import LoraSpec
    from rhlab.models.checkpoint import add_lora
    from rhlab.models.fast_llama import LlamaRunner, merged_state_dict, policy_logits
    from rhlab.models.sampler import Rollouts, left_pad, penalize_repeats

    monkeypatch.setattr(mu, "_ignore_causal_mask_sdpa", lambda *a, **k: False)  # reads mask values
    D = torch.device("meta")
    model, tok = copy.deepcopy(builtin[0]).to(D), builtin[1]
    V = len(tok)
    with pytest.raises(RuntimeError, match="device"):  # the stand-in does catch a CPU tensor
        model.lm_head.weight + torch.zeros(model.lm_head.weight.shape)
    ids, mask = left_pad([[5, 6, 7], [8, 9, 10, 11, 12], [5], [6, 7]], 0, device=D)
    B, T = 4, 6
    comp, cm = torch.ones(B, T, dtype=torch.long, device=D), torch.ones(B, T, dtype=torch.long, device=D)
    r = Rollouts(ids, mask, comp, cm, torch.zeros(B, dtype=torch.bool, device=D), torch.zeros(B, T, device=D))
    logp, ent = sequence_logprobs(model, r, 0.9, with_entropy=True, vocab_limit=V, backend="hf")  # packed: data-dependent layout
    assert logp.device == ent.device == D
    all_ids, attn = torch.cat([ids, comp], 1), torch.cat([mask, cm], 1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)

    class Bare(torch.nn.Module):  # no base model attribute: policy_logits masks the full logits
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, **kw):
            return self.m(**kw)

    assert policy_logits(Bare(model), all_ids, attn, pos, ids.shape[1], V).device == D
    runner = LlamaRunner(model, B, ids.shape[1] + T, V)
    p_pos = (mask.cumsum(-1) - 1).clamp(min=0)
    runner.forward(ids, p_pos, 0, mask)  # what prefill runs (prefill's torch.unique is data-dependent)
    assert runner.forward(comp[:, :1], p_pos[:, -1:] + 1, ids.shape[1]).device == D
    seen = torch.zeros(B, V, dtype=torch.long, device=D).scatter_add_(1, ids, mask) > 0
    filter_logits(penalize_repeats(torch.zeros(B, V, device=D), seen, 1.2), 5, 0.9).softmax(-1)
    seen[torch.arange(B, device=D), comp[:, 0]] = True
    rewards = torch.tensor([1.0, 0.0, 2.0, 1.0], device=D)
    adv = grpo_advantages(rewards, 2) + rloo_advantages(rewards, 2)
    screened_advantages(rewards, torch.zeros(B, dtype=torch.bool, device=D), 2)
    out = policy_loss(logp, logp.detach(), adv, cm, loss_type="dapo", epsilon=0.2, beta=0.1, ref_logp=logp.detach(),
                      norm=Norm(B, 24.0, 24.0, 1, T))
    out.loss.backward()
    lora = add_lora(copy.deepcopy(model), LoraSpec(enabled=True, r=2))
    dual = copy.deepcopy(model)
    install(dual, list(ALL_LINEAR), None, 2, 4, 2, 4)
    for m in (lora, dual):
        assert all(p.device == D for p in m.parameters())
        sequence_logprobs(m, r, 1.0, vocab_limit=V, backend="hf")[0].sum().backward()
    with lora.disable_adapter():  # the LoRA reference
        sequence_logprobs(lora, r, 1.0, vocab_limit=V, backend="hf")
    with grad_mask(dual, retain=0):
        sequence_logprobs(dual, r, 1.0, vocab_limit=V, backend="hf")[0].sum().backward()
    assert all(v.device == D for v in merged_state_dict(model).values())
