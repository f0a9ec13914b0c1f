"""Typed run configuration: YAML + dotted CLI overrides, validated with pydantic.

Every section forbids unknown keys; errors name the key and the allowed values, on one line.
Paths a config holds (PATH_KEYS) are made absolute at load: a relative path written in a
config file is relative to that file's directory, one given as a command-line override to the
working directory. Inputs that must exist are checked at load, before any model is loaded.
Outputs (output_dir) stay relative to the working directory.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Optional

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from rhlab.adapters import ALL_LINEAR
from rhlab.models.sampling import SamplingSpec
from rhlab.utils import format_validation_error

if TYPE_CHECKING:
    import torch


class ConfigError(ValueError):
    pass


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LoraSpec(Section):
    enabled: bool = Field(False,
        description="train LoRA adapters (peft) instead of every weight; the reference is then the base model with "
                    "the adapter disabled")
    r: int = Field(8, gt=0, description="LoRA rank")
    alpha: float = Field(16.0, gt=0, description="LoRA scaling numerator (scale = alpha / r)")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the LoRA input")
    target_modules: list[str] = Field(default_factory=lambda: list(ALL_LINEAR),
        description="names of the linear modules to adapt (default: every attention and MLP projection)")


DEVICES = "auto, cpu, cuda, cuda:N"
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


class ModelConfig(Section):
    name: str = Field("builtin:tiny-stories",
        description="the policy: builtin:NAME, a local save_pretrained directory, or a Hub id")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32",
        description="parameter dtype of policy and reference")
    device: str = Field("auto",
        description="where policy, reference and every tensor of a step live: auto (cuda when available, else cpu),"
                    " cpu, cuda, cuda:N")
    lora: LoraSpec = Field(default_factory=LoraSpec, description="LoRA settings")

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if not _DEVICE.fullmatch(v):
            raise ValueError(f"unknown device {v!r}; allowed: {DEVICES}")
        return v


def resolve_device(spec: str) -> torch.device:
    """model.device -> a torch.device: auto = cuda when available, else cpu. Fails loudly when a
    CUDA device is asked for and this machine (or this torch build) has none."""
    import torch

    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "cuda" or (spec.startswith("cuda:") and spec[5:].isdigit()):
        if not torch.cuda.is_available():
            raise ConfigError(f"model.device={spec}: CUDA is not available here (torch {torch.__version__}, "
                              "torch.cuda.is_available() is False); use model.device=cpu or auto")
        index = int(spec[5:]) if ":" in spec else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise ConfigError(f"model.device={spec}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        return torch.device("cuda", index)
    raise ConfigError(f"model.device: unknown device {spec!r}; allowed: {DEVICES}")


class RewardSpec(Section):
    name: str = Field(description="a registered reward (or pattern such as sentence_length_N)")
    weight: float = Field(1.0, description="its weight in the training reward (sum of weight * part)")
    params: dict[str, Any] = Field(default_factory=dict,
        description="keyword params of the reward's factory, checked at load")


class DetectorSpec(Section):
    name: str = Field(description="a registered hack detector (given only params: the environment's default one)")
    params: dict[str, Any] = Field(default_factory=dict,
        description="keyword params of the detector's factory, checked at load")


class EnvConfig(Section):
    name: str = Field("happy_stories",
        description="the environment (happy_stories, rewrite, preference, minicode, leetcode)")
    rewards: Optional[list[RewardSpec]] = Field(None,
        description="reward parts; unset = the environment's own (its DEFAULT_REWARDS: happy_count for "
                    "happy_stories); environments with their own rewards define the names they accept")
    detector: Optional[DetectorSpec] = Field(None,
        description="the hack detector that labels completions; unset = the environment's own (its "
                    "DEFAULT_DETECTOR: happy_density for happy_stories; none where the environment flags hacks itself)")
    params: dict[str, Any] = Field(default_factory=dict,
        description="the environment's params (its DEFAULT_PARAMS), checked at load")
    eval_rewards: list[RewardSpec] = Field(default_factory=list,
        description="rewards scored on evaluation completions only, each logged as eval_reward/<name> "
                    "(decomposes a combined training reward; weight unused); environments with registry rewards")

    @model_validator(mode="before")
    @classmethod
    def _env_defaults(cls, data: Any) -> Any:
        """Unset rewards / detector -> the named environment's DEFAULT_REWARDS / DEFAULT_DETECTOR (an unknown
        name is left to check_params); a detector given only params gets the default detector's name."""
        if not isinstance(data, dict):
            return data
        import rhlab.components  # noqa: F401  (registers every built-in environment)
        from rhlab.envs.base import ENVS

        env = ENVS.get(data.get("name", cls.model_fields["name"].default))
        if env is None:
            return data
        data = dict(data)
        if data.get("rewards") is None:
            data["rewards"] = env.DEFAULT_REWARDS
        detector = data.get("detector")
        if detector is None:
            data["detector"] = env.DEFAULT_DETECTOR
        elif isinstance(detector, dict) and "name" not in detector and env.DEFAULT_DETECTOR is not None:
            data["detector"] = {**env.DEFAULT_DETECTOR, **detector}
        return data


