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
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from rhlab.registry import Registry, params_model, validate_params
from rhlab.rewards.registry import DETECTORS


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
# intervention name -> a check of the params that name another registered component (a hack detector and
# its params), which the params model of its factory cannot see into; run at config load (config.check_params)
NESTED_CHECKS: dict[str, Callable[[dict], None]] = {}


class DetectorRef(BaseModel):
    """A hack detector named inside an intervention's params."""
    model_config = ConfigDict(extra="forbid")
    name: str
    params: dict[str, Any] = Field(default_factory=dict)


def check_detector(name: str, params: dict, name_key: str, params_key: str) -> None:
    """A registered hack detector, and params its factory accepts; a one-line ValueError naming name_key or
    the bad key under params_key."""
    try:
        factory, params = DETECTORS.resolve(name, params)
    except ValueError as e:
        raise ValueError(f"{name_key}: {e}") from None
    validate_params(params_model(factory), params, params_key, f"hack detector {name!r}")


def check_detector_ref(spec: Any, key: str) -> DetectorRef:
    """`key: {name, params}` naming a registered hack detector and its params (see check_detector)."""
    ref = validate_params(DetectorRef, spec, key, "a detector ({name, params})")
    check_detector(ref.name, ref.params, f"{key}.name", f"{key}.params")
    return ref


@INTERVENTIONS.register("vanilla")
def vanilla() -> Intervention:
    """No intervention; the KL penalty arm is vanilla with train.beta > 0."""
    return Intervention()


Factory = Callable[..., Intervention]
