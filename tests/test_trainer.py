"""End-to-end runs of the loop on the built-in model: outputs, options, and exact resume after a kill."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from rhlab.config import load_config
from rhlab.trainer import Trainer
from rhlab.utils import read_jsonl

SMALL = ["train.batch_size=8", "train.num_generations=4", "sampling.max_new_tokens=16",
         "log.eval_prompts=4", "log.progress=false", "threads=1"]


def _cfg(tmp_path, *extra):
    return load_config(None, [f"output_dir={tmp_path}", *SMALL, *extra])


@pytest.mark.slow
def test_short_run_writes_everything(tmp_path):
    summary = Trainer(_cfg(tmp_path, "train.steps=3", "log.sample_every=2", "log.eval_every=2")).train()
    d = tmp_path / summary["run_name"]
    rows = read_jsonl(d / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for key in ["reward_mean", "reward_std", "reward/happy_count", "task_score", "hack_rate", "kl", "entropy",
                "completion_len", "truncated_frac", "grad_norm", "lr", "clip_low", "clip_high", "step_time",
                "distinct_2", "jaccard", "time/generate", "time/backward"]:
        assert key in rows[0], key
    assert "eval/hack_rate" in rows[1]
    assert {r["step"] for r in read_jsonl(d / "samples.jsonl")} == {1, 2}
    assert summary["status"] == "complete" and summary["final"] and summary["initial"]
    assert json.loads((d / "summary.json").read_text())["final"]["hack_rate"] == summary["final"]["hack_rate"]
    assert (d / "plots" / "training.png").stat().st_size > 10_000
    assert (d / "checkpoints" / "step_00003" / "weights.safetensors").exists()
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # the first step samples from the reference itself
    # running again is a no-op on a complete run
    assert Trainer(_cfg(tmp_path, "train.steps=3", "log.sample_every=2", "log.eval_every=2")).train()["final"] == {}


@pytest.mark.parametrize("extra", [
    ["model.lora.enabled=true", "train.loss_type=dapo", "train.num_iterations=2",
     "train.gradient_accumulation_steps=2"],
    ["train.loss_type=dr_grpo", "train.scale_rewards=batch", "train.delta=1.5", "train.epsilon_high=0.28",
     "train.beta=0.0", "log.log_kl=false"],
])
@pytest.mark.slow
def test_options_run(tmp_path, extra):
    # sentence_length rewards vary within every group, so every step has a gradient
    trainer = Trainer(_cfg(tmp_path, "train.steps=2", "env.rewards=[{name: sentence_length_5}]", *extra))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    summary = trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])]
    if "model.lora.enabled=true" in extra:
        assert changed and all("lora_" in n for n in changed)  # base weights never move under LoRA
    else:
        assert changed
    assert summary["status"] == "complete"


@pytest.mark.slow
def test_masked_truncated_completions_give_no_gradient(tmp_path):
    """16 new tokens never finish a story: with masking on, every completion is masked out."""
    trainer = Trainer(_cfg(tmp_path, "train.steps=1", "train.beta=0.0", "train.mask_truncated_completions=true"))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert all(torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
    assert read_jsonl(trainer.dir / "metrics.jsonl")[0]["truncated_frac"] == 1.0


@pytest.mark.slow
def test_resume_after_kill_loses_and_duplicates_nothing(tmp_path):
    args = ["train.steps=10", "log.save_every=3", "log.keep_checkpoints=2"]
    full = Trainer(_cfg(tmp_path / "a", *args)).train()
    ref_rows = read_jsonl(tmp_path / "a" / full["run_name"] / "metrics.jsonl")

    cfg = _cfg(tmp_path / "b", *args)
    d = tmp_path / "b" / full["run_name"]
    code = ("import sys; from rhlab.config import load_config; from rhlab.trainer import Trainer; "
            "Trainer(load_config(None, sys.argv[1:])).train()")
    proc = subprocess.Popen([sys.executable, "-c", code, f"output_dir={tmp_path / 'b'}", *SMALL, *args],
                            start_new_session=True)
    deadline = time.time() + 240
    while not (d / "checkpoints" / "step_00006").exists():
        assert proc.poll() is None and time.time() < deadline, "run ended before it could be killed"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (d / "summary.json").exists()
    Trainer(cfg).train()
    rows = read_jsonl(d / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 11))
    for a, b in zip(rows, ref_rows):
        for k in ("reward_mean", "loss", "grad_norm", "kl", "lr"):
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-7), (a["step"], k)


def test_kl_in_reward_vs_kl_in_loss_bookkeeping(tmp_path):
    """Folding KL into the reward subtracts beta * summed k1 per sequence and drops the loss's KL term."""
    from rhlab.trainer import Batch

    t = Trainer(_cfg(tmp_path, "train.beta=0.5", "train.kl_in_reward=true", "train.algo=rloo",
                     "train.gradient_accumulation_steps=2"))
    # move the policy away from the reference so KL is not zero
    with torch.no_grad():
        for p in t.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    prompts = t.env.sample_prompts(__import__("random").Random(0), 2) * 4
    r, texts = t.rollout(prompts, seed=1)
    scores = t.env.score(prompts, texts)
    batch = Batch(prompts, texts, r, scores, torch.tensor(scores.reward))
    stats = t.fold_kl_into_reward(batch)
    ref = t.ref_logprobs(r)
    seq_k1 = ((r.logprobs - ref) * r.completion_mask).sum(1)
    torch.testing.assert_close(batch.rewards, torch.tensor(scores.reward) - 0.5 * seq_k1, atol=1e-4, rtol=1e-4)
    assert stats["seq_kl"] == pytest.approx(float(seq_k1.mean()), rel=1e-4)
    assert abs(stats["seq_kl"]) > 1e-3
    # the loss then carries no KL term: its value equals the beta = 0 loss on the same inputs
    from rhlab.algos.losses import policy_loss
    from rhlab.trainer import sequence_logprobs

    logp, _ = sequence_logprobs(t.model, r, 1.0)
    adv = t.advantages(batch)
    kw = dict(loss_type="grpo", epsilon=0.2, ref_logp=ref)
    no_kl = policy_loss(logp, logp.detach(), adv, r.completion_mask, beta=0.0, **kw).loss
    with_kl = policy_loss(logp, logp.detach(), adv, r.completion_mask, beta=0.5, **kw).loss
    assert with_kl > no_kl  # what kl_in_reward=false would add
    stats = t.optimize(batch, adv, dict.fromkeys(["logprobs", "backward", "optimizer"], 0.0))
    assert stats["loss"] == pytest.approx(no_kl.item(), rel=1e-4, abs=1e-6)


