"""Interventions ("arms") touch the training loop only through these hooks.

Once: prepare_model (before the optimizer is built: install adapters, freeze weights) and
setup (after). Each step: on_scored (after the environment scored the rollouts, before
advantages: may change batch.rewards or attach labels to batch.extra), advantages (may replace the
trainer's advantages, e.g. with statistics over some group members only), backward_groups (how a
micro-batch is split into separately back-propagated groups, each inside a context, e.g. one
that masks some adapters' gradients), on_gradients (after backward, before clipping and the
optimizer step: may project gradients), metrics (extra per-step numbers). At every evaluation:
extra_evals (more evaluations under other settings, e.g. with an adapter ablated). In every
checkpoint: state_dict (JSON-serialisable state that must survive a resume), restored by
load_state_dict.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable

from rhlab.registry import Registry


class Intervention:
    name = "vanilla"

    def prepare_model(self, trainer, model):
        return model

    def setup(self, trainer) -> None:
        pass

    def backward_groups(self, trainer, batch, idx):
        """[(indices, context)]: by default the whole micro-batch in one pass."""
        return [(idx, nullcontext())]

    def extra_evals(self, trainer) -> dict[str, dict]:
        """{mode name: metrics} evaluated next to the plain evaluation; logged as <mode>/<metric>."""
        return {}

    def on_scored(self, trainer, batch) -> None:
        pass

    def advantages(self, trainer, batch, adv):
        """The advantages the loss uses; adv is the trainer's (train.algo on batch.rewards)."""
        return adv

    def on_gradients(self, trainer) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict:
        """What a resumed run needs to continue exactly (JSON-serialisable; saved in every checkpoint)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        if state:
            raise ValueError(f"intervention {self.name}: checkpoint holds state {sorted(state)} this arm does not keep")


INTERVENTIONS = Registry("intervention")


@INTERVENTIONS.register("vanilla")
def vanilla() -> Intervention:
    """No intervention; the KL penalty arm is vanilla with train.beta > 0."""
    return Intervention()


Factory = Callable[..., Intervention]
