"""Adapters beyond peft LoRA: dual (retain/forget) LoRA for gradient routing, SVD (delta_S) for rank-space projection."""

# The attention and MLP projections of the LLaMA family (LLaMA, Qwen2, Qwen3): what every adapter targets by default.
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
