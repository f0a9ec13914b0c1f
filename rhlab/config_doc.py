"""docs/config.md from RunConfig's schema: every key with its type, default and description, and
TRL's name and default where TRL 1.16's GRPOConfig has the same setting (see docs/losses.md).
Regenerate with `python -m rhlab.config_doc > docs/config.md`; tests/test_config.py checks it is current."""

from __future__ import annotations

import json
from typing import get_args, get_origin

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from rhlab.config import RunConfig
from rhlab.utils import unwrap_optional

# rhlab key -> (TRL GRPOConfig field, TRL default), read from GRPOConfig of TRL 1.16.0 (docs/losses.md)
TRL = {
    "seed": ("seed", "42"),
    "sampling.max_new_tokens": ("max_completion_length", "512"),
    "sampling.temperature": ("temperature", "1.0"),
    "sampling.top_k": ("top_k", "0"),
    "sampling.top_p": ("top_p", "1.0"),
    "sampling.repetition_penalty": ("repetition_penalty", "1.0"),
    "train.num_generations": ("num_generations", "8"),
    "train.gradient_accumulation_steps": ("gradient_accumulation_steps", "1"),
    "train.num_iterations": ("num_iterations", "1"),
    "train.lr": ("learning_rate", "1e-6"),
    "train.lr_schedule": ("lr_scheduler_type", "linear"),
    "train.warmup_steps": ("warmup_steps", "0"),
    "train.weight_decay": ("weight_decay", "0.0"),
    "train.adam_betas": ("adam_beta1, adam_beta2", "0.9, 0.999"),
    "train.max_grad_norm": ("max_grad_norm", "1.0"),
    "train.loss_type": ("loss_type", "dapo"),
    "train.epsilon": ("epsilon", "0.2"),
    "train.epsilon_high": ("epsilon_high", "= epsilon"),
    "train.delta": ("delta", "None"),
    "train.beta": ("beta", "0.0"),
    "train.kl_bias_correction": ("use_bias_correction_kl", "True"),
    "train.sapo_temperature_pos": ("sapo_temperature_pos", "1.0"),
    "train.sapo_temperature_neg": ("sapo_temperature_neg", "1.05"),
    "train.scale_rewards": ("scale_rewards", "group"),
    "train.mask_truncated_completions": ("mask_truncated_completions", "False"),
}


def _section(ann) -> type[BaseModel] | None:
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def _type(ann) -> str:
    if get_origin(ann) or get_args(ann):
        return str(ann).replace("typing.", "").replace("rhlab.config.", "")
    return getattr(ann, "__name__", str(ann))


def _rows(model: type[BaseModel], prefix: str = ""):
    for name, f in model.model_fields.items():
        key = prefix + name
        ann = unwrap_optional(f.annotation)
        sub = _section(ann) or (_section(get_args(ann)[0]) if get_origin(ann) is list else None)
        default = "(required)" if f.is_required() else json.dumps(to_jsonable_python(
            f.get_default(call_default_factory=True)))
        if sub is not None and ann is f.annotation and get_origin(ann) is not list:
            yield key, "section", "", f.description, ("", "")
            yield from _rows(sub, key + ".")
            continue
        yield key, _type(f.annotation), default, f.description, TRL.get(key, ("", ""))
        if sub is not None:  # a list of sections, or an optional one: its keys
            yield from _rows(sub, key + ("[]." if get_origin(ann) is list else "."))


def _cell(s: str) -> str:
    return s.replace("|", "\\|")


def render() -> str:
    lines = ["# Config reference", "",
             "Generated from `rhlab.config.RunConfig` by `python -m rhlab.config_doc > docs/config.md`; do not edit.",
             "Every key can be set in the YAML file or as `key.path=value` on the command line. The TRL columns",
             "name TRL 1.16's `GRPOConfig` field with the same meaning and its default (docs/losses.md).", "",
             "| key | type | default | description | TRL field | TRL default |", "|---|---|---|---|---|---|"]
    for key, typ, default, desc, (trl, trl_default) in _rows(RunConfig):
        cells = [f"`{key}`", f"`{typ}`" if typ != "section" else "section", f"`{default}`" if default else "",
                 desc or "", f"`{trl}`" if trl else "", trl_default]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
