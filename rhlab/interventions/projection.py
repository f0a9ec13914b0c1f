"""Rank-space gradient projection against a hack direction (docs/projection.md).

Every step, every SVD module, between backward and the optimizer step:
    cos = g . v / |g|;  if cos > 0:  g <- g - cos |g| v,  then rescale to the original |g|
(the max(0, cos) is directional correctness, not gating: projecting when cos < 0 would *add*
hack component). `rescale: false` is the no-magnitude-preservation ablation; `project: false`
only measures (the vanilla SVD arm: what the projection *would* do). `two_sided: true` removes the
component of either sign: the one-sided rule keeps every negative component, so the gradients that
reach the optimizer lean against v_hack on average, and momentum accumulates that lean into a steady
drift along -v_hack.

`span_modes: [A, B, ...]` is the multi-direction arm: one direction per listed mode (each extracted
from that mode's pairs alone), orthonormalised per module into a basis Q [r, k], and the gradient's
whole component in their span removed, g <- g - Q Q^T g (both signs: a sign of a combination of
directions means nothing), then rescaled. Its "cos" is |Q Q^T g| / |g| (the share of the gradient
in the span), "fired" when that exceeds 1e-6.

Diagnostics per step (metrics.jsonl): proj/mean_cos, proj/std_cos (over modules), proj/grad_norm
(mean |g| over modules, before projection), proj/frac_fired (fraction of modules with cos > 0), and
each module's own cos as proj/cos/<module> (short_name: "L0.q_proj", "lm_head"), so a trajectory shows
which modules engage, and proj/update_cos: the same cos for the optimizer's actual step (its negative,
so the sign matches the gradient's), averaged over modules. Projection makes the gradient orthogonal
to v_hack, not the update: AdamW's per-coordinate scaling turns a gradient orthogonal to a direction
that is not a coordinate axis into a step that is not.
Their mean over the last `window` steps goes into every evaluation as proj/<name>, so into
summary.json "final" and the report's table.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import torch

from rhlab.adapters.svd import default_cache_dir, svd_modules, wrap_svd
from rhlab.interventions.direction import (
    check_gate,
    default_direction_path,
    direction_settings,
    ensure_direction,
)
from rhlab.interventions.base import INTERVENTIONS, Intervention

SVD_KEYS = {"enabled", "targets", "rank", "cache_dir", "rotation", "max_angle"}
DIAGNOSTICS = ("mean_cos", "std_cos", "grad_norm", "frac_fired")


def short_name(module: str) -> str:
    """'model.layers.3.self_attn.q_proj' -> 'L3.q_proj'; a module outside the layers keeps its last name."""
    m = re.search(r"layers\.(\d+)\..*?(\w+)$", module)
    return f"L{m[1]}.{m[2]}" if m else module.rsplit(".", 1)[-1]


def project(g: torch.Tensor, v: torch.Tensor, rescale: bool = True,
            two_sided: bool = False) -> tuple[torch.Tensor, float, bool]:
    """(new g, cos, fired) for one module: remove the positive component along unit v (two_sided: the
    component of either sign)."""
    assert g.dim() == 1 and g.shape == v.shape, f"g {tuple(g.shape)} and v {tuple(v.shape)} must be equal vectors"
    assert abs(float(v.norm()) - 1) < 1e-4, f"v must be unit, |v| = {float(v.norm()):.6f}"
    norm = g.norm()
    if norm < 1e-12:
        return g, 0.0, False
    cos = g @ v / norm
    if cos == 0 or (cos < 0 and not two_sided):
        return g, float(cos), False
    out = g - cos * norm * v
    if rescale:
        rest = out.norm()
        # g (almost) parallel to v: nothing left to rescale; blowing float noise up to |g| would be wrong
        out = out * (norm / rest) if rest > 1e-6 * norm else torch.zeros_like(g)
    return out, float(cos), True


def project_span(g: torch.Tensor, Q: torch.Tensor, rescale: bool = True) -> tuple[torch.Tensor, float, bool]:
    """(new g, |Q Q^T g| / |g|, fired) for one module: remove g's component in the span of Q's orthonormal
    columns [r, k]."""
    assert g.dim() == 1 and Q.dim() == 2 and Q.shape[0] == g.shape[0], f"g {tuple(g.shape)}, Q {tuple(Q.shape)}"
    norm = g.norm()
    if norm < 1e-12:
        return g, 0.0, False
    inside = Q @ (Q.T @ g)
    share = float(inside.norm() / norm)
    if share <= 1e-6:
        return g, share, False
    out = g - inside
    if rescale:
        rest = out.norm()
        out = out * (norm / rest) if rest > 1e-6 * norm else torch.zeros_like(g)
    return out, share, True


def orthonormal_basis(vs: list[torch.Tensor]) -> torch.Tensor:
    """[r, k] orthonormal columns spanning the k directions (QR); fails on (near-)dependent directions."""
    V = torch.stack([v.float() for v in vs], 1)
    Q, R = torch.linalg.qr(V)
    diag = R.diagonal().abs()
    assert bool((diag > 1e-4).all()), f"directions are linearly dependent (|R_ii| = {diag.tolist()})"
    return Q


class SVDArm(Intervention):
    """Base of every arm in the projection experiment: the model trains only delta_S of SVD adapters.
    svd: {enabled (true), targets (all attn + MLP linears), rank (null = full), cache_dir, rotation (0 = off,
    else the block size of a trainable Cayley rotation of each input basis), max_angle (0.5 rad)}."""
    name = "svd"

    def __init__(self, svd: dict | None = None):
        svd = dict(svd or {})
        unknown = set(svd) - SVD_KEYS
        if unknown:
            raise ValueError(f"intervention.params.svd: unknown keys {sorted(unknown)}; allowed: {sorted(SVD_KEYS)}")
        self.svd = {"enabled": True, "targets": None, "rank": None, "cache_dir": None, "rotation": 0,
                    "max_angle": 0.5, **svd}
        self.svd_info: dict = {}

    def cache_dir(self) -> Path:
        return Path(self.svd["cache_dir"]).expanduser() if self.svd["cache_dir"] else default_cache_dir()

    def prepare_model(self, trainer, model):
        if not self.svd["enabled"]:
            return model
        if trainer.cfg.model.lora.enabled:
            raise ValueError("the SVD adapter replaces LoRA: set model.lora.enabled=false (or svd.enabled=false)")
        self.svd_info = wrap_svd(model, trainer.cfg.model.name, self.svd["targets"], self.svd["rank"],
                                 self.cache_dir(), self.svd["rotation"], self.svd["max_angle"])
        return model


class Projection(SVDArm):
    name = "svd_projection"

    def __init__(self, project: bool = True, rescale: bool = True, two_sided: bool = False,
                 pairs: str = "happy_stories", pair_params: dict | None = None, modes: list[str] | None = None,
                 heldout_frac: float = 0.25, direction_seed: int = 0, direction: str | None = None,
                 extract_if_missing: bool = True, allow_failed_validation: bool = False, window: int = 25,
                 svd: dict | None = None, span_modes: list[str] | None = None):
        super().__init__(svd)
        if not self.svd["enabled"]:
            raise ValueError("intervention.params.svd.enabled: svd_projection needs the SVD adapter (true)")
        if span_modes is not None and (modes is not None or direction or len(span_modes) < 2):
            raise ValueError("intervention.params.span_modes needs >= 2 modes and excludes modes and direction "
                             f"(got span_modes={span_modes}, modes={modes}, direction={direction})")
        self.span_modes = span_modes
        self.basis: dict[str, torch.Tensor] = {}
        if window <= 0:
            raise ValueError(f"intervention.params.window must be > 0, got {window}")
        if two_sided and span_modes is not None:
            raise ValueError("intervention.params.two_sided: the span projection removes both signs already")
        self.project_on, self.rescale, self.two_sided, self.window = project, rescale, two_sided, window
        self.pairs, self.pair_params, self.modes = pairs, dict(pair_params or {}), modes
        self.heldout_frac, self.direction_seed = heldout_frac, direction_seed
        self.direction, self.extract_if_missing = direction, extract_if_missing
        self.allow_failed = allow_failed_validation
        self.v: dict[str, torch.Tensor] = {}
        self.meta: dict = {}
        self._calls: list[dict] = []  # on_gradients calls since the last metrics()
        self._before: dict[str, torch.Tensor] = {}  # delta_S before the pending optimizer step
        self._updates: list[float] = []  # each optimizer step's update cos since the last metrics()
        self.history: list[dict] = []  # one row per step

    def direction_path(self, settings: dict) -> Path:
        return Path(self.direction) if self.direction else default_direction_path(self.cache_dir(), settings)

    def load_direction(self, model, tok, cfg, create: bool, modes: list[str] | None = None) -> Path:
        """Load (or extract, if missing and create) v_hack for the wrapped model; returns its path."""
        assert self.svd_info, "prepare_model must run first"
        settings = direction_settings(Path(self.svd_info["cache_dir"]).name, self.pairs, self.pair_params,
                                      modes or self.modes, self.heldout_frac, self.direction_seed, cfg.model.dtype,
                                      self.svd["rank"])
        path = self.direction_path(settings)
        self.v, self.meta = ensure_direction(model, tok, settings, path, create=create)
        return path

    def load_span(self, model, tok, cfg, create: bool) -> Path:
        """The multi-direction arm: one validated direction per span mode, then an orthonormal basis per module."""
        per_mode = []
        for mode in self.span_modes:
            path = self.load_direction(model, tok, cfg, create, modes=[mode])
            check_gate(self.meta, self.allow_failed)
            per_mode.append(self.v)
        self.basis = {n: orthonormal_basis([v[n] for v in per_mode]) for n in per_mode[0]}
        return path

    def setup(self, trainer) -> None:
        # an explicit `direction` file must exist (crash loud); the cached default is extracted on demand
        load = self.load_span if self.span_modes else self.load_direction
        path = load(trainer.model, trainer.tok, trainer.cfg, create=self.extract_if_missing and not self.direction)
        check_gate(self.meta, self.allow_failed)
        dev = next(trainer.model.parameters()).device
        self.v = {n: t.float().to(dev) for n, t in self.v.items()}
        self.basis = {n: q.to(dev) for n, q in self.basis.items()}
        self.modules = svd_modules(trainer.model)
        self._copy_validation(path, trainer.dir / "v_hack")

    @staticmethod
    def _copy_validation(path: Path, dest: Path) -> None:
        """Keep the validation plot and numbers next to the run that used the direction."""
        dest.mkdir(parents=True, exist_ok=True)
        stem = str(path).removesuffix(".safetensors")
        for suffix in (".hist.png", ".validation.json"):
            if Path(stem + suffix).exists():
                shutil.copyfile(stem + suffix, dest / f"v_hack{suffix}")
        (dest / "path.txt").write_text(str(path) + "\n")

    def _close_update(self) -> None:
        """Record the last optimizer step's update against v_hack: cos(-(delta_S now - at on_gradients), v)
        averaged over modules (for a span: the update's share inside it), on the gradient's scale (positive =
        the step moves as a hack-ward gradient would). The projection acts on the gradient; an optimizer
        that rescales coordinates (Adam) can put part of the update back along v_hack."""
        if not self._before:
            return
        coss = []
        for name, before in self._before.items():
            step = before - self.modules[name].delta_S.detach().float()  # -(update)
            if step.norm() > 1e-12:  # a module the step did not move has no direction
                coss.append((project_span(step, self.basis[name], False) if self.basis
                             else project(step, self.v[name], False))[1])
        if coss:
            self._updates.append(sum(coss) / len(coss))
        self._before = {}

    def on_gradients(self, trainer) -> None:
        self._close_update()  # a step with several optimizer steps (num_iterations > 1)
        self._before = {n: m.delta_S.detach().float().clone() for n, m in self.modules.items()}
        coss, norms, fired, per_module = [], [], 0, {}
        for name, m in self.modules.items():
            g = m.delta_S.grad
            if g is None:
                continue
            new, cos, hit = (project_span(g.float(), self.basis[name], self.rescale) if self.basis
                             else project(g.float(), self.v[name], self.rescale, self.two_sided))
            coss.append(cos)
            per_module[short_name(name)] = cos
            norms.append(float(g.norm()))
            fired += hit
            if self.project_on and hit:
                g.copy_(new.to(g.dtype))
        assert coss, "no SVD module received a gradient"
        c = torch.tensor(coss)
        self._calls.append({"mean_cos": float(c.mean()), "std_cos": float(c.std()) if len(coss) > 1 else 0.0,
                            "grad_norm": sum(norms) / len(norms), "frac_fired": fired / len(coss),
                            "modules": per_module})

    def metrics(self) -> dict[str, float]:
        self._close_update()  # called after the step's last optimizer step
        if not self._calls:
            return {}
        n = len(self._calls)
        row = {k: sum(c[k] for c in self._calls) / n for k in DIAGNOSTICS}
        seen = [(m, c) for call in self._calls for m, c in call["modules"].items()]
        cos = {m: sum(c for k, c in seen if k == m) / sum(k == m for k, _ in seen) for m in dict(seen)}
        update = {"proj/update_cos": sum(self._updates) / len(self._updates)} if self._updates else {}
        self._calls, self._updates = [], []
        self.history.append(row)
        return {**{f"proj/{k}": v for k, v in row.items()}, **update, **{f"proj/cos/{m}": v for m, v in cos.items()}}

    def state_dict(self) -> dict:
        """The per-step diagnostics, so a resumed run's window means cover the steps before the resume."""
        return {"history": self.history}

    def load_state_dict(self, state: dict) -> None:
        if "history" not in state:
            raise ValueError(f"intervention {self.name}: checkpoint lacks its diagnostics history; "
                             f"state keys: {sorted(state)}")
        self.history = [dict(row) for row in state["history"]]

    def extra_evals(self, trainer) -> dict[str, dict]:
        """The diagnostics' mean over the last `window` steps (none before the first step)."""
        recent = self.history[-self.window:]
        if not recent:
            return {}
        return {"proj": {k: sum(r[k] for r in recent) / len(recent) for k in DIAGNOSTICS}}


def extract_for_config(cfg, out: str | Path | None = None) -> tuple[Path, dict]:
    """`rhlab extract-direction`: extract (or load) and validate v_hack for a config's svd_projection
    arm, without training. Returns (path, metadata)."""
    from types import SimpleNamespace

    from rhlab.models.loading import DTYPES, load_model

    if cfg.intervention.name != "svd_projection":
        raise ValueError(f"intervention.name is {cfg.intervention.name!r}; extract-direction needs svd_projection")
    arm = INTERVENTIONS.build(cfg.intervention.name, cfg.intervention.params)
    if out is not None:
        arm.direction = str(out)
    torch.set_num_threads(cfg.threads or torch.get_num_threads())
    model, tok = load_model(cfg.model.name, DTYPES[cfg.model.dtype])
    model = arm.prepare_model(SimpleNamespace(cfg=cfg), model)
    path = arm.load_direction(model, tok, cfg, create=True)
    return path, arm.meta


# classes as factories: the registry checks YAML params against __init__'s signature
INTERVENTIONS.register("svd")(SVDArm)
INTERVENTIONS.register("svd_projection")(Projection)
