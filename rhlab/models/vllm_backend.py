"""sampling.backend=vllm: the Trainer samples its rollouts with a colocated vLLM engine (GPU only).

Like TRL's colocate mode (trl/generation/vllm_generation.py): one `vllm.LLM` in this process, on the
same GPU as the policy, holding its own copy of the weights. Before every generation the Trainer
sends it the policy's current weights, every adapter (peft LoRA, dual LoRA, SVD) merged
(merged_state_dict), through the model runner's load_weights, then resets vLLM's prefix cache.
vLLM's output is turned into exactly the Rollouts layout that generate() produces
(rollouts_from_completions), so the rest of the step does not know which sampler ran.

What differs from generate(): the random stream (vLLM's seeded sampler, one seed per completion),
and the per-token log-probs (vLLM's, not the tempered policy log-probs; the loss recomputes its own,
so only train.kl_in_reward, which reads them, is refused). Install with pip install 'rhlab[vllm]'.
"""

from __future__ import annotations

import os
import socket

import torch

from rhlab.models.sampler import Rollouts
from rhlab.models.sampling import SamplingSpec

INSTALL = "sampling.backend=vllm needs vLLM: pip install 'rhlab[vllm]' (GPU only)"


def import_vllm():
    """The vllm module, or a clear error saying how to get it."""
    try:
        import vllm
    except ImportError as e:
        raise ImportError(f"{INSTALL} ({e})") from None
    return vllm


def rollouts_from_completions(prompts: list[list[int]], completions: list[list[int]],
                              logprobs: list[list[float]] | None, eos_id: int, pad_id: int,
                              max_new_tokens: int) -> Rollouts:
    """Rollouts in generate()'s layout from plain token lists (CPU tensors).

    prompt_ids / prompt_mask: left-padded with pad_id. completion_ids [B, max_new_tokens] (generate()'s
    width, whatever the longest completion): each completion cut after its first EOS and at
    max_new_tokens, right-padded with pad_id. completion_mask: 1 up to and including EOS. truncated:
    no EOS. logprobs: as given on real tokens (None: zeros), 0 on padding."""
    from rhlab.models.sampler import left_pad

    assert len(prompts) == len(completions), f"{len(prompts)} prompts, {len(completions)} completions"
    assert logprobs is None or len(logprobs) == len(completions)
    ids, mask = left_pad(prompts, pad_id)
    rows, lps, ended = [], [], []
    for i, c in enumerate(completions):
        c = list(c)[:max_new_tokens]
        has_eos = eos_id in c
        n = c.index(eos_id) + 1 if has_eos else len(c)
        rows.append(c[:n])
        lp = [0.0] * n if logprobs is None else [float(x) for x in list(logprobs[i])[:n]]
        assert len(lp) == n, f"completion {i}: {n} tokens, {len(lp)} log-probs"
        lps.append(lp)
        ended.append(has_eos)
    B, T = len(rows), max_new_tokens
    tokens = torch.full((B, T), pad_id, dtype=torch.long)
    logps = torch.zeros((B, T))
    cmask = torch.zeros((B, T), dtype=torch.long)
    for i, (r, lp) in enumerate(zip(rows, lps)):
        if r:
            tokens[i, :len(r)] = torch.tensor(r, dtype=torch.long)
            logps[i, :len(r)] = torch.tensor(lp, dtype=torch.float32)
            cmask[i, :len(r)] = 1
    return Rollouts(ids, mask, tokens, cmask, ~torch.tensor(ended, dtype=torch.bool), logps)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


