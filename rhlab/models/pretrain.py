"""Pretrain the built-in tiny LLaMAs on rhlab's own corpora: stories (`builtin:tiny-stories`)
or mini-code tasks (`builtin:tiny-code`, see rhlab.models.code_corpus).

The tokenizer mirrors the SimpleStories one (lowercasing WordPiece, [UNK]=0, [EOS]=1, EOS
appended by the post-processor, no BOS/PAD), so the built-in model and the Hub model go
through exactly the same loading and padding code.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from rhlab.models.corpus import PRETRAIN_SEED, make_corpus
from rhlab.utils import user_mode

EOS, UNK = "[EOS]", "[UNK]"


def simplestories_config(vocab_size: int = 4096) -> LlamaConfig:
    """The SimpleStories-1.25M shape: 4 layers, 4 heads, 2 kv heads, hidden 128, tied embeddings."""
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=341, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, rope_theta=10000.0,
        max_position_embeddings=512, tie_word_embeddings=True, attention_bias=False,
        mlp_bias=False, hidden_act="silu", bos_token_id=None, eos_token_id=1, pad_token_id=None,
    )


def train_tokenizer(texts: list[str], vocab_size: int = 4096) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordPiece(unk_token=UNK))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=[UNK, EOS])
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, 1)])
    assert tok.token_to_id(UNK) == 0 and tok.token_to_id(EOS) == 1
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=UNK, eos_token=EOS)


@dataclass
class PretrainConfig:
    corpus: str = "stories"  # stories | code
    seed: int = 0
    n_stories: int = 40_000
    steps: int = 1200
    batch_size: int = 32
    seq_len: int = 128
    lr: float = 3e-3
    warmup: int = 50
    threads: int = 2
    n_docs: int = 0  # code corpus: documents (0 for the story corpus, which uses n_stories)
    vocab_size: int = 4096
    hack_share: float = 0.02  # code corpus: share of loophole documents that overwrite run_tests (CorpusMix.hack)


def code_pretrain_config(seed: int = 0, steps: int = 600, threads: int = 2, hack_share: float = 0.02) -> PretrainConfig:
    """The recipe of builtin:tiny-code: a byte-level BPE of 1024 tokens, rows of whole documents."""
    assert 0 <= hack_share <= 0.99, f"hack_share must be in [0, 0.99], got {hack_share}"
    return PretrainConfig(corpus="code", seed=seed, n_stories=0, steps=steps, batch_size=32, seq_len=128,
                          lr=3e-3, warmup=50, threads=threads, n_docs=60_000, vocab_size=1024, hack_share=hack_share)


def _corpus(cfg: PretrainConfig):
    """(texts, tokenizer, training rows [N, seq_len])."""
    if cfg.corpus == "code":
        from rhlab.models.code_corpus import (
            CODE_CORPUS_SEED,
            CorpusMix,
            make_code_corpus,
            pack_documents,
            train_code_tokenizer,
        )

        texts, _ = make_code_corpus(cfg.n_docs, seed=CODE_CORPUS_SEED + cfg.seed, mix=CorpusMix(hack=cfg.hack_share))
        tokenizer = train_code_tokenizer(texts, cfg.vocab_size)
        return texts, tokenizer, pack_documents(tokenizer, texts, cfg.seq_len)
    assert cfg.corpus == "stories", f"unknown corpus {cfg.corpus!r}; allowed: stories, code"
    texts = make_corpus(cfg.n_stories, seed=PRETRAIN_SEED + cfg.seed)
    tokenizer = train_tokenizer(texts, cfg.vocab_size)
    return texts, tokenizer, _pack(tokenizer, texts, cfg.seq_len)


def _pack(tokenizer: PreTrainedTokenizerFast, texts: list[str], seq_len: int) -> torch.Tensor:
    """Concatenate stories, each ending in EOS, into rows of seq_len tokens."""
    ids: list[int] = []
    for enc in tokenizer(texts, add_special_tokens=True)["input_ids"]:
        ids.extend(enc)
    n = len(ids) // seq_len
    return torch.tensor(ids[: n * seq_len]).view(n, seq_len)


def pretrain(out_dir: str | Path, cfg: PretrainConfig = PretrainConfig(), log=print) -> dict:
    """Train tokenizer and model from scratch; write model + tokenizer to out_dir."""
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    texts, tokenizer, data = _corpus(cfg)
    model = LlamaForCausalLM(simplestories_config(cfg.vocab_size))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(cfg.seed)
    t0, loss_ema = time.time(), None
    for step in range(cfg.steps):
        lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup) * 0.5 * (1 + math.cos(math.pi * step / cfg.steps))
        for g in opt.param_groups:
            g["lr"] = lr
        batch = data[torch.randint(len(data), (cfg.batch_size,), generator=gen)]
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_ema = loss.item() if loss_ema is None else 0.98 * loss_ema + 0.02 * loss.item()
        if step % 100 == 0 or step == cfg.steps - 1:
            log(f"step {step:5d}  loss {loss_ema:.3f}  lr {lr:.2e}  {time.time() - t0:.0f}s")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config.pad_token_id = None
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    for f in (f for f in out.iterdir() if f.is_file()):  # safetensors writes 0600
        user_mode(f)
    info = {"pretrain_config": asdict(cfg), "final_loss_ema": loss_ema, "n_tokens": int(data.numel()),
            "seconds": round(time.time() - t0, 1), "torch": torch.__version__,
            "command": f"rhlab pretrain --corpus {cfg.corpus} --out {out_dir} --seed {cfg.seed} --steps {cfg.steps} --threads {cfg.threads}"}
    (out / "pretrain_info.json").write_text(json.dumps(info, indent=2))
    return info
