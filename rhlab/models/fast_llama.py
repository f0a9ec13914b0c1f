"""A lean decoder for LLaMA-architecture models with a preallocated (static) KV cache.

Why not `model(...)` with a DynamicCache: at 1.25M parameters a decode step is a few dozen
tiny matmuls, and transformers' per-call overhead (mask building, cache objects, output
classes) costs more than the arithmetic. This runner calls the model's own submodules
(projections, norms, MLP), so LoRA / dual / SVD adapters wrapped around the linear layers
work unchanged, and does the rest (RoPE, cache writes, attention) with a handful of tensor
ops on preallocated buffers. Outputs match the transformers forward (tested).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _core(model):
    """The LlamaForCausalLM inside a possible peft wrapper."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


STATIC_ROPE = ("default", "linear", "llama3")  # inv_freq fixed at load time (not "dynamic")


def supports(model) -> bool:
    core = _core(model)
    cfg = getattr(core, "config", None)
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    return (getattr(cfg, "model_type", None) == "llama" and rope.get("rope_type", "default") in STATIC_ROPE
            and not getattr(cfg, "attention_bias", False) and hasattr(core, "model")
            and isinstance(getattr(core, "lm_head", None), torch.nn.Linear))  # a wrapped head (SVD arm) -> hf


def _head(core, vocab_limit: int | None):
    """Output-layer weight (and bias) restricted to the first vocab_limit rows, or None when the
    head is not a plain Linear (then callers use the full logits and mask them)."""
    head = getattr(core, "lm_head", None)
    if not isinstance(head, torch.nn.Linear):
        return None
    n = head.out_features if vocab_limit is None else min(vocab_limit, head.out_features)
    return head.weight[:n], None if head.bias is None else head.bias[:n]


def policy_logits(model, ids, attn, pos, prompt_len: int, vocab_limit: int | None = None) -> torch.Tensor:
    """Logits predicting the completion tokens (positions prompt_len-1 .. end-1), over the first
    vocab_limit ids. Computing only those positions and rows is exact for the policy and skips
    most of the output layer when a model's vocabulary is larger than its tokenizer's (the
    built-in model uses 576 of 4096 rows)."""
    core = _core(model)
    head = _head(core, vocab_limit)
    base = getattr(core, getattr(core, "base_model_prefix", "model"), None)
    if head is not None and base is not None:
        h = base(input_ids=ids, attention_mask=attn, position_ids=pos).last_hidden_state[:, prompt_len - 1:-1]
        return F.linear(h, *head).float()
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, prompt_len - 1:-1].float()
    if vocab_limit is not None and vocab_limit < logits.shape[-1]:
        logits = logits.masked_fill(torch.arange(logits.shape[-1]) >= vocab_limit, float("-inf"))
    return logits


class LlamaRunner:
    def __init__(self, model, batch: int, max_len: int, vocab_limit: int | None = None):
        core = _core(model)
        assert supports(model), f"LlamaRunner supports LLaMA models with static RoPE ({STATIC_ROPE}), no attention bias"
        cfg = core.config
        self.layers = core.model.layers
        self.embed, self.norm = core.model.embed_tokens, core.model.norm
        self.head = _head(core, vocab_limit)
        assert self.head is not None, "LlamaRunner needs a Linear output layer"
        self.h, self.kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.h
        rot = core.model.rotary_emb
        self.inv_freq, self.rope_scale = rot.inv_freq.float(), float(rot.attention_scaling)
        p = next(core.parameters())
        self.dtype = p.dtype
        shape = (len(self.layers), batch, self.kv, max_len, self.hd)
        self.k = torch.zeros(shape, dtype=self.dtype, device=p.device)
        self.v = torch.zeros(shape, dtype=self.dtype, device=p.device)
        # additive attention bias over cache slots: 0 = visible, -inf = padding / not yet written
        self.pad_bias = torch.zeros((batch, 1, 1, max_len), dtype=self.dtype, device=p.device)

    def _rope(self, pos: torch.Tensor):
        freqs = pos[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), -1)
        return ((emb.cos() * self.rope_scale).to(self.dtype)[:, None], (emb.sin() * self.rope_scale).to(self.dtype)[:, None])

    @staticmethod
    def _rotate(x, cos, sin):
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, pos: torch.Tensor, start: int, visible: torch.Tensor | None = None):
        """Run L new tokens written to cache slots [start, start + L); return last-position logits.

        visible: [B, L] 0/1 for the new slots (padding = 0); default all visible.
        """
        B, L = ids.shape
        end = start + L
        if visible is not None:
            self.pad_bias[:, 0, 0, start:end] = torch.where(visible.bool(), 0.0, float("-inf"))
        else:
            self.pad_bias[:, 0, 0, start:end] = 0.0
        bias = self.pad_bias[:, :, :, :end]
        if L > 1:  # causal within the new block
            causal = torch.full((L, end), float("-inf"), dtype=self.dtype).triu(start + 1)
            bias = bias + causal
            # every query sees at least itself: a left-padding row with no visible key would make
            # NaNs that leak through 0 * NaN in later layers (real tokens never see padding)
            diag = torch.arange(L)
            bias[:, :, diag, start + diag] = 0.0
        cos, sin = self._rope(pos)
        x = self.embed(ids)
        for i, layer in enumerate(self.layers):
            att = layer.self_attn
            hN = layer.input_layernorm(x)
            q = att.q_proj(hN).view(B, L, self.h, self.hd).transpose(1, 2)
            k = att.k_proj(hN).view(B, L, self.kv, self.hd).transpose(1, 2)
            v = att.v_proj(hN).view(B, L, self.kv, self.hd).transpose(1, 2)
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
            self.k[i, :, :, start:end] = k
            self.v[i, :, :, start:end] = v
            o = F.scaled_dot_product_attention(q, self.k[i, :, :, :end], self.v[i, :, :, :end], attn_mask=bias,
                                               enable_gqa=self.h != self.kv)
            x = x + att.o_proj(o.transpose(1, 2).reshape(B, L, self.h * self.hd))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return F.linear(self.norm(x[:, -1]), *self.head)
