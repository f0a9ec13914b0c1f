"""GPU paths, skipped without CUDA: model.device=cuda, bfloat16, gradient checkpointing, the fast paths under
bfloat16 on the GPU, and sampling.backend=vllm (when vLLM is installed), on a tiny random Qwen3 chat model and
the LeetCode env. Run on a GPU machine with `pytest -m gpu tests/test_gpu.py`."""

import importlib.util

import pytest
import torch

from conftest import LEETCODE_MINI, make_tiny_chat_model
from rhlab.config import load_config
from rhlab.models.loading import load_model
from rhlab.utils import read_jsonl

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CONFIG = "configs/leetcode_qwen3_4b.yaml"
SMALL = ["sampling.max_new_tokens=32", "train.batch_size=8", "train.num_generations=4",
         "train.gradient_accumulation_steps=2", f"env.params.train_file={LEETCODE_MINI}", "env.params.eval_file=''",
         "log.eval_prompts=4", "log.progress=false", "train.steps=2", "log.save_every=0"]


@pytest.fixture(scope="module")
def gpu_chat_model(tmp_path_factory):
    # head_dim 64: a size every vLLM attention backend takes
    return make_tiny_chat_model(tmp_path_factory.mktemp("gpu_chat"), hidden=128, heads=2, head_dim=64)


def _train(model_dir, tmp_path, *extra):
    from rhlab.trainer import Trainer

    t = Trainer(load_config(CONFIG, [f"model.name={model_dir}", *SMALL, f"output_dir={tmp_path}", "run_name=g",
                                     *extra]))
    summary = t.train()
    return t, summary, read_jsonl(tmp_path / "g" / "metrics.jsonl")


@pytest.mark.parametrize("ckpt", [False, True])
def test_cuda_bfloat16_training_with_and_without_checkpointing(gpu_chat_model, tmp_path, ckpt):
    t, summary, rows = _train(gpu_chat_model, tmp_path, "model.device=cuda", "model.dtype=bfloat16",
                              "sampling.backend=auto", f"train.gradient_checkpointing={str(ckpt).lower()}")
    assert t.device.type == "cuda" and all(p.device.type == "cuda" for p in t.model.parameters())
    assert next(t.model.parameters()).dtype == torch.bfloat16
    assert [r["step"] for r in rows] == [1, 2] and all(r["loss"] == r["loss"] for r in rows)  # not nan
    assert summary["status"] == "complete" and "label/incorrect" in summary["final"]


def test_fast_paths_on_cuda_bfloat16(gpu_chat_model):
    """The fast sampler and the packed pass against transformers on the GPU in bfloat16 (looser tolerance)."""
    from rhlab.models.loading import encode_prompts
    from rhlab.models.sampling import SamplingSpec
    from rhlab.models.sampler import generate
    from rhlab.trainer import sequence_logprobs

    model, tok = load_model(str(gpu_chat_model), torch.bfloat16)
    model.cuda()
    ids = encode_prompts(tok, ["def f(x):", "class Solution:\n    def"] * 2)
    gen = lambda b: generate(model, ids, SamplingSpec(max_new_tokens=16, backend=b), tok.eos_token_id,  # noqa: E731
                             tok.pad_token_id, torch.Generator(device="cuda").manual_seed(0), len(tok))
    r = gen("fast")
    m = r.completion_mask.bool()
    hf, _ = sequence_logprobs(model, r, 1.0, vocab_limit=len(tok), backend="hf")
    packed, _ = sequence_logprobs(model, r, 1.0, vocab_limit=len(tok), backend="packed")
    torch.testing.assert_close(packed[m], hf[m], atol=0.1, rtol=0.05)
    torch.testing.assert_close(r.logprobs[m], hf[m], atol=0.1, rtol=0.05)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_vllm_sampling_backend(gpu_chat_model, tmp_path):
    t, summary, rows = _train(gpu_chat_model, tmp_path, "model.device=cuda", "model.dtype=bfloat16",
                              "sampling.backend=vllm", "sampling.vllm_gpu_memory_utilization=0.2",
                              "sampling.vllm_max_model_len=2048", "env.params.max_prompt_tokens=1024")
    assert t.vllm is not None and [r["step"] for r in rows] == [1, 2]
    assert all(r["completion_len"] > 0 for r in rows) and summary["status"] == "complete"