class TrainConfig(Section):
    algo: Literal["grpo", "rloo", "reinforce"] = Field("grpo",
        description="how advantages are computed: grpo (group-normalised), rloo (leave-one-out), reinforce (moving-"
                    "average baseline)")
    kl_in_reward: bool = Field(False, description="fold beta * summed k1 KL into the reward instead of the loss")
    baseline_momentum: float = Field(0.9, ge=0, lt=1, description="reinforce's moving-average baseline momentum")
    steps: int = Field(200, gt=0, description="generation batches (training steps)")
    batch_size: int = Field(32, gt=0, description="completions per generation batch")
    num_generations: int = Field(16, ge=1, description="completions per prompt (a group); 1 only for reinforce")
    gradient_accumulation_steps: int = Field(1, gt=0,
        description="micro-batches per generation batch (must divide batch_size)")
    num_iterations: int = Field(1, gt=0, description="optimizer steps per generation batch (TRL's num_iterations, mu)")
    lr: float = Field(1e-4, gt=0, description="AdamW learning rate")
    lr_schedule: Literal["cosine", "linear", "constant"] = Field("cosine",
        description="learning-rate schedule after warmup")
    warmup_steps: int = Field(0, ge=0, description="linear warmup, in optimizer updates")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    adam_betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW (beta1, beta2), each in [0, 1)")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping norm")
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo"] = Field(
        "grpo", description="per-token loss and aggregation, as TRL's loss_type (TRL default dapo): grpo = "
        "per-sequence mean; bnpo = token mean per micro-batch; dr_grpo = / (batch * max_new_tokens); dapo = token "
        "mean over the generation batch; cispo = REINFORCE weighted by the ratio capped at epsilon_high (detached), "
        "dapo's aggregation; sapo = a sigmoid gate instead of the clip, grpo's aggregation (docs/losses.md)")
    epsilon: float = Field(0.2, gt=0, description="lower clip: ratio >= 1 - epsilon")
    epsilon_high: Optional[float] = Field(None, gt=0,
        description="upper clip: ratio <= 1 + epsilon_high; None = epsilon")
    delta: Optional[float] = Field(None, gt=1,
        description="two-sided clip: ratio capped at delta for negative advantages; None = off")
    beta: float = Field(0.02, ge=0, description="weight of the k3 KL to the frozen reference")
    kl_bias_correction: bool = Field(
        False, description="multiply the k3 KL term by the importance ratio pi/pi_old, gradient included (TRL's "
        "use_bias_correction_kl, default True there): the unbiased reverse-KL gradient, beta * (logp - ref) per "
        "token on-policy; off = the k3 term's own gradient, beta * (1 - exp(ref - logp)). Acts when beta > 0 and "
        "kl_in_reward is off")
    sapo_temperature_pos: float = Field(1.0, gt=0, description="sapo only: the gate's temperature tau for "
                                        "tokens with A > 0 (TRL's sapo_temperature_pos, same default)")
    sapo_temperature_neg: float = Field(1.05, gt=0, description="sapo only: tau for tokens with A <= 0 "
                                        "(TRL's sapo_temperature_neg, same default)")
    scale_rewards: Literal["group", "batch", "none"] = Field("group",
        description="advantage scaling: group std, batch std or none")
    mask_truncated_completions: bool = Field(False,
        description="drop completions that hit max_new_tokens from the loss")
    logprob_backend: Literal["auto", "packed", "hf"] = Field("auto",
        description="log-prob passes: packed = padding-free, each distinct prompt once (LLaMA-architecture models);"
                    " hf = transformers forward on the padded batch; auto = packed when it applies")
    gradient_checkpointing: bool = Field(False, description=(
        "recompute each decoder layer's activations in the backward pass instead of keeping them: "
        "less memory for long completions, one more forward per layer; same gradients"))

    @field_validator("adam_betas")
    @classmethod
    def _betas(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in v):
            raise ValueError("each beta must be in [0, 1)")
        return v

    @model_validator(mode="after")
    def _check(self):
        if self.num_generations < 2 and self.algo != "reinforce":
            raise ValueError(f"train.num_generations={self.num_generations}: {self.algo} needs groups of at least 2 "
                             "(only train.algo=reinforce, with its moving-average baseline, allows 1)")
        if self.batch_size % self.num_generations:
            raise ValueError(f"train.num_generations={self.num_generations} must divide "
                             f"train.batch_size={self.batch_size}")
        if self.batch_size % self.gradient_accumulation_steps:
            raise ValueError(f"train.gradient_accumulation_steps={self.gradient_accumulation_steps} "
                             f"must divide train.batch_size={self.batch_size}")
        if self.kl_bias_correction and self.kl_in_reward:
            raise ValueError("train.kl_bias_correction=true corrects the loss's KL term; with train.kl_in_reward=true "
                             "the loss has none (set one of them false)")
        if self.loss_type == "cispo" and self.epsilon_high is None:
            raise ValueError("train.loss_type=cispo caps the ratio at train.epsilon_high itself (not 1 + epsilon): "
                             "set it explicitly (ScaleRL's eps_max, e.g. 5.0)")
        if self.loss_type in ("cispo", "sapo") and self.delta is not None:
            raise ValueError(f"train.delta={self.delta}: two-sided clipping applies to the clipped losses "
                             f"(grpo, bnpo, dr_grpo, dapo), not train.loss_type={self.loss_type}")
        if self.loss_type == "sapo" and self.epsilon_high is not None:
            raise ValueError(f"train.epsilon_high={self.epsilon_high}: train.loss_type=sapo has no clip range "
                             "(its gate is set by train.sapo_temperature_pos / _neg)")
        return self


