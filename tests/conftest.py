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


# A Qwen3-style chat template: messages in <|im_start|>role ... <|im_end|> blocks; the generation
# prompt opens the assistant turn, with an empty think block when enable_thinking is false.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
CHAT_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
LEETCODE_MINI = Path(__file__).parent / "data" / "leetcode_mini.jsonl"


def make_chat_tokenizer(vocab_size: int = 2000):
    """A byte-level BPE tokenizer trained on the shipped LeetCode problems, with Qwen's special tokens
    and CHAT_TEMPLATE (EOS <|im_end|>, pad <|endoftext|>)."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rows = [json.loads(line) for line in LEETCODE_MINI.read_text().splitlines()]
    texts = [m["content"] for r in rows for m in r["prompt"]] + [r["canonical_solution"] for r in rows]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=CHAT_SPECIALS,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHAT_TEMPLATE)


def make_tiny_chat_model(out: Path, arch: str = "qwen3", seed: int = 0, hidden: int = 32, heads: int = 4,
                         head_dim: int = 16) -> Path:
    """A tiny random model of a real chat architecture (Qwen3: q/k norms, tied head) + the chat tokenizer,
    saved as a local model directory."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    tok = make_chat_tokenizer()
    cls, config = {"qwen3": (Qwen3ForCausalLM, Qwen3Config), "qwen2": (Qwen2ForCausalLM, Qwen2Config)}[arch]
    cfg = config(vocab_size=len(tok) + 16, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                 num_attention_heads=heads, num_key_value_heads=heads // 2, head_dim=head_dim,
                 max_position_embeddings=8192,
                 tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    cls(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory) -> Path:
    return make_tiny_chat_model(tmp_path_factory.mktemp("tiny_qwen3_chat"))
