"""Interventions ("arms") touch the training loop only through these hooks.

The loop calls, each step: on_scored (after the environment scored the rollouts, before
advantages: may change rewards or attach labels), on_gradients (after backward, before
the optimizer step: may mask or project gradients), and metrics (extra per-step numbers).
"""

from __future__ import annotations

from typing import Callable

from rhlab.rewards.registry import Registry


class Intervention:
    name = "vanilla"

    def setup(self, trainer) -> None:
        pass

    def on_scored(self, trainer, batch) -> None:
        pass

    def on_gradients(self, trainer) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {}


INTERVENTIONS = Registry("intervention")


@INTERVENTIONS.register("vanilla")
def vanilla() -> Intervention:
    """No intervention; the KL penalty arm is vanilla with train.beta > 0."""
    return Intervention()


def build_intervention(spec) -> Intervention:
    return INTERVENTIONS.build(spec.name, spec.params)


Factory = Callable[..., Intervention]