class VLLMSampler:
    """A colocated vLLM engine for the Trainer's rollouts: created once, weights pushed before each generation."""

    def __init__(self, model, cfg, eos_id: int, pad_id: int, vocab_limit: int | None):
        from rhlab.models.llama_block import core_model
        from rhlab.models.loading import resolve_model_path

        vllm = import_vllm()
        self.SamplingParams = vllm.SamplingParams
        self.eos_id, self.pad_id = eos_id, pad_id
        self.checked = False
        core = core_model(model)
        vocab = core.config.vocab_size
        # the policy's support is the tokenizer's ids (generate() masks the rest; vLLM must too)
        self.allowed = list(range(vocab_limit)) if vocab_limit is not None and vocab_limit < vocab else None
        # an adapter on a tied output layer unties it (SVD on lm_head): vLLM must then keep its own head
        tied = bool(getattr(core.config, "tie_word_embeddings", False))
        head = core.get_output_embeddings()
        untie = tied and not (isinstance(head, torch.nn.Linear)
                              and head.weight is core.get_input_embeddings().weight)
        # in-process engine (TRL's colocate mode): the model runner is reachable for load_weights
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "localhost")):
            os.environ.setdefault(k, v)
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        s = cfg.sampling
        kwargs = {"model": resolve_model_path(cfg.model.name), "dtype": cfg.model.dtype,
                  "gpu_memory_utilization": s.vllm_gpu_memory_utilization, "enable_prefix_caching": True,
                  "seed": cfg.seed, "distributed_executor_backend": "external_launcher",
                  "skip_tokenizer_init": True}  # token ids in, token ids out: rhlab's tokenizer decodes
        if s.vllm_max_model_len is not None:
            kwargs["max_model_len"] = s.vllm_max_model_len
        if untie:  # the checkpoint has no separate head to load: start from dummy weights, every one is pushed
            kwargs.update(hf_overrides={"tie_word_embeddings": False}, load_format="dummy")
        self.dummy = untie
        self.llm = vllm.LLM(**kwargs)

    @torch.no_grad()
    def sync_weights(self, model) -> None:
        """Push the policy's current weights (adapters merged) into vLLM; then drop its prefix cache."""
        from rhlab.models.fast_llama import merged_state_dict

        runner_model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        loaded: set = set()
        for name, tensor in merged_state_dict(model).items():
            got = runner_model.load_weights([(name, tensor)])
            loaded |= set(got or ())
        self.llm.reset_prefix_cache()
        if not self.checked and loaded:  # once: did the push reach every vLLM parameter?
            self.checked = True
            missing = sorted(set(dict(runner_model.named_parameters())) - loaded)
            if missing:
                msg = f"vLLM parameters the policy's weights did not set: {missing[:5]}{' ...' if len(missing) > 5 else ''}"
                if self.dummy:
                    raise RuntimeError(msg + " (they hold dummy values)")
                import warnings

                warnings.warn(msg + " (they keep the checkpoint's values)", stacklevel=2)

    def sampling_params(self, cfg: SamplingSpec, seed: int):
        """One SamplingParams per completion: a group repeats its prompt, and one seed for all its
        members would give them the same completion."""
        kw = {"n": 1, "temperature": cfg.temperature, "top_k": cfg.top_k if cfg.top_k > 0 else -1,  # -1 = off
              "top_p": cfg.top_p, "repetition_penalty": cfg.repetition_penalty, "max_tokens": cfg.max_new_tokens,
              "logprobs": 0, "stop_token_ids": [self.eos_id], "detokenize": False}
        if self.allowed is not None:
            kw["allowed_token_ids"] = self.allowed
        return lambda i: self.SamplingParams(**kw, seed=(seed * 1_000_003 + i) % 2**63)

    def generate(self, prompts: list[list[int]], cfg: SamplingSpec, seed: int) -> Rollouts:
        """One completion per prompt (repeat prompts for groups), in generate()'s layout, on the CPU."""
        params = self.sampling_params(cfg, seed)
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts],
                                 sampling_params=[params(i) for i in range(len(prompts))], use_tqdm=False)
        completions, logprobs = [], []
        for out in outs:
            o = out.outputs[0]
            toks = list(o.token_ids)
            if o.logprobs is None:
                lps = [0.0] * len(toks)
            else:  # logprobs=0: each position's dict holds the sampled token (unused by the loss: nan if absent)
                lps = [float(lp[t].logprob) if lp is not None and t in lp else float("nan")
                       for t, lp in zip(toks, o.logprobs)]
            # stopped on EOS but the id not returned (vLLM versions differ): put it back, so the
            # completion counts as finished, as generate() would count it
            if o.finish_reason == "stop" and (not toks or toks[-1] != self.eos_id):
                toks, lps = toks + [self.eos_id], lps + [0.0]
            completions.append(toks)
            logprobs.append(lps)
        return rollouts_from_completions(prompts, completions, logprobs, self.eos_id, self.pad_id,
                                         cfg.max_new_tokens)
