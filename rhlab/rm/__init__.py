"""Learned reward models: a Bradley-Terry scalar head on a small causal LM (model.py), preference
pairs from the initial policy (pairs.py), training (train.py), proxy-vs-gold over-optimisation
analysis (overopt.py). The preference environment that uses them is rhlab/envs/preference.py."""

from rhlab.rm.model import RewardModel

__all__ = ["RewardModel"]
