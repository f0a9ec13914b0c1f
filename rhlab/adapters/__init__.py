"""Adapters beyond peft LoRA: dual (retain/forget) LoRA for gradient routing, SVD (delta_S) for rank-space projection."""
