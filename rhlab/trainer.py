"""The RL loop, readable top to bottom (see docs/architecture.md).

Each step: sample prompts -> generate rollouts -> score -> intervention.on_scored ->
advantages (intervention.advantages may replace them) -> num_iterations x (accumulated micro-batch losses -> backward ->
intervention.on_gradients -> clip -> optimizer step) -> log. Evaluate, sample and
checkpoint on schedule; a killed run resumes from its last checkpoint.

Policy, reference and every tensor of a step live on model.device (auto: cuda when available);
checkpoints are written from CPU copies. sampling.backend=vllm samples with a colocated vLLM engine
that is sent the policy's merged weights before every generation (rhlab/models/vllm_backend.py).
"""

from __future__ import annotations

import copy
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from rhlab.algos.advantages import MovingBaseline, grpo_advantages, rloo_advantages
from rhlab.algos.losses import Norm, k3_kl, policy_loss
from rhlab.components import build_env, build_intervention
from rhlab.config import ConfigError, RunConfig, resolve_device, run_name
from rhlab.envs.base import Scores
from rhlab.envs.code.sandbox import set_default_isolation
from rhlab.eval.diversity import diversity
from rhlab.models import checkpoint as ckpt
from rhlab.models.loading import DTYPES, encode_prompts, load_model
from rhlab.models.fast_llama import policy_logits
from rhlab.models.llama_block import core_model
from rhlab.models.packed import packed_logprobs, supports_packed
from rhlab.models.sampler import Rollouts, generate
from rhlab.rewards.registry import REWARDS
from rhlab.rundir import RunDirLock
from rhlab.utils import append_jsonl, atomic_write_text, read_jsonl, seed_everything, truncate_jsonl, write_json


@dataclass
class Batch:
    """One generation batch as the hooks see it."""
    prompts: list[str]
    completions: list[str]
    rollouts: Rollouts
    scores: Scores
    rewards: torch.Tensor  # [B] what advantages are computed from (hooks may change it)
    extra: dict = field(default_factory=dict)  # per-completion labels hooks attach
    ref_logp: torch.Tensor | None = None  # [B, T] reference log-probs, when computed before the loss (kl_in_reward)


