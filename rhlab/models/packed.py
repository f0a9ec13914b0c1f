"""Policy and reference log-probs over only the tokens that matter: a padding-free training forward.

A GRPO batch repeats each prompt num_generations times and right-pads completions to the longest
one; the transformers forward on [B, P + T] runs every prompt 16 times and every padding slot
(about 40 % of the slots in a happy-stories batch). Here each distinct prompt runs once, and only
real tokens go through the linear layers and the MLP, packed as [N, d]. Attention gathers them
into two small padded layouts: the distinct prompts (causal), and each row's completion tokens
(its prompt's keys, then causal over its own tokens). Gradients flow through the gathers, so a
prompt token shared by a group receives the sum of the group's gradients: the gradient of the
padded forward. Adapters (peft LoRA, dual LoRA, the SVD adapter) are called as modules, so their
parameters train and peft's disable_adapter() works. Equal to the transformers path up to float
rounding (tests/test_packed.py); LLaMA-architecture models, Qwen2 and Qwen3 (fast_llama.supports).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from rhlab.models.fast_llama import peft_lora_parts, supports
from rhlab.models.llama_block import Dims, LayerWeights, core_model, decoder_layer, head_rows, qk_norms, rms_norm, \
    rope_cos_sin


def supports_packed(model) -> bool:
    cfg = getattr(core_model(model), "config", None)
    return supports(model) and float(getattr(cfg, "attention_dropout", 0.0) or 0.0) == 0.0


@dataclass
class Layout:
    ids: torch.Tensor  # [N] distinct prompts' real tokens, then every row's completion inputs
    pos: torch.Tensor  # [N] position ids, as the padded forward numbers them
    prompt_slots: torch.Tensor  # [U, P] packed index per slot (right-padded); empty slots hold 0 (see below)
    compl_slots: torch.Tensor  # [B, P + Tc] the row's prompt slots, then its completion inputs
    compl_bias: torch.Tensor  # [B, 1, Tc, P + Tc] additive attention bias for the completion queries
    back: torch.Tensor  # [N] each packed token's row in cat(prompt slots [U*P], completion queries [B*Tc])
    pred_src: torch.Tensor  # [U + Nc] packed tokens whose hidden state predicts a completion token
    pred: torch.Tensor  # [B, T] index into pred_src per completion position (0 where masked)
    mask: torch.Tensor  # [B, T] bool completion mask


def build_layout(prompt_ids, prompt_mask, completion_ids, completion_mask, dtype) -> Layout:
    dev, (B, P), T = prompt_ids.device, prompt_ids.shape, completion_ids.shape[1]
    pm, cm = prompt_mask.bool(), completion_mask.bool()
    plen, clen = pm.sum(1), cm.sum(1)
    ar_p, ar_t = torch.arange(P, device=dev), torch.arange(T, device=dev)
    assert bool((plen >= 1).all()) and torch.equal(pm, ar_p >= P - plen[:, None]), \
        "prompts must be left-padded with at least one real token"
    assert bool((clen >= 1).all()) and torch.equal(cm, ar_t < clen[:, None]), \
        "completion_mask must be ones then zeros, at least one token per row"
    # distinct prompts (rows of a group are equal); right-aligned: token s of prompt u in slot s
    uniq, inv = torch.unique(torch.cat([prompt_ids * pm, pm.long()], 1), dim=0, return_inverse=True)
    U, u_len = len(uniq), uniq[:, P:].sum(1)
    p_ids = uniq[:, :P][uniq[:, P:].bool()]  # left-padded rows: real tokens in order
    u_right = ar_p < u_len[:, None]  # the same tokens right-aligned: slot s = position s
    u_off = u_len.cumsum(0) - u_len
    n_p = int(u_len.sum())
    # completion inputs: tokens 0 .. clen-2 of each row (the last token predicts nothing we score)
    c_in = clen - 1
    Tc = int(c_in.max())
    c_real = ar_t[:Tc] < c_in[:, None]
    c_ids = completion_ids[:, :Tc][c_real]
    c_off = n_p + c_in.cumsum(0) - c_in
    N = n_p + int(c_in.sum())
    ids = torch.cat([p_ids, c_ids])
    pos = torch.cat([ar_p.expand(U, P)[u_right], (plen[:, None] + ar_t[:Tc])[c_real]])
    # Empty slots read token 0: their keys are never visible to a real query (causal over a right-padded
    # prompt; masked by the bias for completions) and their queries' outputs are dropped, so they get
    # zero gradient. Cheaper than gathering from a copy with an appended zero row.
    prompt_slots = torch.where(u_right, u_off[:, None] + ar_p, 0)
    compl_slots = torch.cat([prompt_slots[inv], torch.where(c_real, c_off[:, None] + ar_t[:Tc], 0)], 1)
    visible = torch.cat([(ar_p < plen[:, None])[:, None].expand(B, Tc, P),
                         (ar_t[:Tc, None] >= ar_t[None, :Tc]).expand(B, Tc, Tc)], 2)
    bias = torch.zeros(visible.shape, dtype=dtype, device=dev).masked_fill_(~visible, float("-inf"))[:, None]
    back = torch.cat([(ar_p + P * torch.arange(U, device=dev)[:, None])[u_right],
                      (U * P + Tc * torch.arange(B, device=dev)[:, None] + ar_t[:Tc])[c_real]])
    # predictors: the last token of each distinct prompt (-> completion token 0), then every completion input
    pred_src = torch.cat([u_off + u_len - 1, torch.arange(n_p, N, device=dev)])
    pred = torch.where(ar_t == 0, inv[:, None], U + c_off[:, None] - n_p + ar_t - 1)
    pred = pred.masked_fill(~cm, 0)
    return Layout(ids, pos, prompt_slots, compl_slots, bias, back, pred_src, pred, cm)


def _unwrap(m: nn.Module) -> nn.Module:
    """A peft LoRA layer inside disable_adapter() (the LoRA reference) computes its base layer alone."""
    while getattr(m, "disable_adapters", False) is True and not getattr(m, "merged", True) \
            and isinstance(getattr(m, "base_layer", None), nn.Module):
        m = m.base_layer
    return m


def _linear(mods: list[nn.Module], h: torch.Tensor) -> torch.Tensor:
    """Several projections of the same input: plain Linear layers in one matmul (the weight
    concatenation is differentiable); plain peft LoRA layers as that matmul on their base weights
    plus two for all their adapters (A stacked, B block-diagonal, scaling folded into B); any other
    adapter (dual LoRA, SVD, LoRA with active dropout) called as a module."""
    mods = [_unwrap(m) for m in mods]
    if all(type(m) is nn.Linear and m.bias is None for m in mods):
        return F.linear(h, torch.cat([m.weight for m in mods]) if len(mods) > 1 else mods[0].weight)
    if all(type(m) is nn.Linear for m in mods):  # biases (Qwen2's q/k/v)
        return F.linear(h, *_cat_linear(mods))
    parts = [peft_lora_parts(m) for m in mods]
    if all(p is not None and len(p[1]) == 1 for p in parts):
        out = F.linear(h, *_cat_linear([base for base, _ in parts]))
        t = F.linear(h, torch.cat([ad[0][0] for _, ad in parts]))
        return out + F.linear(t, torch.block_diag(*[ad[0][1] * ad[0][2] for _, ad in parts]))
    return torch.cat([m(h) for m in mods], -1)


def _cat_linear(mods: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenated weights and biases (zeros for a layer without one; None when none has one)."""
    W = torch.cat([m.weight for m in mods]) if len(mods) > 1 else mods[0].weight
    if all(m.bias is None for m in mods):
        return W, None
    return W, torch.cat([m.bias if m.bias is not None else m.weight.new_zeros(m.out_features) for m in mods])


