"""A lean decoder for LLaMA-architecture models (also Qwen2, Qwen3: ARCHS) with a preallocated (static) KV cache.

Why not `model(...)` with a DynamicCache: at 1.25M parameters a decode step is a few dozen
tiny matmuls, and transformers' per-call overhead (mask building, cache objects, output
classes) costs more than the arithmetic. At construction the runner reads each linear layer's
*effective* weight — a plain nn.Linear's own weight, or, for any adapter wrapped around one
(peft LoRA, dual retain/forget LoRA, the SVD adapter), the weight its forward computes, merged
once per generation call — and fuses q/k/v and gate/up into one matmul each. Decoding then runs
plain tensor ops on those weights: no per-module Python, no adapter overhead per token. Prompts
repeated for a group are prefilled once each and their KV cache copied. Outputs match the
transformers forward (tested).
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from rhlab.models.llama_block import Dims, LayerWeights, core_model, decoder_layer, head_rows, qk_norms, rms_norm, \
    rope_cos_sin


STATIC_ROPE = ("default", "linear", "llama3")  # inv_freq fixed at load time (not "dynamic")
# LLaMA-shaped decoders: Qwen2 adds q/k/v biases, Qwen3 a per-head RMSNorm on q and k (q_norm, k_norm)
# before RoPE. Every linear bias is supported (read with effective_linear); sliding-window layers are not.
ARCHS = ("llama", "qwen2", "qwen3")


def supports(model) -> bool:
    core = core_model(model)
    cfg = getattr(core, "config", None)
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    return (getattr(cfg, "model_type", None) in ARCHS and rope.get("rope_type", "default") in STATIC_ROPE
            and all(t == "full_attention" for t in getattr(cfg, "layer_types", None) or ())
            and not getattr(cfg, "use_sliding_window", False)
            and getattr(cfg, "hidden_act", "silu") == "silu" and hasattr(core, "model")
            and _in_features(getattr(core, "lm_head", None)) is not None)


def _in_features(m) -> int | None:
    """Input width of a linear layer or of an adapter wrapped around one (None: not linear-like)."""
    for obj in (m, getattr(m, "base_layer", None), getattr(m, "base", None)):
        if isinstance(getattr(obj, "in_features", None), int):
            return obj.in_features
    return None


def peft_lora_parts(m: nn.Module) -> tuple[nn.Linear, list[tuple[torch.Tensor, torch.Tensor, float]]] | None:
    """(base layer, [(A, B, scaling) per active adapter]) for a peft LoRA Linear whose forward is exactly
    base(x) + sum B(A(x)) * scaling: plain LoRA (no DoRA or other variant), not merged, dropout
    inactive, no LoRA bias, one dtype. None for anything else (then callers use the module itself)."""
    base = getattr(m, "base_layer", None)
    if type(base) is not nn.Linear or not all(hasattr(m, a) for a in ("lora_A", "lora_B", "scaling", "lora_variant")):
        return None
    if getattr(m, "merged", True) or getattr(m, "disable_adapters", True):
        return None
    out = []
    for name in m.active_adapters:
        if name not in m.lora_A:
            continue
        A, B, drop = m.lora_A[name], m.lora_B[name], m.lora_dropout[name]
        if (name in m.lora_variant or type(A) is not nn.Linear or type(B) is not nn.Linear or B.bias is not None
                or A.bias is not None or (drop.training and getattr(drop, "p", 0) > 0)
                or A.weight.dtype != base.weight.dtype):
            return None
        out.append((A.weight, B.weight, float(m.scaling[name])))
    return base, out


@torch.no_grad()
def effective_linear(m: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(W, b) with m(x) == x @ W.T + b for a linear layer or any adapter around one.

    A plain nn.Linear gives its own tensors; a plain peft LoRA layer W + scaling * B @ A. Anything
    else must be affine in x (dual LoRA, SVD adapter, in eval mode): its weight is read off by
    probing it with the identity and zero, W.T = m(I) - m(0), b = m(0) — exact up to float
    rounding, and one small matmul per layer."""
    if type(m) is nn.Linear:
        return m.weight, m.bias
    lora = peft_lora_parts(m)
    if lora is not None:
        base, adapters = lora
        W = base.weight
        for A, B, scale in adapters:
            W = W + (B * scale) @ A
        return W, base.bias
    assert not any(x.training and isinstance(x, nn.Dropout) and x.p > 0 for x in m.modules()), \
        f"{type(m).__name__}: active dropout; put the model in eval mode before sampling"
    d_in = _in_features(m)
    assert d_in is not None, f"{type(m).__name__}: not a linear layer or an adapter around one"
    p = next(m.parameters())
    dt = _input_dtype(m)
    zero = m(torch.zeros(1, d_in, dtype=dt, device=p.device))[0]
    W = (m(torch.eye(d_in, dtype=dt, device=p.device)) - zero).T.contiguous()
    return W, (zero if bool(zero.any()) else None)