def test_screening_exclusions_reach_the_advantages(tmp_path):
    """Screening's advantages hook drops excluded completions from their group's statistics (A = 0)."""
    from rhlab.algos.advantages import grpo_advantages
    from rhlab.interventions.penalties import Screening
    from rhlab.trainer import Batch

    t = Trainer(_cfg(tmp_path))
    rewards = torch.tensor([1.0, 0.0, 5.0, 2.0, 1.0, 1.0, 0.0, 3.0])
    exclude = torch.tensor([False, False, True, False, False, False, False, False])
    batch = Batch([], [], None, None, rewards, extra={"exclude": exclude})
    assert torch.equal(t.intervention.advantages(t, batch, t.advantages(batch)), grpo_advantages(rewards, 4))
    adv = Screening(svd={"enabled": False}).advantages(t, batch, t.advantages(batch))
    assert adv[2] == 0
    kept = grpo_advantages(torch.tensor([1.0, 0.0, 2.0]), 3)
    torch.testing.assert_close(adv[[0, 1, 3]], kept)
    torch.testing.assert_close(adv[4:], grpo_advantages(rewards[4:], 4))


@pytest.mark.slow
def test_device_cpu_trains_two_steps_and_resumes_on_it(tmp_path):
    """model.device=cpu: policy, reference, rollouts and checkpoints on the CPU; a finished run's checkpoint
    loads back onto the device (the safetensors file holds CPU tensors whatever device wrote it)."""
    from safetensors.torch import load_file

    t = Trainer(_cfg(tmp_path, "model.device=cpu", "train.steps=2", "env.rewards=[{name: sentence_length_5}]"))
    assert t.device == torch.device("cpu")
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    summary = t.train()
    assert summary["status"] == "complete"
    assert [r["step"] for r in read_jsonl(t.dir / "metrics.jsonl")] == [1, 2]
    assert all(p.device.type == "cpu" for p in [*t.model.parameters(), *t.ref.parameters()])
    assert any(not torch.equal(p, before[n]) for n, p in t.model.named_parameters())
    saved = load_file(str(t.dir / "checkpoints" / "step_00002" / "weights.safetensors"))
    assert all(v.device.type == "cpu" for v in saved.values())
    from rhlab.models.checkpoint import load

    fresh = Trainer(_cfg(tmp_path / "again", "model.device=cpu", "train.steps=2",
                         "env.rewards=[{name: sentence_length_5}]"))
    load(fresh, t.dir / "checkpoints" / "step_00002")
    assert all(torch.equal(p, dict(t.model.named_parameters())[n]) for n, p in fresh.model.named_parameters())
    assert fresh.step == 2
    # a run directory written before model.device (and the vllm keys) existed still counts as this run
    import yaml

    saved_cfg = yaml.safe_load((t.dir / "config.yaml").read_text())
    del saved_cfg["model"]["device"], saved_cfg["sampling"]["vllm_gpu_memory_utilization"]
    (t.dir / "config.yaml").write_text(yaml.safe_dump(saved_cfg))
    again = Trainer(_cfg(tmp_path, "model.device=auto", "train.steps=2", "env.rewards=[{name: sentence_length_5}]"))
    assert again.dir == t.dir and again.train()["status"] == "complete"  # not "a different config"


