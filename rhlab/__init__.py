"""rhlab: a lab for studying and preventing reward hacking in RL fine-tuning of language models."""
__version__ = "0.1.0"