def _input_dtype(m: nn.Module) -> torch.dtype:
    """The dtype an adapter's forward takes: its frozen base weight's (the model's dtype). Not simply its
    first parameter's: the SVD adapter keeps delta_S in float32 under a bfloat16 model."""
    for w in (getattr(getattr(m, "base_layer", None), "weight", None),
              getattr(getattr(m, "base", None), "weight", None), getattr(m, "Vh", None)):
        if isinstance(w, torch.Tensor):
            return w.dtype
    return next(m.parameters()).dtype


def _is_adapter(m: nn.Module) -> bool:
    """An adapter wrapped around a linear layer (peft LoRA, dual LoRA, SVD): linear-like, not a plain nn.Linear."""
    return type(m) is not nn.Linear and _in_features(m) is not None and any(True for _ in m.parameters())


@torch.no_grad()
def merged_state_dict(model) -> dict[str, torch.Tensor]:
    """The plain LlamaForCausalLM state dict of a possibly adapter-wrapped policy, every adapter merged.

    HF names (model.embed_tokens.weight, model.layers.0.self_attn.q_proj.weight, ..., lm_head.weight):
    what a fresh model of the same architecture (or vLLM's load_weights) accepts. Each adapter around a
    linear layer (peft LoRA, dual retain/forget LoRA at its current scales, SVD adapter) becomes the
    weight (and bias) its forward computes, read with effective_linear; everything else is the model's
    own tensors, detached, on their device. Put the model in eval mode first (dropout). A tied output
    layer appears under both names, the same tensor; a wrapped one (SVD on lm_head) is its own weight,
    so the receiving model must then have untied embeddings."""
    core = core_model(model)
    merged: dict[str, torch.Tensor] = {}
    wrapped: list[str] = []
    for name, m in core.named_modules():
        if not name or any(name.startswith(w + ".") for w in wrapped):
            continue
        if _is_adapter(m):
            wrapped.append(name)
            W, b = effective_linear(m)
            merged[f"{name}.weight"] = W.detach()
            if b is not None:
                merged[f"{name}.bias"] = b.detach()
    out = {k: v.detach() for k, v in core.state_dict(keep_vars=True).items()
           if not any(k.startswith(w + ".") for w in wrapped)}
    out.update(merged)
    return out


def policy_logits(model, ids, attn, pos, prompt_len: int, vocab_limit: int | None = None) -> torch.Tensor:
    """Logits predicting the completion tokens (positions prompt_len-1 .. end-1), over the first
    vocab_limit ids. Computing only those positions and rows is exact for the policy and skips
    most of the output layer when a model's vocabulary is larger than its tokenizer's (the
    built-in model uses 576 of 4096 rows)."""
    core = core_model(model)
    head = head_rows(core, vocab_limit)
    base = getattr(core, getattr(core, "base_model_prefix", "model"), None)
    if head is not None and base is not None:
        h = base(input_ids=ids, attention_mask=attn, position_ids=pos).last_hidden_state[:, prompt_len - 1:-1]
        return F.linear(h, *head).float()
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, prompt_len - 1:-1].float()
    if vocab_limit is not None and vocab_limit < logits.shape[-1]:
        logits = logits.masked_fill(torch.arange(logits.shape[-1], device=logits.device) >= vocab_limit,
                                    float("-inf"))
    return logits


def _fused(mods: list[nn.Module]):
    """x -> the modules' outputs concatenated, as one matmul on their effective weights (read once)."""
    if len(mods) == 1:
        W, b = effective_linear(mods[0])
        return partial(F.linear, weight=W, bias=b)
    ws, bs = zip(*(effective_linear(m) for m in mods))
    bias = None if all(b is None for b in bs) else torch.cat(
        [b if b is not None else w.new_zeros(w.shape[0]) for w, b in zip(ws, bs)])
    return partial(F.linear, weight=torch.cat(ws), bias=bias)


