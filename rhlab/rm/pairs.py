"""Preference pairs: two completions per prompt from the initial policy, labelled by the gold reward.

Label noise flips each label independently with probability `label_noise` (seeded), the
simplest model of a noisy annotator. `flipped` is kept so accuracy can also be measured
against the clean gold ordering.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import torch

from rhlab.models.loading import encode_prompts
from rhlab.models.sampler import generate
from rhlab.models.sampling import SamplingSpec
from rhlab.utils import atomic_write_text


@dataclass
class Pair:
    prompt: str
    chosen: str
    rejected: str
    gold_chosen: Optional[float] = None
    gold_rejected: Optional[float] = None
    flipped: bool = False  # True: the noisy label disagrees with the gold ordering


def sample_completion_pairs(model, tok, prompt_pool: list[str], n_pairs: int, sampling: SamplingSpec,
                            seed: int, batch_size: int = 128) -> tuple[list[str], list[str], list[str]]:
    """(prompts, completions_a, completions_b): two samples per prompt; identical pairs are dropped
    (they carry no preference) and replaced by fresh ones."""
    assert n_pairs > 0 and batch_size >= 2 and prompt_pool
    rng = random.Random(f"{seed}-pair-prompts")
    gen = torch.Generator().manual_seed(seed)
    prompts, comp_a, comp_b = [], [], []
    attempts = 0
    while len(prompts) < n_pairs:
        attempts += 1
        assert attempts <= 20 + 10 * n_pairs // max(1, batch_size // 2), \
            "too many identical completion pairs: is the policy deterministic (temperature 0)?"
        chunk = [rng.choice(prompt_pool) for _ in range(min(batch_size // 2, n_pairs - len(prompts)))]
        doubled = [p for p in chunk for _ in range(2)]  # consecutive: (a, b) of one prompt
        r = generate(model, encode_prompts(tok, doubled), sampling, eos_id=tok.eos_token_id,
                     pad_id=tok.pad_token_id, generator=gen, vocab_limit=len(tok))
        ids = r.completion_ids * r.completion_mask + tok.pad_token_id * (1 - r.completion_mask)
        texts = tok.batch_decode(ids, skip_special_tokens=True)
        for i, p in enumerate(chunk):
            a, b = texts[2 * i], texts[2 * i + 1]
            if a != b:
                prompts.append(p)
                comp_a.append(a)
                comp_b.append(b)
    return prompts, comp_a, comp_b


def label_pairs(prompts: list[str], comp_a: list[str], comp_b: list[str], gold_a: list[float],
                gold_b: list[float], label_noise: float, seed: int) -> list[Pair]:
    """chosen = the higher-gold completion (ties: a coin), then flipped with probability label_noise."""
    assert 0 <= label_noise <= 0.5, f"label_noise={label_noise} must be in [0, 0.5]"
    n = len(prompts)
    assert len(comp_a) == len(comp_b) == len(gold_a) == len(gold_b) == n
    rng = random.Random(f"{seed}-label-noise")
    pairs = []
    for p, a, b, ga, gb in zip(prompts, comp_a, comp_b, gold_a, gold_b):
        flip = rng.random() < label_noise  # drawn for every pair: the flips do not depend on the golds
        a_better = ga > gb or (ga == gb and rng.random() < 0.5)
        if a_better == flip:  # b is chosen
            a, b, ga, gb = b, a, gb, ga
        pairs.append(Pair(p, a, b, float(ga), float(gb), flip))
    return pairs


def write_pairs(path: str | Path, pairs: list[Pair], split: list[str] | None = None) -> None:
    rows = [{**asdict(x), **({"split": split[i]} if split else {})} for i, x in enumerate(pairs)]
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def read_pairs(path: str | Path) -> list[Pair]:
    """Pairs from JSONL rows with at least prompt, chosen, rejected (extra keys such as split ignored)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"pairs file not found: {path}")
    pairs = []
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        row = json.loads(line)
        missing = {"prompt", "chosen", "rejected"} - set(row)
        if missing:
            raise ValueError(f"{path}: line {i + 1} lacks {sorted(missing)}")
        pairs.append(Pair(row["prompt"], row["chosen"], row["rejected"], row.get("gold_chosen"),
                          row.get("gold_rejected"), bool(row.get("flipped", False))))
    assert pairs, f"{path}: no pairs"
    return pairs
