"""One LLaMA decoder layer, written once for the two fast paths: the sampler's static-cache runner
(fast_llama.LlamaRunner) and the padding-free log-prob pass (packed.packed_logprobs).

Both run the same pre-norm block: RMSNorm, fused q/k/v, Qwen3's per-head q/k RMSNorm, RoPE, attention,
output projection and residual, RMSNorm, SiLU-gated MLP and residual. They differ in how the weights
are applied (the runner: merged weights read once; the packed pass: the modules themselves, so
adapters train) and in attention (a KV cache; gathered prompt/completion layouts), which each passes in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

Proj = Callable[[torch.Tensor], torch.Tensor]


def core_model(model):
    """The *ForCausalLM inside a possible peft wrapper."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def head_rows(core, vocab_limit: int | None):
    """Output-layer weight (and bias) restricted to the first vocab_limit rows, or None when the
    head is not a plain Linear (then callers use the full logits and mask them)."""
    head = getattr(core, "lm_head", None)
    if not isinstance(head, torch.nn.Linear):
        return None
    n = head.out_features if vocab_limit is None else min(vocab_limit, head.out_features)
    return head.weight[:n], None if head.bias is None else head.bias[:n]


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm (normalise in float32, scale in the model's dtype) as one fused op where exact:
    torch's rms_norm equals transformers' formula bit for bit in float32 (tested via the samples)."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def qk_norms(att) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Qwen3's per-head q/k RMSNorm weights [head_dim] each, or None (LLaMA, Qwen2)."""
    qn, kn = getattr(att, "q_norm", None), getattr(att, "k_norm", None)
    return None if qn is None else (qn.weight, kn.weight)


def norm_qk(qk: torch.Tensor, norms, H: int, eps: float) -> torch.Tensor:
    """[..., H + KV, hd] q and k heads -> each RMS-normalised with its own weight (Qwen3); as is without norms."""
    if norms is None:
        return qk
    q, k = qk.split((H, qk.shape[-2] - H), -2)
    return torch.cat([rms_norm(q, norms[0], eps), rms_norm(k, norms[1], eps)], -2)


def rope_cos_sin(rotary_emb, pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [*pos.shape, head_dim] as transformers' LlamaRotaryEmbedding computes them (position *
    inv_freq in float32, cos/sin times attention_scaling, then the model's dtype)."""
    freqs = pos.float()[..., None] * rotary_emb.inv_freq.float().to(pos.device)
    emb = torch.cat((freqs, freqs), -1)
    scale = float(rotary_emb.attention_scaling)
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in transformers' rotate-half layout."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


@dataclass(frozen=True)
class Dims:
    H: int  # query heads
    KV: int  # key/value heads
    hd: int  # head dim
    eps: float  # RMSNorm epsilon

    @classmethod
    def of(cls, cfg) -> "Dims":
        H = cfg.num_attention_heads
        return cls(H, cfg.num_key_value_heads, getattr(cfg, "head_dim", None) or cfg.hidden_size // H,
                   float(cfg.rms_norm_eps))


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer as the block uses it: norm weights, and each projection as a function of its input."""
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qk_norms: tuple[torch.Tensor, torch.Tensor] | None
    qkv: Proj  # [..., d] -> [..., (H + 2 KV) hd]: q, k, v concatenated
    o: Proj
    gate_up: Proj  # [..., d] -> [..., 2 d_ff]: gate, up concatenated
    down: Proj


def decoder_layer(x: torch.Tensor, w: LayerWeights, dims: Dims, cos: torch.Tensor, sin: torch.Tensor,
                  attend: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """x [..., d] -> the layer's output. cos/sin broadcast against [..., H + KV, hd]; attend(qk, v) takes the
    rotated q and k heads [..., H + KV, hd] and v [..., KV hd] and returns the attention output [..., H hd]."""
    H, KV, hd = dims.H, dims.KV, dims.hd
    qk, v = w.qkv(rms_norm(x, w.input_norm, dims.eps)).split(((H + KV) * hd, KV * hd), -1)
    # q and k heads normed and rotated in one pass (same cos/sin per position)
    qk = rotate(norm_qk(qk.unflatten(-1, (H + KV, hd)), w.qk_norms, H, dims.eps), cos, sin)
    x = x + w.o(attend(qk, v))
    g, u = w.gate_up(rms_norm(x, w.post_norm, dims.eps)).chunk(2, -1)
    return x + w.down(F.silu(g) * u)
