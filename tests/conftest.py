"""Shared fixtures: the built-in model, and a SimpleStories-shaped random model in a Hub-style cache."""

from pathlib import Path

import pytest
import torch

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
SS_TOKENIZER = SHARED / "data" / "simplestories" / "tokenizer.json"

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def builtin():
    from rhlab.models.loading import load_model

    return load_model("builtin:tiny-stories")


@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory):
    """A Hub cache holding SimpleStories/SimpleStories-1.25M: the real tokenizer.json (nothing else
    declared: no pad, EOS only via the post-processor) and a random model of the same shape."""
    from transformers import LlamaForCausalLM

    from rhlab.models.pretrain import simplestories_config

    if not SS_TOKENIZER.exists():
        pytest.skip(f"reference data missing: {SS_TOKENIZER}")
    cache = tmp_path_factory.mktemp("hf_cache")
    snap = cache / "models--SimpleStories--SimpleStories-1.25M" / "snapshots" / ("0" * 40)
    torch.manual_seed(0)
    LlamaForCausalLM(simplestories_config()).save_pretrained(snap)
    (snap / "tokenizer.json").write_bytes(SS_TOKENIZER.read_bytes())
    (snap / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')
    refs = snap.parent.parent / "refs"
    refs.mkdir()
    (refs / "main").write_text("0" * 40)
    return cache
