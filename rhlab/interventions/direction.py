"""Hack directions from contrastive pairs.

Gradient side (the projection arm, docs/projection.md): for each completion, mean NLL
over its own tokens, backward, read every SVD module's delta_S.grad [r];
    v_hack[module] = unit(mean hack grad - mean clean grad).
This lives in the same rank space as the training gradient it is compared against.

Validation: on held-out pairs, per module cos(held-out diff, v_hack); the gate needs cos > 0 in
at least half of the modules (training refuses to start otherwise, unless overridden).

Activation side (the Rebound-style advantage penalty): v_concept = unit(mean h_hack - mean
h_clean), h the mean residual-stream activation over completion tokens at one depth.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from rhlab.adapters.svd import svd_modules
from rhlab.models.loading import encode_prompts
from rhlab.interventions.pairs import Pair, load_pairs, split_pairs
from rhlab.utils import atomic_write_text, user_mode

GATE_FRAC = 0.5  # the minimum fraction of modules with held-out cos > 0 (the preregistered validation gate)


class DirectionError(RuntimeError):
    pass


# ---- encoding ----------------------------------------------------------------------------
def encode_pair_text(tok, prompt: str, completion: str) -> tuple[torch.Tensor, int]:
    """ids [1, L] = prompt tokens + completion tokens + EOS (as a finished rollout), and P = len(prompt).
    Encoded separately, like a rollout (the policy continues the prompt's tokens)."""
    p = encode_prompts(tok, [prompt])[0]
    c = tok(" " + completion.strip(), add_special_tokens=False)["input_ids"]
    assert c, f"completion {completion!r} encodes to zero tokens"
    return torch.tensor([p + c + [tok.eos_token_id]]), len(p)


def completion_nll(model, ids: torch.Tensor, P: int) -> torch.Tensor:
    """Mean NLL over the completion tokens (length-normalised: long clean completions do not dominate)."""
    dev = next(model.parameters()).device
    ids = ids.to(dev)
    logits = model(input_ids=ids).logits[:, P - 1:-1].float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, P:].reshape(-1))


