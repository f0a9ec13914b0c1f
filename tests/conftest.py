"""Shared fixtures: the built-in model, and a SimpleStories-shaped random model in a Hub-style cache."""

from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
REFERENCE_TOKENIZER = ROOT.parent / "shared" / "data" / "simplestories" / "tokenizer.json"
# The real SimpleStories tokenizer when the reference data sits beside the repo; otherwise the
# built-in model's, which has the same format (lowercasing WordPiece, [UNK]=0, [EOS]=1 appended by
# the post-processor, no pad), so the Hub-cache tests run on a bare clone too.
SS_TOKENIZER = (REFERENCE_TOKENIZER if REFERENCE_TOKENIZER.exists()
                else ROOT / "rhlab" / "models" / "builtin" / "tiny-stories" / "tokenizer.json")

torch.set_num_threads(2)


def pytest_report_header(config):
    which = "the SimpleStories reference file" if SS_TOKENIZER == REFERENCE_TOKENIZER else (
        "the built-in model's (same format; ../shared/data/simplestories/tokenizer.json not found)")
    return f"Hub-cache tests' tokenizer: {which}"


@pytest.fixture(scope="session")
def builtin():
    from rhlab.models.loading import load_model

    return load_model("builtin:tiny-stories")


@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory):
    """A Hub cache holding SimpleStories/SimpleStories-1.25M: its tokenizer.json (SS_TOKENIZER; nothing
    else declared: no pad, EOS only via the post-processor) and a random model of the same shape."""
    from transformers import LlamaForCausalLM

    from rhlab.models.pretrain import simplestories_config

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
