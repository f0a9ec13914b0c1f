"""A Bradley-Terry reward model: a scalar head on a small causal-LM backbone.

score(prompt, completion) = head(final hidden state at the last real token), where the input is
prompt ids + completion ids + EOS (the trailing EOS gives every sequence the same "read-out"
token, also when the completion was truncated). Raw scores have an arbitrary offset (the
pairwise loss only sees differences), so after training we store a shift and scale that make
the initial policy's completions score mean 0, std 1: `score()` returns normalised values,
`forward()` raw ones.

On disk (a directory): model.safetensors (backbone + head weights) and rm_config.json naming
the backbone, so `RewardModel.load(dir)` rebuilds it through rhlab.models.loading.load_model.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from rhlab.models.loading import encode_prompts, load_model, resolve_model_path
from rhlab.models.sampler import left_pad
from rhlab.utils import user_mode

WEIGHTS, CONFIG = "model.safetensors", "rm_config.json"
FORMAT_VERSION = 1


class RewardModel(nn.Module):
    def __init__(self, backbone: nn.Module, tokenizer, backbone_name: str, hidden_size: int,
                 max_length: int = 256):
        super().__init__()
        self.backbone = backbone  # the causal LM's base model (no LM head): returns last_hidden_state
        self.tok = tokenizer
        self.backbone_name = backbone_name
        self.max_length = max_length
        self.head = nn.Linear(hidden_size, 1)
        # zero head: every pair starts at loss log 2 and the backbone's features are not disturbed
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.shift, self.scale = 0.0, 1.0  # normalisation of score(); set by set_normalisation

    @classmethod
    def from_backbone(cls, name: str = "builtin:tiny-stories", max_length: int = 256) -> "RewardModel":
        """A fresh reward model (zero head) on a causal LM loaded by name (builtin:, directory, Hub id)."""
        lm, tok = load_model(name)
        base = lm.base_model
        assert base is not lm, f"{name}: cannot find the backbone under the LM head (base_model)"
        if not name.startswith("builtin:") and Path(name).expanduser().exists():
            name = str(Path(resolve_model_path(name)).resolve())  # absolute: loads from any cwd
        return cls(base, tok, name, lm.config.hidden_size, max_length)

    # ---- encoding & forward ------------------------------------------------------------
    def encode(self, prompts: list[str], completions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded ids and mask of prompt + completion + EOS (completion cut to fit max_length)."""
        assert len(prompts) == len(completions), f"{len(prompts)} prompts for {len(completions)} completions"
        p_ids = encode_prompts(self.tok, prompts)
        c_ids = self.tok(list(completions), add_special_tokens=False)["input_ids"]
        seqs = []
        for p, c in zip(p_ids, c_ids):
            room = self.max_length - len(p) - 1
            assert room >= 0, f"prompt of {len(p)} tokens does not fit max_length={self.max_length}"
            seqs.append(p + c[:room] + [self.tok.eos_token_id])
        return left_pad(seqs, self.tok.pad_token_id)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Raw scores [B]: head of the final hidden state at each row's last real token."""
        pos = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                               position_ids=pos).last_hidden_state
        T = attention_mask.shape[1]
        last = T - 1 - attention_mask.flip(1).argmax(1)  # works for left and right padding
        h = hidden[torch.arange(hidden.shape[0]), last]
        return self.head(h.float()).squeeze(-1)

    def raw_scores(self, prompts: list[str], completions: list[str]) -> torch.Tensor:
        return self(*self.encode(prompts, completions))

    @torch.no_grad()
    def score(self, prompts: list[str], completions: list[str], batch_size: int = 64) -> list[float]:
        """Normalised scores, batched, in eval mode (the mode is restored afterwards)."""
        was_training = self.training
        self.eval()
        out: list[float] = []
        for i in range(0, len(prompts), batch_size):
            raw = self.raw_scores(prompts[i:i + batch_size], completions[i:i + batch_size])
            out += ((raw - self.shift) / self.scale).tolist()
        self.train(was_training)
        return out

    def set_normalisation(self, raw: torch.Tensor | list[float]) -> None:
        """Make these raw scores (the initial policy's completions) mean 0, std 1 under score()."""
        raw = torch.as_tensor(raw, dtype=torch.float64)
        assert raw.numel() >= 2, "normalisation needs at least two scores"
        self.shift, self.scale = float(raw.mean()), max(float(raw.std()), 1e-6)

    # ---- persistence -------------------------------------------------------------------
    def config_dict(self) -> dict:
        return {"format_version": FORMAT_VERSION, "backbone": self.backbone_name,
                "hidden_size": self.head.in_features, "max_length": self.max_length,
                "shift": self.shift, "scale": self.scale}

    def save(self, out_dir: str | Path, extra: dict | None = None) -> Path:
        """Weights + config; `extra` (JSON-able) is stored alongside in rm_config.json."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().clone() for k, v in self.state_dict().items()}
        save_file(state, str(out_dir / WEIGHTS))
        user_mode(out_dir / WEIGHTS)
        (out_dir / CONFIG).write_text(json.dumps({**self.config_dict(), **(extra or {})}, indent=2) + "\n")
        return out_dir

    @classmethod
    def load(cls, rm_dir: str | Path) -> "RewardModel":
        rm_dir = Path(rm_dir)
        for f in (CONFIG, WEIGHTS):
            if not (rm_dir / f).exists():
                raise FileNotFoundError(f"reward model directory {rm_dir} has no {f}; "
                                        "train one with `rhlab train-rm CONFIG`")
        cfg = json.loads((rm_dir / CONFIG).read_text())
        if cfg.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{rm_dir / CONFIG}: format_version {cfg.get('format_version')!r}, "
                             f"expected {FORMAT_VERSION}")
        rm = cls.from_backbone(cfg["backbone"], cfg["max_length"])
        assert rm.head.in_features == cfg["hidden_size"], \
            f"{rm_dir}: head size {cfg['hidden_size']} does not match backbone {cfg['backbone']}"
        state = load_file(str(rm_dir / WEIGHTS))
        rm.load_state_dict(state, strict=True)  # raises naming any missing / unexpected key
        rm.shift, rm.scale = float(cfg["shift"]), float(cfg["scale"])
        return rm.eval()


def read_rm_config(rm_dir: str | Path) -> dict:
    path = Path(rm_dir) / CONFIG
    if not path.exists():
        raise FileNotFoundError(f"reward model directory {rm_dir} has no {CONFIG}")
    return json.loads(path.read_text())