# ---- gradient side -----------------------------------------------------------------------
def completion_grads(model, tok, items: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    """{module: [N, r]}: delta_S.grad of each (prompt, completion)'s mean NLL, one backward each."""
    mods = svd_modules(model)
    assert mods, "no SVD modules in the model: wrap it with rhlab.adapters.svd.wrap_svd first"
    was_training = model.training
    model.eval()
    out = {n: [] for n in mods}
    for prompt, completion in items:
        for m in mods.values():
            m.delta_S.grad = None
        ids, P = encode_pair_text(tok, prompt, completion)
        completion_nll(model, ids, P).backward()
        for n, m in mods.items():
            assert m.delta_S.grad is not None, f"{n}: no gradient reached delta_S"
            out[n].append(m.delta_S.grad.detach().float().cpu().clone())
    for p in model.parameters():
        p.grad = None  # leave nothing behind for the optimizer (delta_S, and rot_T when the adapter rotates)
    model.train(was_training)
    return {n: torch.stack(g) for n, g in out.items()}


def pair_grads(model, tok, pairs: list[Pair]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(hack grads, clean grads), each {module: [N, r]} in pair order."""
    hack = completion_grads(model, tok, [(p.prompt, p.hack) for p in pairs])
    clean = completion_grads(model, tok, [(p.prompt, p.clean) for p in pairs])
    return hack, clean


def unit(x: torch.Tensor, what: str) -> torch.Tensor:
    n = x.norm()
    if not torch.isfinite(n) or n < 1e-12:
        raise DirectionError(f"{what}: mean difference has norm {float(n):.3g}; cannot normalise")
    return x / n


def mean_diff_directions(hack: dict[str, torch.Tensor], clean: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: unit(hack[n].mean(0) - clean[n].mean(0), n) for n in hack}


def cosines(v: dict[str, torch.Tensor], hack: dict[str, torch.Tensor], clean: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per module cos(mean hack - mean clean of these grads, v)."""
    out = {}
    for n, d in v.items():
        diff = hack[n].mean(0) - clean[n].mean(0)
        out[n] = float(diff @ d / (diff.norm() + 1e-12))
    return out


def summarize(cos: dict[str, float]) -> dict[str, float]:
    c = torch.tensor(list(cos.values()))
    return {"median_cos": float(c.median()), "mean_cos": float(c.mean()), "frac_pos": float((c > 0).float().mean()),
            "n_modules": len(cos)}


def extract(model, tok, pairs: list[Pair], modes: list[str] | None, heldout_frac: float = 0.25,
            seed: int = 0) -> tuple[dict[str, torch.Tensor], dict]:
    """v_hack from the train pairs of `modes` (None = all); validation on held-out pairs of the same
    modes (the gate) and, per mode, on the held-out pairs of every mode (transfer)."""
    train, held = split_pairs(pairs, heldout_frac, seed)
    use = set(modes) if modes is not None else {p.mode for p in pairs}
    idx = lambda ps, keep: [i for i, p in enumerate(ps) if p.mode in keep]
    tr_h, tr_c = pair_grads(model, tok, train)
    he_h, he_c = pair_grads(model, tok, held)
    sub = lambda g, ix: {n: t[ix] for n, t in g.items()}
    tr_ix = idx(train, use)
    assert tr_ix, f"no training pairs for modes {sorted(use)}"
    v = mean_diff_directions(sub(tr_h, tr_ix), sub(tr_c, tr_ix))
    held_ix = idx(held, use)
    gate_cos = cosines(v, sub(he_h, held_ix), sub(he_c, held_ix))
    per_mode = {}
    for mode in sorted({p.mode for p in pairs}):
        ix = idx(held, {mode})
        per_mode[mode] = summarize(cosines(v, sub(he_h, ix), sub(he_c, ix)))
    val = {**summarize(gate_cos), "per_module": gate_cos, "per_mode": per_mode,
           "n_train_pairs": len(tr_ix), "n_heldout_pairs": len(held_ix)}
    return v, val


# ---- artifact ----------------------------------------------------------------------------
def save_direction(path: str | Path, v: dict[str, torch.Tensor], meta: dict) -> None:
    """safetensors, one tensor per module, metadata as JSON strings; written atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_file({n: t.contiguous() for n, t in v.items()}, str(tmp),
              metadata={k: json.dumps(x) for k, x in meta.items()})
    user_mode(tmp)
    os.replace(tmp, path)


def load_direction(path: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    path = Path(path)
    if not path.exists():
        raise DirectionError(f"v_hack file not found: {path}; create it with `rhlab extract-direction CONFIG`")
    with safe_open(str(path), "pt") as f:
        meta = {k: json.loads(x) for k, x in (f.metadata() or {}).items()}
        v = {n: f.get_tensor(n) for n in f.keys()}  # noqa: SIM118  (safe_open is not iterable)
    return v, meta


def plot_histogram(cos: dict[str, float], path: str | Path, title: str) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.hist(list(cos.values()), bins=20, range=(-1, 1), color="tab:blue", alpha=0.8)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_xlabel("held-out cos(diff, v_hack) per module")
    ax.set_ylabel("modules")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def check_gate(meta: dict, allow_failed: bool = False) -> None:
    """Refuse to train on a direction that does not generalise to held-out pairs."""
    frac = meta["validation"]["frac_pos"]
    if frac < GATE_FRAC and not allow_failed:
        raise DirectionError(
            f"v_hack failed held-out validation: cos > 0 in {frac:.0%} of modules (need >= {GATE_FRAC:.0%}); "
            f"median cos {meta['validation']['median_cos']:.3f}. Extraction is broken (check pairs, "
            f"tokenisation, modules); to train anyway set intervention.params.allow_failed_validation=true")


def source_digest(pair_params: dict) -> str | None:
    """sha1 of the file a pair set reads (a jsonl `path`, a run's samples.jsonl under `run_dir`), so a
    changed source gets a new cached direction instead of a stale one."""
    files = [Path(pair_params["path"])] if "path" in pair_params else []
    files += [Path(pair_params["run_dir"]) / "samples.jsonl"] if "run_dir" in pair_params else []
    if not files or not all(f.exists() for f in files):
        return None  # nothing to read (built-in pair sets), or missing: the pair set itself fails loudly
    return hashlib.sha1(b"".join(f.read_bytes() for f in files)).hexdigest()[:12]


def direction_settings(model_key: str, pair_set: str, pair_params: dict, modes: list[str] | None,
                       heldout_frac: float, seed: int, dtype: str, rank: int | None = None) -> dict:
    """The settings a direction is extracted under; its cache key. Keys that only some settings need (a pair
    file's digest, a reduced SVD rank, whose direction has that many entries) appear only then, so the
    full-rank built-in keys stay as they are."""
    digest = source_digest(pair_params)
    return {"model": model_key, "dtype": dtype, "pair_set": pair_set, "pair_params": pair_params,
            **({"source_sha1": digest} if digest else {}), **({"rank": rank} if rank is not None else {}),
            "modes": sorted(modes) if modes is not None else None, "heldout_frac": heldout_frac, "seed": seed}


def default_direction_path(cache_dir: str | Path, settings: dict) -> Path:
    """The cached artifact for these exact settings (same settings -> same file)."""
    key = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    return Path(cache_dir) / "directions" / f"v_hack-{key}.safetensors"


def ensure_direction(model, tok, settings: dict, path: str | Path, create: bool = True,
                     log=print) -> tuple[dict[str, torch.Tensor], dict]:
    """Load v_hack from path (checking it matches these settings and the model's SVD modules), or
    extract it there if missing and create is set. Writes <path>.hist.png and .validation.json."""
    path = Path(path)
    if path.exists():
        v, meta = load_direction(path)
        for k in ("model", "pair_set", "modes", "dtype"):
            if meta.get(k) != settings[k]:
                raise DirectionError(f"{path}: {k} is {meta.get(k)!r}, this run needs {settings[k]!r}")
    elif not create:
        raise DirectionError(f"v_hack file not found: {path}; create it with `rhlab extract-direction CONFIG`")
    else:
        pairs = load_pairs(settings["pair_set"], settings["pair_params"])
        v, val = extract(model, tok, pairs, settings["modes"], settings["heldout_frac"], settings["seed"])
        meta = {**settings, "validation": {k: x for k, x in val.items() if k != "per_module"},
                "n_pairs_total": len(pairs)}
        # plot and numbers first: a parallel run that sees the .safetensors also finds them
        stem = str(path).removesuffix(".safetensors")
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(stem + ".validation.json", json.dumps({**meta, "per_module": val["per_module"]}, indent=2))
        plot_histogram(val["per_module"], stem + ".hist.png",
                       f"{settings['pair_set']} modes={settings['modes'] or 'all'}: median {val['median_cos']:.2f}, "
                       f"{val['frac_pos']:.0%} > 0")
        save_direction(path, v, meta)
        log(f"v_hack extracted -> {path} (held-out: median cos {val['median_cos']:.3f}, "
            f"{val['frac_pos']:.0%} of modules > 0)")
    mods = svd_modules(model)
    if set(v) != set(mods):
        raise DirectionError(f"{path}: modules differ from the model's SVD modules "
                             f"(missing {sorted(set(mods) - set(v))[:3]}, extra {sorted(set(v) - set(mods))[:3]})")
    for n, m in mods.items():
        assert v[n].shape == (m.rank,), f"{path}: {n} has shape {tuple(v[n].shape)}, module rank {m.rank}"
    return v, meta


# ---- activation side (Rebound-style baseline) ----------------------------------------------
def hidden_layer(model, depth_frac: float) -> int:
    """Index into output_hidden_states (0 = embeddings, L = last layer) at depth_frac of the stack."""
    assert 0 < depth_frac <= 1, f"depth_frac must be in (0, 1], got {depth_frac}"
    n = model.config.num_hidden_layers
    return max(1, min(n, round(depth_frac * n)))


@torch.no_grad()
def masked_hidden_mean(model, ids, attn, completion_mask, layer: int) -> torch.Tensor:
    """[B, d] mean of hidden_states[layer] over the positions where completion_mask is 1 ([B, L])."""
    dev = next(model.parameters()).device
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids.to(dev), attention_mask=attn.to(dev), position_ids=pos.to(dev),
                output_hidden_states=True)
    h = out.hidden_states[layer].float()
    m = completion_mask.to(h.device, h.dtype)[..., None]
    return ((h * m).sum(1) / m.sum(1).clamp(min=1)).cpu()


@torch.no_grad()
def pair_activation_means(model, tok, pairs: list[Pair], layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([N, d] hack, [N, d] clean) mean activations over completion tokens."""
    was_training = model.training
    model.eval()
    res = []
    for which in ("hack", "clean"):
        rows = []
        for p in pairs:
            ids, P = encode_pair_text(tok, p.prompt, getattr(p, which))
            cm = torch.zeros_like(ids)
            cm[:, P:] = 1
            rows.append(masked_hidden_mean(model, ids, torch.ones_like(ids), cm, layer))
        res.append(torch.cat(rows))
    model.train(was_training)
    return res[0], res[1]
