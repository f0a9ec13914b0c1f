"""Load a policy model and tokenizer: `builtin:NAME`, a local directory, or a Hub id.

Tokenizers are normalised so the rest of rhlab can rely on: an EOS id, a pad id (EOS when
the tokenizer has none: padding is always masked, so reusing EOS is safe), and prompts
encoded *without* special tokens (SimpleStories-style tokenizers append EOS otherwise,
which would end the story before it starts).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

hf_logging.disable_progress_bar()  # "Loading weights" bars would drown the training progress bar

BUILTIN_DIR = Path(__file__).parent / "builtin"
BUILTIN_MODELS = ("tiny-stories", "tiny-code")
# model.dtype -> the torch dtype policy and reference are loaded in
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_model_path(name: str) -> str:
    """Map a model name from config to something from_pretrained accepts; fail loudly."""
    if name.startswith("builtin:"):
        key = name.split(":", 1)[1]
        if key not in BUILTIN_MODELS:
            raise ValueError(f"model: unknown builtin model {key!r}; allowed: "
                             f"{', '.join('builtin:' + m for m in BUILTIN_MODELS)}")
        path = BUILTIN_DIR / key
        if not (path / "model.safetensors").exists():
            raise FileNotFoundError(f"model: builtin weights missing at {path}; regenerate them with "
                                    f"`rhlab pretrain --corpus {'code' if key == 'tiny-code' else 'stories'} --out {path}`")
        return str(path)
    if name.startswith((".", "/", "~")) or Path(name).expanduser().exists():
        path = Path(name).expanduser()
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"model: local directory {path} has no config.json")
        return str(path)
    if name.count("/") != 1:
        raise ValueError(f"model: {name!r} is neither builtin:NAME, an existing directory, "
                         "nor a Hub id of the form owner/name")
    return name  # a Hub id: from_pretrained downloads it (needs a network)


def prepare_tokenizer(tok: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    if tok.eos_token_id is None:
        raise ValueError("tokenizer has no EOS token; rhlab needs one to stop generation")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_model(name: str, dtype: torch.dtype = torch.float32, **hub_kwargs):
    """(model, tokenizer) in eval mode. hub_kwargs (cache_dir, local_files_only, revision) go to
    from_pretrained."""
    path = resolve_model_path(name)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa", **hub_kwargs)
    tok = AutoTokenizer.from_pretrained(path, **hub_kwargs)
    if tok.eos_token_id is None and model.config.eos_token_id is not None:
        # a bare tokenizer.json declares no special tokens: take EOS from the model config
        eos = model.config.eos_token_id
        tok.eos_token = tok.convert_ids_to_tokens(eos if isinstance(eos, int) else eos[0])
    tok = prepare_tokenizer(tok)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.eval()
    return model, tok


def encode_prompts(tok: PreTrainedTokenizerBase, prompts: list[str]) -> list[list[int]]:
    """Prompt token ids without special tokens (no trailing EOS, no BOS)."""
    ids = tok(prompts, add_special_tokens=False)["input_ids"]
    for p, i in zip(prompts, ids):
        if not i:
            raise ValueError(f"prompt {p!r} encodes to zero tokens")
    return ids


def render_chat(tok: PreTrainedTokenizerBase, messages: list[dict], enable_thinking: bool = False) -> str:
    """messages as the model sees them: the tokenizer's chat template with the generation prompt added.

    enable_thinking is passed to templates that have the switch (Qwen3's); true with a template
    that lacks it fails loudly. The text keeps the template's special tokens as text; encode_prompts
    (no special tokens added) turns it into the same ids as apply_chat_template(tokenize=True)."""
    template = tok.chat_template
    if not template:
        raise ValueError(f"tokenizer {tok.name_or_path!r} has no chat template; a chat environment needs one")
    kwargs = {}
    if "enable_thinking" in str(template):
        kwargs["enable_thinking"] = enable_thinking
    elif enable_thinking:
        raise ValueError(f"enable_thinking=true, but the chat template of {tok.name_or_path!r} has no thinking switch")
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
