"""AntiPaSTO-style SVD adapter: train only a per-rank scale delta_S in the frozen SVD basis of W.

    W = U diag(S) Vh                     (frozen buffers, computed once per model, cached on disk)
    y = ((x Vh^T) * (S + delta_S)) U^T + b    [+ x W_res^T at reduced rank r]

The rank axis stays pinned to the SVD basis of the original weight, so a direction in delta_S
space (v_hack, see rhlab/interventions/direction.py) means the same thing at every training step.
At delta_S = 0 the wrapped model equals the original (to float precision; tested).

Optional block-Cayley rotation of the input basis (AntiPaSTO's `rot_T`, `rotation=bs`): a trainable
rot_T [r / bs, bs (bs - 1) / 2] fills a skew-symmetric A per block of bs rank directions, bounded by
max_angle (A <- a tanh(A / a), a = 2 tan(max_angle / 2)); R = (I - A/2)^-1 (I + A/2) is orthogonal and Vh
becomes R Vh. rot_T = 0 gives R = I. The rotation moves the rank axes, so a v_hack extracted at step 0
describes the rotated adapter less well the further R turns (the reason it is off by default).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from rhlab.adapters import ALL_LINEAR
from rhlab.utils import user_mode


def default_cache_dir() -> Path:
    """$RHLAB_CACHE/svd, else ~/.cache/rhlab/svd."""
    root = os.environ.get("RHLAB_CACHE") or Path.home() / ".cache" / "rhlab"
    return Path(root) / "svd"


class SVDLinear(nn.Module):
    """Replacement for an nn.Linear; only delta_S [r] is trainable."""

    def __init__(self, U: torch.Tensor, S: torch.Tensor, Vh: torch.Tensor, bias: torch.Tensor | None,
                 W_res: torch.Tensor | None = None, rotation: int = 0, max_angle: float = 0.5):
        super().__init__()
        r = S.shape[0]
        assert U.shape[1] == r and Vh.shape[0] == r, f"SVD shapes disagree: U {U.shape}, S {S.shape}, Vh {Vh.shape}"
        self.in_features, self.out_features, self.rank = Vh.shape[1], U.shape[0], r
        # non-persistent: checkpoints hold only delta_S; the basis is rebuilt (from the cache) on load
        self.register_buffer("U", U, persistent=False)
        self.register_buffer("S", S.float(), persistent=False)
        self.register_buffer("Vh", Vh, persistent=False)
        self.register_buffer("W_res", W_res, persistent=False)
        self.register_buffer("bias", bias, persistent=False)
        # float32 even under bf16 so small Adam updates are not rounded away
        self.delta_S = nn.Parameter(torch.zeros(r, dtype=torch.float32, device=S.device))
        self.rot_T = None
        if rotation:
            assert rotation >= 2 and r % rotation == 0, f"rotation block size {rotation} must be >= 2 and divide rank {r}"
            assert 0 < max_angle < math.pi, f"max_angle must be in (0, pi), got {max_angle}"
            self.block, self.max_angle = rotation, max_angle
            self.rot_T = nn.Parameter(torch.zeros(r // rotation, rotation * (rotation - 1) // 2, dtype=torch.float32,
                                                  device=S.device))

    def rotation(self) -> torch.Tensor:
        """R's blocks [r / bs, bs, bs] (orthogonal; identity at rot_T = 0)."""
        n, bs = self.rot_T.shape[0], self.block
        rows, cols = torch.triu_indices(bs, bs, offset=1, device=self.rot_T.device)
        A = self.rot_T.new_zeros(n, bs, bs)
        A[:, rows, cols] = self.rot_T
        A = 0.5 * (A - A.transpose(-1, -2))
        limit = 2.0 * math.tan(self.max_angle / 2.0)
        A = limit * torch.tanh(A / limit)
        eye = torch.eye(bs, dtype=A.dtype, device=A.device).expand_as(A)
        return torch.linalg.solve(eye - A / 2, eye + A / 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x @ self.Vh.T
        if self.rot_T is not None:  # x (R Vh)^T = h R^T, block by block
            R = self.rotation().to(x.dtype)
            h = torch.einsum("...bj,bij->...bi", h.unflatten(-1, (R.shape[0], self.block)), R).flatten(-2)
        h = h * (self.S + self.delta_S).to(x.dtype)
        y = h @ self.U.T
        if self.W_res is not None:
            y = y + x @ self.W_res.T
        if self.bias is not None:
            y = y + self.bias
        return y

    def extra_repr(self) -> str:
        rot = f", rotation={self.block}" if self.rot_T is not None else ""
        return f"in={self.in_features}, out={self.out_features}, rank={self.rank}, residual={self.W_res is not None}{rot}"


def target_linears(model: nn.Module, targets: list[str]) -> dict[str, nn.Linear]:
    """{module path: nn.Linear} whose last name component is in targets (the output head only when
    "lm_head" is listed: wrapping it unties it from the input embedding, which stays frozen)."""
    found = {n: m for n, m in model.named_modules()
             if isinstance(m, nn.Linear) and n.split(".")[-1] in targets}
    present = {n.split(".")[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    missing = set(targets) - present
    if missing:
        raise ValueError(f"svd adapter targets {sorted(missing)} not in the model; linear modules: {sorted(present)}")
    assert found, f"no target linear modules among {targets}"
    return found


def fingerprint(linears: dict[str, nn.Linear]) -> str:
    """Hash of the target weights' bytes: the cache key, so a retrained model never reuses stale SVDs."""
    h = hashlib.sha1()
    for name in sorted(linears):
        w = linears[name].weight.detach().contiguous().cpu()
        h.update(f"{name}:{tuple(w.shape)}:{w.dtype}".encode())
        h.update(w.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def model_cache_dir(model_name: str, linears: dict[str, nn.Linear], cache_dir: str | Path | None = None) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", model_name).strip("-") or "model"
    return Path(cache_dir or default_cache_dir()) / f"{slug}-{fingerprint(linears)}"


def svd_cached(weight: torch.Tensor, path: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """(U, S, Vh, cache_hit) of weight in float32 (full_matrices=False); computed once and saved to path."""
    if path.exists():
        t = load_file(str(path))
        U, S, Vh = t["U"], t["S"], t["Vh"]
        assert U.shape[0] == weight.shape[0] and Vh.shape[1] == weight.shape[1], \
            f"cached SVD {path} has shapes {U.shape}/{Vh.shape} for a weight of shape {tuple(weight.shape)}"
        return U, S, Vh, True
    U, S, Vh = torch.linalg.svd(weight.detach().float(), full_matrices=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # parallel sweep workers: rename is atomic
    save_file({"U": U.contiguous().cpu(), "S": S.contiguous().cpu(), "Vh": Vh.contiguous().cpu()}, str(tmp))
    user_mode(tmp)
    os.replace(tmp, path)
    return U, S, Vh, False


def svd_linear_from(lin: nn.Linear, U, S, Vh, rank: int | None = None, rotation: int = 0,
                    max_angle: float = 0.5) -> SVDLinear:
    """Wrap lin with the top `rank` singular directions (None = full); the rest goes to W_res."""
    W = lin.weight.detach()
    r_full = S.shape[0]
    r = r_full if rank is None else min(rank, r_full)
    assert r > 0, f"rank must be positive, got {rank}"
    dev, dt = W.device, W.dtype
    U_r, S_r, Vh_r = U[:, :r].to(dev), S[:r].to(dev), Vh[:r].to(dev)
    W_res = None
    if r < r_full:  # reduced rank: keep the discarded part exactly, frozen
        W_res = (W.float() - (U_r * S_r) @ Vh_r).to(dt)
    bias = None if lin.bias is None else lin.bias.detach().clone()
    return SVDLinear(U_r.to(dt).contiguous(), S_r, Vh_r.to(dt).contiguous(), bias, W_res, rotation, max_angle)


def wrap_svd(model: nn.Module, model_name: str, targets: list[str] | None = None, rank: int | None = None,
             cache_dir: str | Path | None = None, rotation: int = 0, max_angle: float = 0.5) -> dict:
    """Freeze the model and replace each target nn.Linear with an SVDLinear (with a block-Cayley rotation of
    block size `rotation` when > 0), in place.
    Returns {"modules": [paths], "cache_dir": str, "cache_hits": int}."""
    targets = list(targets or ALL_LINEAR)
    linears = target_linears(model, targets)
    root = model_cache_dir(model_name, linears, cache_dir)
    model.requires_grad_(False)
    hits = 0
    for name, lin in linears.items():
        U, S, Vh, hit = svd_cached(lin.weight, root / f"{name}.safetensors")
        hits += hit
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, svd_linear_from(lin, U, S, Vh, rank, rotation, max_angle))
    return {"modules": sorted(linears), "cache_dir": str(root), "cache_hits": hits}


def svd_modules(model: nn.Module) -> dict[str, SVDLinear]:
    """{module path: SVDLinear} in model order."""
    return {n: m for n, m in model.named_modules() if isinstance(m, SVDLinear)}