class LlamaRunner:
    def __init__(self, model, batch: int, max_len: int, vocab_limit: int | None = None):
        core = core_model(model)
        assert supports(model), f"LlamaRunner supports {', '.join(ARCHS)} models with static RoPE " \
                                f"({STATIC_ROPE}), full attention, SiLU MLP"
        self.dims = d = Dims.of(core.config)
        self.embed = core.model.embed_tokens
        self.layers = [LayerWeights(
            layer.input_layernorm.weight, layer.post_attention_layernorm.weight, qk_norms(layer.self_attn),
            qkv=_fused([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]),
            o=_fused([layer.self_attn.o_proj]), gate_up=_fused([layer.mlp.gate_proj, layer.mlp.up_proj]),
            down=_fused([layer.mlp.down_proj])) for layer in core.model.layers]
        self.norm = core.model.norm.weight
        W, b = effective_linear(core.lm_head)
        n = W.shape[0] if vocab_limit is None else min(vocab_limit, W.shape[0])
        self.head = (W[:n], None if b is None else b[:n])
        p = next(core.parameters())
        self.dtype = p.dtype
        # RoPE tables for every position the cache can hold: indexing them is exact and saves ~10 ops a step
        self.cos, self.sin = rope_cos_sin(core.model.rotary_emb, torch.arange(max_len, device=p.device), self.dtype)
        shape = (len(self.layers), batch, d.KV, max_len, d.hd)
        self.k = torch.zeros(shape, dtype=self.dtype, device=p.device)
        self.v = torch.zeros(shape, dtype=self.dtype, device=p.device)
        # additive attention bias over cache slots: 0 = visible, -inf = padding / not yet written
        self.pad_bias = torch.zeros((batch, 1, 1, max_len), dtype=self.dtype, device=p.device)

    def _attend(self, i: int, start: int, bias: torch.Tensor, qk: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Layer i: the new tokens' k and v into cache slots [start, start + L), then attention over [0, start + L)."""
        (B, L), d = qk.shape[:2], self.dims
        end = start + L
        q, k = qk.transpose(1, 2).split((d.H, d.KV), 1)
        self.k[i, :B, :, start:end] = k
        self.v[i, :B, :, start:end] = v.view(B, L, d.KV, d.hd).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, self.k[i, :B, :, :end], self.v[i, :B, :, :end], attn_mask=bias,
                                           enable_gqa=d.H != d.KV)
        return a.transpose(1, 2).reshape(B, L, d.H * d.hd)

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor, pos: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """The prompts into cache slots [0, P); last-position logits. Each distinct prompt row runs
        once (a group repeats its prompt num_generations times); its cache is then copied."""
        B = ids.shape[0]
        uniq, inverse = torch.unique(torch.cat([ids, visible.to(ids.dtype)], 1), dim=0, return_inverse=True)
        if len(uniq) == B:
            return self.forward(ids, pos, 0, visible)
        first = torch.full((len(uniq),), B, dtype=torch.long, device=ids.device).scatter_reduce_(
            0, inverse, torch.arange(B, device=ids.device), reduce="amin")
        logits = self.forward(ids[first], pos[first], 0, visible[first])
        P = ids.shape[1]
        for buf in (self.k, self.v):  # rows 0..U-1 hold the distinct prompts: spread them to all B rows
            buf[:, :, :, :P] = buf[:, inverse, :, :P].clone()
        self.pad_bias[:, :, :, :P] = self.pad_bias[inverse, :, :, :P].clone()
        return logits[inverse]

    @torch.no_grad()
    def keep_rows(self, idx: torch.Tensor) -> None:
        """Move cache rows idx (sorted) to the front: later calls with B = len(idx) continue those rows."""
        n = len(idx)
        for buf in (self.k, self.v):
            buf[:, :n] = buf[:, idx]
        self.pad_bias[:n] = self.pad_bias[idx]

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, pos: torch.Tensor, start: int, visible: torch.Tensor | None = None):
        """Run L new tokens of the first B cache rows into slots [start, start + L); last-position logits.

        visible: [B, L] 0/1 for the new slots (padding = 0); default all visible.
        """
        B, L = ids.shape
        end = start + L
        pad = self.pad_bias[:B]
        pad[:, 0, 0, start:end] = 0.0 if visible is None else torch.where(visible.bool(), 0.0, float("-inf"))
        bias = pad[:, :, :, :end]
        if L > 1:  # causal within the new block
            causal = torch.full((L, end), float("-inf"), dtype=self.dtype, device=pad.device).triu(start + 1)
            bias = bias + causal
            # every query sees at least itself: a left-padding row with no visible key would make
            # NaNs that leak through 0 * NaN in later layers (real tokens never see padding)
            diag = torch.arange(L, device=pad.device)
            bias[:, :, diag, start + diag] = 0.0
        cos, sin = self.cos[pos][:, :, None], self.sin[pos][:, :, None]  # [B, L, 1, hd]: one per token
        x = self.embed(ids)
        for i, w in enumerate(self.layers):
            x = decoder_layer(x, w, self.dims, cos, sin, partial(self._attend, i, start, bias))
        return F.linear(rms_norm(x[:, -1], self.norm, self.dims.eps), *self.head)