@pytest.mark.parametrize("device", ["tpu", "gpu", "CUDA", "cuda:x", "cpu:0"])
def test_bad_device_fails_naming_the_allowed_values(device):
    from rhlab.config import ConfigError

    with pytest.raises(ConfigError, match="model.device: .*allowed: auto, cpu, cuda, cuda:N"):
        load_config(None, [f"model.device={device}"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:1"])
def test_cuda_without_cuda_fails_clearly(tmp_path, device):
    from rhlab.config import ConfigError

    with pytest.raises(ConfigError, match=f"model.device={device}: CUDA is not available"):
        Trainer(_cfg(tmp_path, f"model.device={device}"))
    assert Trainer(_cfg(tmp_path, "train.steps=1")).device == torch.device("cpu")  # auto falls back to the CPU


def test_vllm_backend_errors(tmp_path):
    """vllm: no kl_in_reward (its log-probs are not the policy's), a CUDA device, vLLM installed; and
    generate() refuses it (the Trainer owns the engine)."""
    from rhlab.config import ConfigError

    with pytest.raises(ConfigError, match="kl_in_reward=true does not work with sampling.backend=vllm"):
        Trainer(_cfg(tmp_path, "sampling.backend=vllm", "train.kl_in_reward=true"))
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="sampling.backend=vllm needs a CUDA device.*model.device=auto is cpu"):
            Trainer(_cfg(tmp_path, "sampling.backend=vllm"))
    with pytest.raises(ConfigError, match="sampling.backend=vllm needs a CUDA device.*model.device=cpu"):
        Trainer(_cfg(tmp_path, "sampling.backend=vllm", "model.device=cpu"))


def test_vllm_missing_gives_the_install_command(builtin):
    import importlib.util

    from rhlab.models.vllm_backend import VLLMSampler, import_vllm

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    msg = r"sampling.backend=vllm needs vLLM: pip install 'rhlab\[vllm\]' \(GPU only\)"
    with pytest.raises(ImportError, match=msg):
        import_vllm()
    model, tok = builtin
    with pytest.raises(ImportError, match=msg):
        VLLMSampler(model, load_config(None, ["sampling.backend=vllm"]), tok.eos_token_id, tok.pad_token_id, len(tok))