class InterventionSpec(Section):
    name: str = Field("vanilla", description="the arm's registered intervention (vanilla = none)")
    params: dict[str, Any] = Field(default_factory=dict,
        description="keyword params of the intervention's factory, checked at load")


class LogConfig(Section):
    log_every: int = Field(1, gt=0, description="steps between rows of metrics.jsonl")
    sample_every: int = Field(10, gt=0, description="steps between samples.jsonl entries")
    n_samples: int = Field(4, ge=0, description="completions written to samples.jsonl per sample step")
    eval_every: int = Field(0, ge=0,
        description="steps between held-out evaluations; 0 = only at the start and the end")
    eval_prompts: int = Field(64, gt=0, description="held-out prompts per evaluation")
    save_every: int = Field(50, ge=0, description="steps between checkpoints; 0 = only the final checkpoint")
    keep_checkpoints: int = Field(1, gt=0, description="checkpoints kept on disk")
    progress: bool = Field(True, description="show a progress bar")
    log_kl: bool = Field(True, description="compute KL to the reference for logging even when beta = 0")
    report_to: list[Literal["tensorboard", "wandb", "trackio"]] = Field(default_factory=list,
        description="trackers besides metrics.jsonl")
    suite: Optional[str] = Field(None,
        description="evaluation-suite YAML run after training (rhlab/eval/suites.py); gate table printed")


class SandboxConfig(Section):
    isolation: Literal["bwrap", "process"] = Field(
        "bwrap", description="how model-written code is isolated: bwrap (namespaces, see docs/code_env.md) "
                             "or process (a separate interpreter only; prints a warning on every use)")


class RunConfig(Section):
    seed: int = Field(42, description="seeds prompts, sampling and initialisation")
    arm: str = Field("vanilla", description="the arm's label in run names and reports")
    run_name: Optional[str] = Field(None, description="run directory name; None = derived from the hyperparameters")
    output_dir: str = Field("runs", description="where run directories are created")
    threads: int = Field(0, ge=0, description="torch threads; 0 = all cores")
    model: ModelConfig = Field(default_factory=ModelConfig, description="the policy")
    env: EnvConfig = Field(default_factory=EnvConfig, description="environment, rewards and hack detector")
    sampling: SamplingSpec = Field(default_factory=SamplingSpec, description="generation settings")
    train: TrainConfig = Field(default_factory=TrainConfig, description="the RL algorithm and optimizer")
    log: LogConfig = Field(default_factory=LogConfig, description="logging, evaluation and checkpoints")
    intervention: InterventionSpec = Field(default_factory=InterventionSpec, description="the arm's intervention")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="isolation of model-written code")

    def dump(self) -> dict:
        return self.model_dump(mode="json")