def packed_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature: float,
                    with_entropy: bool = False, vocab_limit: int | None = None, checkpoint: bool = False):
    """Per-token log p(completion token) under softmax(logits / temperature) over the first vocab_limit
    ids: [B, T], 0 at masked positions (+ entropy [B, T], no gradient). Differentiable in the model.
    checkpoint: gradient checkpointing per decoder layer (train.gradient_checkpointing)."""
    core = core_model(model)
    base = core.model
    dims = Dims.of(core.config)
    H, KV, hd = dims.H, dims.KV, dims.hd
    dtype = base.embed_tokens.weight.dtype
    lay = build_layout(prompt_ids, prompt_mask, completion_ids, completion_mask, dtype)
    B, P = prompt_ids.shape
    U, Tc = lay.prompt_slots.shape[0], lay.compl_bias.shape[2]
    cos, sin = (t[:, None] for t in rope_cos_sin(base.rotary_emb, lay.pos, dtype))  # [N, 1, hd]
    gqa = H != KV

    def attend(qk, v):
        """Packed q/k [N, H + KV, hd] and v [N, KV hd] -> [N, H hd]: the distinct prompts (causal), then each
        row's completion queries over its prompt's keys and its own (lay.compl_bias)."""
        qkv = torch.cat([qk.flatten(1), v], -1)
        q, k, v = _heads(_rows(qkv, lay.prompt_slots), H, KV, hd)
        outs = [F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa).transpose(1, 2)
                .reshape(U * P, H * hd)]
        if Tc:
            q, k, v = _heads(_rows(qkv, lay.compl_slots), H, KV, hd)
            a = F.scaled_dot_product_attention(q[:, :, P:], k, v, attn_mask=lay.compl_bias, enable_gqa=gqa)
            outs.append(a.transpose(1, 2).reshape(B * Tc, H * hd))
        return torch.cat(outs).index_select(0, lay.back)

    def block(layer, x):
        # the weights are read here, inside the (possibly checkpointed) function, so a recompute sees them
        att, mlp = layer.self_attn, layer.mlp
        w = LayerWeights(layer.input_layernorm.weight, layer.post_attention_layernorm.weight, qk_norms(att),
                         qkv=partial(_linear, [att.q_proj, att.k_proj, att.v_proj]), o=partial(_linear, [att.o_proj]),
                         gate_up=partial(_linear, [mlp.gate_proj, mlp.up_proj]), down=partial(_linear, [mlp.down_proj]))
        return decoder_layer(x, w, dims, cos, sin, attend)

    x = base.embed_tokens(lay.ids)
    ckpt = checkpoint and torch.is_grad_enabled()
    for layer in base.layers:
        # checkpointing keeps only each layer's input; the backward recomputes the layer (same numbers)
        x = torch.utils.checkpoint.checkpoint(block, layer, x, use_reentrant=False) if ckpt else block(layer, x)
    h = rms_norm(x.index_select(0, lay.pred_src), base.norm.weight, dims.eps)
    head = head_rows(core, vocab_limit)
    logits = (F.linear(h, *head) if head is not None else core.lm_head(h)[:, :vocab_limit]).float()
    logp_all = (logits / temperature).log_softmax(-1)
    logp = logp_all[lay.pred, completion_ids.masked_fill(~lay.mask, 0)].masked_fill(~lay.mask, 0.0)
    if not with_entropy:
        return logp, None
    with torch.no_grad():
        p = logp_all.exp()
        ent = -(p * logp_all.masked_fill(p == 0, 0.0)).sum(-1)
    return logp, ent[lay.pred].masked_fill(~lay.mask, 0.0)


def _heads(t: torch.Tensor, H: int, KV: int, hd: int):
    """[R, S, (H + 2 KV) hd] -> q [R, H, S, hd], k and v [R, KV, S, hd]."""
    R, S = t.shape[:2]
    q, k, v = t.split((H * hd, KV * hd, KV * hd), -1)
    return (q.view(R, S, H, hd).transpose(1, 2), k.view(R, S, KV, hd).transpose(1, 2),
            v.view(R, S, KV, hd).transpose(1, 2))


def _rows(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """t[idx] for an index tensor of any shape; index_select's backward (index_add) is faster on CPU
    than advanced indexing's (index_put with accumulate)."""
    return t.index_select(0, idx.flatten()).view(*idx.shape, *t.shape[1:])