def sequence_logprobs(model, r: Rollouts, temperature: float, with_entropy: bool = False,
                      vocab_limit: int | None = None, backend: str = "auto", checkpoint: bool = False):
    """Per-token log p(completion token) under softmax(logits / temperature): [B, T] (+ entropy).

    The policy's support is the tokenizer's vocabulary (vocab_limit): logits are computed only
    for completion positions and only for those rows of the output layer (see policy_logits).
    backend: packed (padding-free, LLaMA models: rhlab/models/packed.py; 0 at masked positions),
    hf (transformers forward on the padded batch), auto (packed when the model allows it).
    checkpoint: gradient checkpointing in the packed pass; the hf pass follows the model's own setting
    (gradient_checkpointing_enable, see Trainer).
    """
    if backend not in ("auto", "packed", "hf"):
        raise ValueError(f"logprob backend: unknown {backend!r}; allowed: auto, packed, hf")
    if backend != "hf":
        if supports_packed(model):
            return packed_logprobs(model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask,
                                   temperature, with_entropy, vocab_limit, checkpoint)
        if backend == "packed":
            raise ValueError("train.logprob_backend=packed needs a LLaMA-architecture model (LLaMA, Qwen2, Qwen3; "
                             "static RoPE, full attention, SiLU MLP, no attention dropout); use auto or hf")
    ids = torch.cat([r.prompt_ids, r.completion_ids], 1)
    attn = torch.cat([r.prompt_mask, r.completion_mask], 1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = policy_logits(model, ids, attn, pos, r.prompt_ids.shape[1], vocab_limit)
    logp_all = (logits / temperature).log_softmax(-1)
    logp = logp_all.gather(-1, r.completion_ids[..., None]).squeeze(-1)
    if not with_entropy:
        return logp, None
    with torch.no_grad():  # masked (-inf) vocabulary rows have p = 0: count them as 0, not 0 * -inf = nan
        p = logp_all.exp()
        ent = -(p * logp_all.masked_fill(p == 0, 0.0)).sum(-1)
    return logp, ent


class Trainer:
    def __init__(self, cfg: RunConfig, run_dir: str | Path | None = None, lock: bool = True):
        """lock: hold the run directory's lock (rhlab/rundir.py) until train() ends; off for read-only uses
        (evaluating a run's checkpoint) that may run beside its training."""
        self.cfg = cfg
        self.name = run_name(cfg)
        self.dir = Path(run_dir) if run_dir else Path(cfg.output_dir) / self.name
        self.lock = RunDirLock(self.dir) if lock else None  # before anything is loaded, read or written
        try:
            self._setup()
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Drop the run directory's lock (train() does it when it returns or raises)."""
        if self.lock is not None:
            self.lock.release()

    def _setup(self) -> None:
        cfg = self.cfg
        torch.set_num_threads(cfg.threads or torch.get_num_threads())
        seed_everything(cfg.seed)
        self.device = resolve_device(cfg.model.device)
        self._check_vllm()  # before anything is loaded: a wrong combination fails at once
        self.model, self.tok = load_model(cfg.model.name, DTYPES[cfg.model.dtype])
        self.model.to(self.device)  # before LoRA, the reference copy and the intervention's adapters
        self.vocab_limit = len(self.tok)  # the policy's support: ids the tokenizer can produce
        if cfg.model.lora.enabled:
            self.model = ckpt.add_lora(self.model, cfg.model.lora)
        t = cfg.train
        self.need_ref = t.beta > 0 or cfg.log.log_kl
        # LoRA: the reference is the base model with the adapter disabled (no copy needed)
        self.ref = None
        if self.need_ref and not cfg.model.lora.enabled:
            self.ref = copy.deepcopy(self.model).requires_grad_(False).eval()
        set_default_isolation(cfg.sandbox.isolation)   # every sandbox run of this process
        self.env = build_env(cfg.env, self.tok)
        self.eval_rewards = [(r.name, REWARDS.build(r.name, r.params)) for r in cfg.env.eval_rewards]
        self.intervention = build_intervention(cfg.intervention)
        # e.g. installs dual or SVD adapters; the reference above was copied before, so it stays the base
        self.model = self.intervention.prepare_model(self, self.model)
        self.model.to(self.device)  # a no-op unless the intervention built something off the device
        if t.gradient_checkpointing:
            enable_gradient_checkpointing(self.model)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        assert self.params, "no trainable parameters"
        # fused: one kernel per parameter instead of ~10 (1.5 vs 6 ms a step for the built-in model on 2 cores)
        self.opt = torch.optim.AdamW(self.params, lr=t.lr, betas=t.adam_betas, weight_decay=t.weight_decay,
                                     fused=self.device.type in ("cpu", "cuda"))
        self.total_updates = t.steps * t.num_iterations
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, self._lr_lambda)
        self.sampling = cfg.sampling
        self.baseline = MovingBaseline(t.baseline_momentum) if t.algo == "reinforce" else None
        self.step = 0
        self.intervention.setup(self)
        self.vllm = None
        if cfg.sampling.backend == "vllm":  # created once, after every adapter is in place
            from rhlab.models.vllm_backend import VLLMSampler

            self.vllm = VLLMSampler(self.model, cfg, self.tok.eos_token_id, self.tok.pad_token_id, self.vocab_limit)

    def _check_vllm(self) -> None:
        cfg = self.cfg
        if cfg.sampling.backend != "vllm":
            return
        if cfg.train.kl_in_reward:
            raise ConfigError("train.kl_in_reward=true does not work with sampling.backend=vllm: the KL folded into "
                              "the reward uses the sampler's per-token log-probs, and vLLM's are not the policy's "
                              "tempered log-probs (sequence_logprobs). Use kl_in_reward=false (KL in the loss) or "
                              "sampling.backend=auto|fast|hf")
        if self.device.type != "cuda":
            raise ConfigError(f"sampling.backend=vllm needs a CUDA device, but model.device={cfg.model.device} is "
                              f"{self.device} here (vLLM is GPU only); use sampling.backend=auto|fast|hf")

    # ---- schedule -------------------------------------------------------------------
    def _lr_lambda(self, update: int) -> float:
        t = self.cfg.train
        if update < t.warmup_steps:
            return (update + 1) / t.warmup_steps
        frac = (update - t.warmup_steps) / max(1, self.total_updates - t.warmup_steps)
        if t.lr_schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * frac))
        if t.lr_schedule == "linear":
            return 1 - frac
        return 1.0

    # ---- pieces of a step ------------------------------------------------------------
    def rollout(self, prompts: list[str], seed: int, temperature: float | None = None) -> tuple[Rollouts, list[str]]:
        s = self.sampling if temperature is None else self.sampling.model_copy(update={"temperature": temperature})
        self.model.eval()
        ids = encode_prompts(self.tok, prompts)
        if self.vllm is not None:
            self.vllm.sync_weights(self.model)  # the policy as it is now (adapters merged)
            r = self.vllm.generate(ids, s, seed).to(self.device)
        else:
            gen = torch.Generator(device=self.device).manual_seed(seed)  # CUDA sampling needs a CUDA generator
            r = generate(self.model, ids, s, eos_id=self.tok.eos_token_id, pad_id=self.tok.pad_token_id,
                         generator=gen, vocab_limit=self.vocab_limit)
        pad = self.tok.pad_token_id
        texts = self.tok.batch_decode((r.completion_ids * r.completion_mask + pad * (1 - r.completion_mask)).tolist(),
                                      skip_special_tokens=True)
        return r, texts

    def ref_logprobs(self, r: Rollouts) -> torch.Tensor:
        with torch.inference_mode():  # less per-op bookkeeping than no_grad; the clone is an ordinary tensor
            if self.ref is not None:
                out = self.logprobs(self.ref, r)[0]
            else:
                with self.model.disable_adapter():
                    out = self.logprobs(self.model, r)[0]
        return out.clone()

    def logprobs(self, model, r: Rollouts, with_entropy: bool = False):
        return sequence_logprobs(model, r, self.sampling.temperature, with_entropy, self.vocab_limit,
                                 self.cfg.train.logprob_backend, self.cfg.train.gradient_checkpointing)

    def advantages(self, batch: Batch) -> torch.Tensor:
        t = self.cfg.train
        if t.algo == "rloo":
            return rloo_advantages(batch.rewards, t.num_generations)
        if t.algo == "reinforce":
            return self.baseline.advantages(batch.rewards)
        return grpo_advantages(batch.rewards, t.num_generations, t.scale_rewards)

    def fold_kl_into_reward(self, batch: Batch) -> dict:
        """kl_in_reward: R_i <- R_i - beta * sum_t (logp - ref) over the completion (k1 per sequence).
        logp comes from the sampler (no extra pass); ref is kept for the loss's KL metric."""
        r = batch.rollouts
        ref = torch.cat([self.ref_logprobs(r.select(idx)) for idx in torch.arange(len(r), device=self.device).chunk(
            self.cfg.train.gradient_accumulation_steps)])
        batch.ref_logp = ref
        seq_kl = ((r.logprobs - ref) * r.completion_mask).sum(1)
        batch.rewards = batch.rewards - self.cfg.train.beta * seq_kl
        return {"seq_kl": float(seq_kl.mean())}

    def optimize(self, batch: Batch, adv: torch.Tensor, timings: dict) -> dict:
        """num_iterations optimizer updates on one generation batch, micro-batched. An intervention
        may split each micro-batch into groups, each with its own forward/backward pass inside a
        context (e.g. one that masks some adapters' gradients); per-sequence loss shares make the split exact."""
        t, r = self.cfg.train, batch.rollouts
        mask = r.completion_mask.clone()
        if t.mask_truncated_completions:
            mask[r.truncated] = 0
        n_micro = t.gradient_accumulation_steps
        chunks = torch.arange(len(r), device=self.device).chunk(n_micro)
        total_tokens = float(mask.sum())
        loss_beta = 0.0 if t.kl_in_reward else t.beta
        t0 = time.perf_counter()
        ref = batch.ref_logp
        if ref is None and self.need_ref:
            ref = torch.cat([self.ref_logprobs(r.select(idx)) for idx in chunks])
        timings["logprobs"] += time.perf_counter() - t0
        old = torch.zeros_like(r.logprobs)
        stats = {"kl": 0.0, "clip_low": 0.0, "clip_high": 0.0, "entropy": 0.0, "loss": 0.0}
        self.model.train()
        for it in range(t.num_iterations):
            for idx in chunks:
                norm = Norm(len(r), total_tokens, float(mask[idx].sum()), n_micro, self.sampling.max_new_tokens)
                for gidx, ctx in self.intervention.backward_groups(self, batch, idx):
                    t0 = time.perf_counter()
                    logp, ent = self.logprobs(self.model, r.select(gidx), with_entropy=it == 0)
                    if it == 0:  # the policy has not moved yet: these are the old log-probs
                        old[gidx] = logp.detach()
                    timings["logprobs"] += time.perf_counter() - t0
                    out = policy_loss(logp, old[gidx], adv[gidx], mask[gidx], loss_type=t.loss_type,
                                      epsilon=t.epsilon, epsilon_high=t.epsilon_high, delta=t.delta, beta=loss_beta,
                                      ref_logp=None if ref is None else ref[gidx], norm=norm,
                                      kl_bias_correction=t.kl_bias_correction,
                                      sapo_temperature_pos=t.sapo_temperature_pos,
                                      sapo_temperature_neg=t.sapo_temperature_neg)
                    t0 = time.perf_counter()
                    with ctx:
                        out.loss.backward()
                    timings["backward"] += time.perf_counter() - t0
                    share = float(mask[gidx].sum()) / max(total_tokens, 1.0)
                    if it == 0:
                        stats["kl"] += out.kl.item() * share
                        stats["entropy"] += (ent * mask[gidx]).sum().item() / max(total_tokens, 1.0)
                    stats["clip_low"] += out.clip_low.item() * share / t.num_iterations
                    stats["clip_high"] += out.clip_high.item() * share / t.num_iterations
                    stats["loss"] += out.loss.item() / t.num_iterations
            t0 = time.perf_counter()
            self.intervention.on_gradients(self)
            stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.params, t.max_grad_norm))
            stats["lr"] = self.sched.get_last_lr()[0]
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad(set_to_none=True)
            timings["optimizer"] += time.perf_counter() - t0
        return stats

    def train_step(self, step: int) -> tuple[dict, Batch]:
        t = self.cfg.train
        timings = dict.fromkeys(["generate", "score", "logprobs", "backward", "optimizer"], 0.0)
        t_start = time.perf_counter()
        rng = random.Random(f"{self.cfg.seed}-prompts-{step}")  # per-step streams: resume is exact
        prompts = [p for p in self.env.sample_prompts(rng, t.batch_size // t.num_generations)
                   for _ in range(t.num_generations)]
        r, texts = self.rollout(prompts, seed=self.cfg.seed * 1_000_003 + step)
        timings["generate"] = time.perf_counter() - t_start
        t0 = time.perf_counter()
        scores = self.env.score(prompts, texts)
        batch = Batch(prompts, texts, r, scores, torch.tensor(scores.reward, dtype=torch.float32, device=self.device))
        self.intervention.on_scored(self, batch)
        kl_stats = self.fold_kl_into_reward(batch) if t.kl_in_reward else {}
        adv = self.intervention.advantages(self, batch, self.advantages(batch))
        timings["score"] = time.perf_counter() - t0
        stats = self.optimize(batch, adv, timings)
        grouped = batch.rewards.view(-1, t.num_generations)
        row = {
            "step": step,
            "reward_mean": float(torch.tensor(scores.reward).mean()),
            "reward_std": float(torch.tensor(scores.reward).std()),
            "reward_trained_mean": float(batch.rewards.mean()),  # after hooks / KL folding
            **kl_stats,
            **{f"reward/{k}": sum(v) / len(v) for k, v in scores.parts.items()},
            **_score_means(scores),
            **({"frac_zero_std_groups": float((grouped.std(1) < 1e-8).float().mean())}
               if t.num_generations > 1 else {}),
            "completion_len": float(r.completion_mask.sum(1).float().mean()),
            "truncated_frac": float(r.truncated.float().mean()),
            **stats,
            **{k: v for k, v in diversity(texts).items()},
            **self.intervention.metrics(),
            **{f"time/{k}": round(v, 4) for k, v in timings.items()},
            "step_time": round(time.perf_counter() - t_start, 4),
        }
        return row, batch

    @torch.no_grad()
    def evaluate(self, n_prompts: int | None = None) -> tuple[dict, list[dict]]:
        """Fresh samples on held-out prompts: reward, task score, pass and hack rate, KL, diversity."""
        prompts = self.env.eval_prompts(n_prompts or self.cfg.log.eval_prompts)
        r, texts = self.rollout(prompts, seed=self.cfg.seed + 7_777)
        scores = self.env.score(prompts, texts)
        m = {"reward_mean": sum(scores.reward) / len(texts), **_score_means(scores),
             **{f"reward/{k}": sum(v) / len(v) for k, v in scores.parts.items()},
             "completion_len": float(r.completion_mask.sum(1).float().mean()), **diversity(texts)}
        for name, fn in self.eval_rewards:
            m[f"eval_reward/{name}"] = sum(fn(prompts, texts)) / len(texts)
        if self.need_ref:
            mask = r.completion_mask.float()
            kl = k3_kl(self.logprobs(self.model, r)[0], self.ref_logprobs(r))
            m["kl"] = float((kl * mask).sum() / mask.sum())
        samples = [{"prompt": p, "completion": c, "reward": rw, "task_score": ts, "hack": h}
                   for p, c, rw, ts, h in zip(prompts, texts, scores.reward, scores.task_score, scores.hack)]
        return m, samples

    # ---- the loop --------------------------------------------------------------------
    def train(self) -> dict:
        if self.lock is not None and not self.lock.held:  # a second train() on this Trainer
            self.lock = RunDirLock(self.dir)
        try:
            return self._train()
        finally:
            self.release()

    def _train(self) -> dict:
        from rhlab.tracking import Progress, Trackers, plot_run

        cfg, d = self.cfg, self.dir
        start = self._prepare_dir()
        if start > cfg.train.steps:
            return self.summary_dict("complete")
        metrics, samples = d / "metrics.jsonl", d / "samples.jsonl"
        if start == 1:
            self._eval_and_save(0)
        t_run = time.time()
        trackers = Trackers(cfg.log.report_to, d, self.name, cfg.dump())
        progress = Progress(cfg.train.steps, start - 1, enabled=cfg.log.progress)
        for step in range(start, cfg.train.steps + 1):
            self.step = step
            row, batch = self.train_step(step)
            if cfg.log.eval_every and step % cfg.log.eval_every == 0 and step != cfg.train.steps:
                row.update({f"eval/{k}": v for k, v in self._eval_and_save(step).items()})
            if step % cfg.log.log_every == 0 or step == cfg.train.steps:
                append_jsonl(metrics, row)
                trackers.log(row, step)
            if cfg.log.n_samples and (step % cfg.log.sample_every == 0 or step == 1):
                for i in range(min(cfg.log.n_samples, len(batch.completions))):
                    append_jsonl(samples, {"step": step, "prompt": batch.prompts[i], "completion": batch.completions[i],
                                           "reward": batch.scores.reward[i], "task_score": batch.scores.task_score[i],
                                           "hack": batch.scores.hack[i]})
            if (cfg.log.save_every and step % cfg.log.save_every == 0) or step == cfg.train.steps:
                ckpt.save(self, d / "checkpoints", step, keep=cfg.log.keep_checkpoints)
            progress.update(row)
        progress.close()
        final = self._eval_and_save(cfg.train.steps)
        trackers.log({f"eval/{k}": v for k, v in final.items()}, cfg.train.steps)
        trackers.close()
        from rhlab.eval.trajectory import trajectory_summary

        summary = self.summary_dict("complete", final, train_seconds=time.time() - t_run,
                                    trajectory=trajectory_summary(read_jsonl(metrics)))
        write_json(d / "summary.json", summary)
        plot_run(d)
        return summary

    def _eval_and_save(self, step: int) -> dict:
        """Held-out evaluation (plus the intervention's extra modes as <mode>/<metric>), saved to eval/."""
        m, samples = self.evaluate()
        for mode, extra in self.intervention.extra_evals(self).items():
            m.update({f"{mode}/{k}": v for k, v in extra.items()})
        write_json(self.dir / "eval" / f"step_{step:05d}.json", {"step": step, "metrics": m, "samples": samples})
        return m

    def summary_dict(self, status: str, final: dict | None = None, **extra) -> dict:
        initial = self.dir / "eval" / "step_00000.json"
        return {"run_name": self.name, "arm": self.cfg.arm, "seed": self.cfg.seed, "status": status,
                "steps": self.cfg.train.steps, "final": final or {},
                "initial": ckpt.read_json(initial)["metrics"] if initial.exists() else {}, **extra}

    def _prepare_dir(self) -> int:
        """Create or validate the run directory; returns the first step to run (resumes after a kill)."""
        d = self.dir
        d.mkdir(parents=True, exist_ok=True)
        cfg_text = yaml.safe_dump(self.cfg.dump(), sort_keys=False)
        cfg_path = d / "config.yaml"
        if cfg_path.exists() and _with_defaults(yaml.safe_load(cfg_path.read_text())) != self.cfg.dump():
            raise ConfigError(f"{d} holds a run with a different config; use another run_name or output_dir")
        atomic_write_text(cfg_path, cfg_text)
        summary = d / "summary.json"
        if summary.exists() and ckpt.read_json(summary).get("status") == "complete":
            return self.cfg.train.steps + 1
        last = ckpt.latest(d / "checkpoints")
        if last is None:
            for f in ("metrics.jsonl", "samples.jsonl"):
                (d / f).unlink(missing_ok=True)
            return 1
        ckpt.load(self, last)
        print(f"resuming from step {self.step} (checkpoint {last}); steps {self.step + 1}..{self.cfg.train.steps} "
              "to go", file=sys.stderr, flush=True)
        for f in ("metrics.jsonl", "samples.jsonl"):
            truncate_jsonl(d / f, self.step)
        return self.step + 1


def enable_gradient_checkpointing(model) -> None:
    """transformers' per-layer checkpointing for the hf log-prob pass (active in train mode only; the
    packed pass checkpoints its own layers). Non-reentrant: correct with frozen embeddings (LoRA)."""
    core = core_model(model)
    if not getattr(core, "supports_gradient_checkpointing", False):
        raise ConfigError(f"train.gradient_checkpointing=true: {type(core).__name__} does not support it")
    kwargs = {"use_reentrant": False}
    if hasattr(core, "activation_checkpointing_enable"):  # the name since transformers 5.x; the old one warns
        core.activation_checkpointing_enable(kwargs)
    else:
        core.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _with_defaults(saved) -> dict:
    """A saved config.yaml with keys added to RunConfig since it was written (e.g. model.device) at
    their defaults, so a run started before a key existed still resumes; as saved if it does not validate."""
    from pydantic import ValidationError

    try:
        return RunConfig.model_validate(saved).dump()
    except ValidationError:
        return saved


def _score_means(s: Scores) -> dict:
    n = len(s.reward)
    return {"task_score": sum(s.task_score) / n, "pass_rate": sum(s.passed) / n,
            "hack_rate": sum(s.hack) / n, "hack_rate_loose": sum(s.hack_loose) / n,
            **{k: sum(v) / n for k, v in s.shares.items()}}


def train_from_config(cfg: RunConfig, run_dir=None) -> dict:
    return Trainer(cfg, run_dir).train()


def load_run_metrics(run_dir: str | Path) -> list[dict]:
    return read_jsonl(Path(run_dir) / "metrics.jsonl")
