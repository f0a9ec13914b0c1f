"""Every built-in environment (with the rewards and detectors it registers) and intervention, and
building one from its config section by name.

A component registers itself when its module is imported (rhlab/registry.py). This module imports
them all, so it sits above envs/ and interventions/; nothing below it imports it.
"""

from __future__ import annotations

import rhlab.envs.leetcode_rl  # noqa: F401
import rhlab.envs.minicode  # noqa: F401
import rhlab.envs.preference  # noqa: F401
import rhlab.envs.rewrite  # noqa: F401
import rhlab.envs.stories  # noqa: F401
import rhlab.interventions.penalties  # noqa: F401  (svd, svd_projection, advantage_penalty, monitor_penalty, screening)
import rhlab.interventions.routing  # noqa: F401
from rhlab.envs.base import ENVS, Environment
from rhlab.interventions.base import INTERVENTIONS, Intervention


def build_env(cfg, tokenizer=None) -> Environment:
    """cfg: rhlab.config.EnvConfig; tokenizer: the policy's, for environments that set needs_tokenizer
    (chat-templated prompts)."""
    if cfg.name not in ENVS:
        raise ValueError(f"env.name: unknown environment {cfg.name!r}; allowed: {', '.join(sorted(ENVS))}")
    cls = ENVS[cfg.name]
    if getattr(cls, "needs_tokenizer", False):
        if tokenizer is None:
            raise ValueError(f"env.name={cfg.name}: needs the policy's tokenizer (its prompts are chat-templated)")
        return cls(cfg, tokenizer)
    return cls(cfg)


def build_intervention(spec) -> Intervention:
    """spec: rhlab.config.InterventionSpec."""
    return INTERVENTIONS.build(spec.name, spec.params)
