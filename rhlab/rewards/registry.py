"""The reward and hack-detector registries (rhlab/registry.py), bound to YAML params.

A reward factory takes keyword params and returns fn(prompts, completions) -> list[float].
A detector factory returns fn(prompts, completions) -> list[bool].
Names may also be patterns (e.g. sentence_length_5): a resolver turns a name into
(factory, implied params). Environments register their rewards and detectors when imported.
"""

from __future__ import annotations

from typing import Callable

from rhlab.registry import Registry

RewardFn = Callable[[list[str], list[str]], list[float]]
DetectorFn = Callable[[list[str], list[str]], list[bool]]

REWARDS = Registry("reward")
DETECTORS = Registry("hack detector")