# ---- loading & overrides ---------------------------------------------------------------
def parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key.path=value")
    key, raw = item.split("=", 1)
    try:
        return key.strip().split("."), yaml.safe_load(raw)
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"override {item!r}: the value is not valid YAML ({problem})") from None


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    for item in overrides:
        path, value = parse_override(item)
        node = data
        for p in path[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {p!r} is not a section")
        node[path[-1]] = value
    return data


def load_yaml_file(path: str | Path, what: str = "config file"):
    """The parsed YAML of a file; a missing file or a syntax error is a ConfigError naming the file
    and, for syntax errors, the line and column."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} not found: {path}")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(f"{where}: invalid YAML: {e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from None


def read_yaml(path: str | Path | None, overrides: list[str] = ()) -> dict:
    """A YAML mapping (empty without a path) with key.path=value overrides applied."""
    data: dict = {}
    if path is not None:
        path = Path(path)
        data = load_yaml_file(path) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return apply_overrides(data, list(overrides))


# ---- paths inside a run config -----------------------------------------------------------
# key path -> what must exist at load: "file", "dir", or None (a cache or an output made on use).
# intervention.params.direction may name a file that `rhlab extract-direction` is about to write.
PATH_KEYS: dict[tuple[str, ...], str | None] = {
    ("log", "suite"): "file",
    ("env", "params", "pool_file"): "file",
    ("env", "params", "train_file"): "file",
    ("env", "params", "eval_file"): "file",
    ("env", "params", "rm_dir"): "dir",
    ("intervention", "params", "pair_params", "path"): "file",
    ("intervention", "params", "pair_params", "run_dir"): None,  # made by an earlier run: checked when read
    ("intervention", "params", "direction"): None,
    ("intervention", "params", "svd", "cache_dir"): None,
}
LOCAL_MODEL_PREFIXES = ("./", "../", "/", "~")


def _absolute(value: str, base: Path) -> str:
    return os.path.normpath(base / Path(value).expanduser())


def resolve_paths(data: dict, base: str | Path) -> dict:
    """Make the PATH_KEYS of a config mapping (and model.name when it is a local directory)
    absolute, relative paths taken relative to `base`; in place, returns `data`."""
    base = Path(base).absolute()
    for keys in PATH_KEYS:
        node = data
        for k in keys[:-1]:
            node = node.get(k) if isinstance(node, dict) else None
        if isinstance(node, dict) and isinstance(node.get(keys[-1]), str) and node[keys[-1]]:   # "" = unset
            node[keys[-1]] = _absolute(node[keys[-1]], base)
    model = data.get("model")
    name = model.get("name") if isinstance(model, dict) else None
    if isinstance(name, str) and not name.startswith("builtin:") and (
            name.startswith(LOCAL_MODEL_PREFIXES) or (base / name).exists()):
        model["name"] = _absolute(name, base)
    return data


def check_paths(cfg: "RunConfig", source: str) -> None:
    """Every input path of a loaded config exists: fail at load, not after training."""
    data = cfg.dump()
    for keys, kind in PATH_KEYS.items():
        node = data
        for k in keys:
            node = node.get(k) if isinstance(node, dict) else None
        if kind is None or not node:
            continue
        p = Path(node)
        if not (p.is_file() if kind == "file" else p.is_dir()):
            raise ConfigError(f"{'.'.join(keys)}: {kind} not found: {p} ({source}; a relative path in a config "
                              "file is relative to the file's directory, on the command line to the working "
                              "directory)")
    if cfg.model.name.startswith(LOCAL_MODEL_PREFIXES) and not Path(cfg.model.name).is_dir():
        raise ConfigError(f"model.name: directory not found: {cfg.model.name} ({source})")


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> RunConfig:
    data = read_yaml(path)
    if path is not None:
        resolve_paths(data, Path(path).parent)
    resolve_paths(apply_overrides(data, list(overrides)), Path.cwd())  # what the overrides set
    source = str(path) if path is not None else "defaults"
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"invalid config ({source}): {format_validation_error(e, RunConfig)}") from None
    try:
        check_params(cfg)
    except ValueError as e:
        raise ConfigError(f"invalid config ({source}): {e}") from None
    check_paths(cfg, source)
    return cfg


def check_params(cfg: RunConfig) -> None:
    """The nested params (env, rewards, detector, intervention) against what each registered
    component declares, before any model loads; ValueError naming the key."""
    import rhlab.components  # noqa: F401  (registers every built-in env, reward, detector and intervention)
    from rhlab.envs.base import check_env_params
    from rhlab.interventions.base import INTERVENTIONS, NESTED_CHECKS
    from rhlab.rewards.registry import DETECTORS, REWARDS

    env = check_env_params(cfg.env.name, cfg.env.params)
    if getattr(env, "registry_rewards", False):  # other environments name and check their own rewards
        for i, r in enumerate(cfg.env.rewards):
            REWARDS.check(r.name, r.params, f"env.rewards[{i}]")
    if getattr(env, "registry_detector", False):
        DETECTORS.check(cfg.env.detector.name, cfg.env.detector.params, "env.detector")
    if cfg.env.eval_rewards and not getattr(env, "registry_rewards", False):
        raise ValueError(f"env.eval_rewards: environment {cfg.env.name!r} has no registry rewards to evaluate")
    for i, r in enumerate(cfg.env.eval_rewards):
        REWARDS.check(r.name, r.params, f"env.eval_rewards[{i}]")
    INTERVENTIONS.check(cfg.intervention.name, cfg.intervention.params, "intervention")
    if cfg.intervention.name in NESTED_CHECKS:
        NESTED_CHECKS[cfg.intervention.name](cfg.intervention.params)


# ---- run names -------------------------------------------------------------------------
ABBREV = {"train.lr": "lr", "train.beta": "beta", "model.lora.r": "r", "model.lora.enabled": "lora",
          "train.num_generations": "g", "train.batch_size": "bs", "train.steps": "steps",
          "train.epsilon": "eps", "train.epsilon_high": "epsh", "train.num_iterations": "it",
          "sampling.temperature": "temp", "sampling.max_new_tokens": "len", "train.lr_schedule": "sched",
          "train.scale_rewards": "scale", "train.gradient_accumulation_steps": "ga",
          "train.kl_bias_correction": "klbc"}
# Parts of the config already in the name's head, or that do not change what is trained.
NAME_SKIP = ("seed", "arm", "run_name", "output_dir", "threads", "log.", "env.name", "env.rewards", "env.eval_rewards",
             "env.detector", "train.loss_type", "train.algo", "model.name", "intervention.name", "model.device",
             "sampling.vllm_", "train.gradient_checkpointing")


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and all(isinstance(x, str) for x in v):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float) and v != 0 and abs(v) < 1e-2:
        mantissa, exp = f"{v:.6e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e{int(exp)}"  # 3e-4, not 0.0003
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return "-".join(map(_fmt, v))
    return str(v)


def run_name(cfg: RunConfig, always: tuple[str, ...] = ()) -> str:
    """e.g. happy_stories_happy_count_grpo_vanilla_lr2e-4_s42: non-default hyperparameters + seed.
    Keys in `always` (a sweep's grid axes) appear even at their default value."""
    if cfg.run_name:
        return cfg.run_name
    base = RunConfig(env=EnvConfig(name=cfg.env.name, rewards=cfg.env.rewards)).dump()
    cur, ref = _flatten(cfg.dump()), _flatten(base)
    algo = cfg.train.loss_type if cfg.train.algo == "grpo" else cfg.train.algo
    parts = [cfg.env.name, "+".join(r.name for r in cfg.env.rewards), algo, cfg.arm]
    if not cfg.model.name.startswith("builtin:"):
        parts.insert(0, Path(cfg.model.name).name)
    paths = {".".join(k) for k in PATH_KEYS}
    for key in sorted(cur):
        if key in always or (cur[key] != ref.get(key) and not key.startswith(NAME_SKIP)):
            value = cur[key]
            local_model = key == "model.name" and not str(value).startswith("builtin:")  # a grid axis
            if isinstance(value, str) and (key in paths or local_model):
                value = Path(value).name  # a path: its last part, so the name does not depend on the checkout
            parts.append(ABBREV.get(key, key.split(".")[-1]) + _fmt(value))
    name = "_".join(parts).replace("/", "-").replace(" ", "")
    if len(name) > 150:  # keep names usable as directory names; the hash keeps them unique
        name = name[:140] + "_" + hashlib.sha1(name.encode()).hexdigest()[:8]
    return f"{name}_s{cfg.seed}"
