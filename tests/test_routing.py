"""Gradient routing: dual adapters, exact gradient masking, the overseer, ablation evals, checkpoints."""

import math
import copy
from pathlib import Path

import pytest
import torch

from rhlab.adapters import dual_lora
from rhlab.adapters.dual_lora import DualLoRALinear
from rhlab.config import load_config
from rhlab.trainer import Trainer
from rhlab.utils import read_jsonl

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SMALL = ["train.batch_size=8", "train.num_generations=4", "sampling.max_new_tokens=16",
         "log.eval_prompts=4", "log.progress=false", "threads=1",
         "env.rewards=[{name: sentence_length_5}]"]  # varies within groups: every step has a gradient


def _trainer(tmp_path, params: str = "{}", *extra) -> Trainer:
    return Trainer(load_config(None, [f"output_dir={tmp_path}", *SMALL, "intervention.name=routing",
                                      f"intervention.params={params}", *extra]))


def _perturb_B(model, seed: int = 0) -> None:
    """B starts at zero, which makes every A gradient zero: give B values so both get gradients."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in dual_lora.dual_modules(model):
            for b in (m.retain_B, m.forget_B):
                b.copy_(0.05 * torch.randn(b.shape, generator=g))


def _step_grads(t: Trainer, step: int = 1) -> tuple[dict, dict]:
    """Run one training step; return (gradients as the optimizer would see them, the metrics row)."""
    grads = {}
    t.intervention.on_gradients = lambda tr: grads.update(
        {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
         for n, p in tr.model.named_parameters() if p.requires_grad})
    t.step = step
    row, _ = t.train_step(step)
    return grads, row


def _close(a: torch.Tensor, b: torch.Tensor, name: str) -> None:
    """Equal up to float32 summation order (a split sums the same terms in another order)."""
    err, scale = float((a - b).abs().max()), float(b.abs().max())
    assert err <= 1e-5 * scale + 1e-10, f"{name}: max error {err:.3g} at scale {scale:.3g}"


# ---- the module --------------------------------------------------------------------------
def test_install_targets_freezes_and_starts_at_base(builtin):
    model, tok = builtin
    m = copy.deepcopy(model)
    ids = torch.randint(2, 200, (2, 7))
    before = m(input_ids=ids).logits
    names = dual_lora.install(m, ["q_proj", "down_proj"], [1, 2], 4, 8.0, 2, 4.0)
    assert names == ["model.layers.1.self_attn.q_proj", "model.layers.1.mlp.down_proj",
                     "model.layers.2.self_attn.q_proj", "model.layers.2.mlp.down_proj"]
    trainable = [n for n, p in m.named_parameters() if p.requires_grad]
    assert len(trainable) == 4 * 4 and all(n.split(".")[-1] in ("retain_A", "retain_B", "forget_A", "forget_B")
                                           for n in trainable)
    torch.testing.assert_close(m(input_ids=ids).logits, before, rtol=0, atol=0)  # B = 0: exactly the base
    mod = m.get_submodule("model.layers.1.self_attn.q_proj")
    assert mod.retain_A.shape == (4, 128) and mod.forget_B.shape == (mod.base.out_features, 2)
    assert mod.retain_scaling == 2.0 and mod.forget_scaling == 2.0 and mod.retain_A.abs().sum() > 0
    with pytest.raises(ValueError, match="not in the model"):
        dual_lora.install(copy.deepcopy(model), ["qkv"], None, 4, 8.0, 4, 8.0)
    with pytest.raises(ValueError, match="layers"):
        dual_lora.install(copy.deepcopy(model), ["q_proj"], [9], 4, 8.0, 4, 8.0)


def test_scales_ablate_each_adapter_and_match_a_stacked_lora():
    torch.manual_seed(0)
    base = torch.nn.Linear(6, 5, bias=False)
    lay = DualLoRALinear(base, 3, 6.0, 2, 4.0)  # alpha / r = 2 for both
    with torch.no_grad():
        lay.retain_B.normal_()
        lay.forget_B.normal_()
    x = torch.randn(4, 6)
    r = 2 * x @ lay.retain_A.T @ lay.retain_B.T
    f = 2 * x @ lay.forget_A.T @ lay.forget_B.T
    for (rs, fs), want in [((1, 1), base(x) + r + f), ((1, 0), base(x) + r), ((0, 1), base(x) + f),
                           ((0, 0), base(x)), ((0.5, 2), base(x) + 0.5 * r + 2 * f)]:
        dual_lora.set_scales(lay, rs, fs)
        torch.testing.assert_close(lay(x), want)
    # at (1, 1) with equal alpha / r the pair is one rank-5 LoRA with stacked A and B
    dual_lora.set_scales(lay, 1, 1)
    A = torch.cat([lay.retain_A, lay.forget_A])
    B = torch.cat([lay.retain_B, lay.forget_B], 1)
    torch.testing.assert_close(lay(x), base(x) + 2 * x @ A.T @ B.T)
    with pytest.raises(RuntimeError), dual_lora.scales(lay, 1, 0):
        assert dual_lora.get_scales(lay) == (1.0, 0.0)
        raise RuntimeError("scales are restored even on error")
    assert dual_lora.get_scales(lay) == (1.0, 1.0)


# ---- routing: gradient masks -------------------------------------------------------------
@pytest.mark.parametrize("mode, flag_all, zero, moved", [
    ("classic", True, "retain", "forget"),     # flagged: forget only
    ("exclusive", True, "retain", "forget"),
    ("exclusive", False, "forget", "retain"),  # exclusive: the rest update retain only
])
def test_masked_adapter_gets_exactly_zero_gradient(tmp_path, mode, flag_all, zero, moved):
    # recall 1 + false-positive rate 1 flags every completion; 0 + 0 flags none
    p = 1.0 if flag_all else 0.0
    t = _trainer(tmp_path, f"{{mode: {mode}, recall: {p}, false_positive_rate: {p}}}")
    _perturb_B(t.model)
    before = {n: q.detach().clone() for n, q in t.model.named_parameters()}
    grads, row = _step_grads(t)
    assert row["overseer/flag_rate"] == p
    masked = {n: g for n, g in grads.items() if f".{zero}_" in n}
    kept = {n: g for n, g in grads.items() if f".{moved}_" in n}
    assert masked and all(torch.count_nonzero(g) == 0 for g in masked.values()), "a masked gradient leaked"
    # gradients still reach the lowest layer: masking grads, not outputs, keeps the path through the adapters
    assert all(g.abs().sum() > 0 for n, g in kept.items() if "layers.0." in n)
    after = dict(t.model.named_parameters())
    for n, q in before.items():
        if f".{moved}_" in n:
            continue
        assert torch.equal(after[n], q), f"{n} changed but must not"  # base weights and the masked adapter


def test_routed_step_with_all_ones_masks_equals_unrouted_step(tmp_path):
    unrouted = _trainer(tmp_path / "a", "{mode: none}")
    routed = _trainer(tmp_path / "b", "{mode: classic, false_positive_rate: 0.5}")  # random flags: a real split
    routed.intervention.masks = {"flagged": (1, 1), "unflagged": (1, 1)}
    for t in (unrouted, routed):
        _perturb_B(t.model)
    g_a, row_a = _step_grads(unrouted)
    g_b, row_b = _step_grads(routed)
    assert 0 < row_b["overseer/flag_rate"] < 1
    assert row_a["reward_mean"] == row_b["reward_mean"]  # the same rollouts
    assert g_a.keys() == g_b.keys()
    for n in g_a:
        _close(g_b[n], g_a[n], n)
    assert row_a["loss"] == pytest.approx(row_b["loss"], rel=1e-5, abs=1e-8)


def test_classic_split_routes_only_flagged_away_from_retain(tmp_path):
    """Classic mode on a mixed batch: retain gets exactly the unflagged group's gradient."""
    routed = _trainer(tmp_path / "a", "{mode: classic, false_positive_rate: 0.5}")
    _perturb_B(routed.model)
    g_routed, row = _step_grads(routed)
    assert 0 < row["overseer/flag_rate"] < 1
    # the same step with flagged completions given zero advantage in both adapters == retain's gradient
    ref = _trainer(tmp_path / "b", "{mode: classic, false_positive_rate: 0.5}")
    ref.intervention.masks = {"flagged": (0, 0), "unflagged": (1, 1)}
    _perturb_B(ref.model)
    g_ref, _ = _step_grads(ref)
    retain = [n for n in g_routed if ".retain_" in n]
    for n in retain:
        _close(g_routed[n], g_ref[n], n)
    assert any(not torch.allclose(g_routed[n], g_ref[n]) for n in g_routed if ".forget_" in n)


# ---- the overseer -------------------------------------------------------------------------
def test_overseer_recall_fpr_and_per_step_seeding():
    from rhlab.interventions.routing import routing

    iv = routing(recall=0.5, false_positive_rate=0.1)
    base = torch.arange(20_000) % 4 == 0
    flags = iv.oversee(base, seed=1, step=3)
    assert flags[base].float().mean() == pytest.approx(0.5, abs=0.03)
    assert flags[~base].float().mean() == pytest.approx(0.1, abs=0.02)
    assert torch.equal(flags, iv.oversee(base, seed=1, step=3))  # resume redraws the same flags
    assert not torch.equal(flags, iv.oversee(base, seed=1, step=4))
    assert torch.equal(routing().oversee(base, 1, 3), base)  # a perfect overseer is the detector
    with pytest.raises(ValueError, match="mode"):
        routing(mode="soft")
    with pytest.raises(ValueError, match="recall"):
        routing(recall=1.5)


def test_group_route_sends_whole_groups_with_a_flag():
    from types import SimpleNamespace as NS

    from rhlab.interventions.routing import routing

    hack = [False, True, False, False, False, False, False, False, True, True, False, False]
    trainer = NS(cfg=NS(seed=0, train=NS(num_generations=4)), step=1)
    batch = NS(prompts=[p for p in "abc" for _ in range(4)], completions=[""] * 12,
               scores=NS(hack=hack), extra={})
    iv = routing(route="group")
    iv.on_scored(trainer, batch)
    assert batch.extra["routing_flag"].tolist() == [True] * 4 + [False] * 4 + [True] * 4
    m = iv.metrics()
    assert m["overseer/flag_rate"] == 0.25 and m["routing/routed_frac"] == pytest.approx(8 / 12)
    assert m["overseer/recall"] == 1.0 and m["overseer/precision"] == 1.0 and m["overseer/disagree"] == 0.0
    routing().on_scored(trainer, batch)  # route=completion: the flags themselves
    assert batch.extra["routing_flag"].tolist() == hack
    with pytest.raises(ValueError, match="route"):
        routing(route="prompt")


def test_detector_from_registry_and_logged_oversight(tmp_path):
    # the overseer flags with happy_prefix (any "happy" in the first 8 words, at recall 1 and fpr 0: the
    # detector itself); the env's flag (happy_density >= 3) is what the stats are measured against
    from rhlab.envs.stories import happy_prefix

    from types import SimpleNamespace as NS

    from rhlab.envs.stories import happy_prefix

    t = _trainer(tmp_path, "{detector: happy_prefix, detector_params: {min_count: 1, prefix_words: 8}}")
    t.step = 1
    row, batch = t.train_step(1)
    mine = torch.tensor(happy_prefix(1, 8)(batch.prompts, batch.completions))
    env = torch.tensor(batch.scores.hack)
    assert torch.equal(batch.extra["routing_flag"], mine)
    assert row["overseer/base_flag_rate"] == row["overseer/flag_rate"] == pytest.approx(float(mine.float().mean()))
    assert row["overseer/env_hack_rate"] == pytest.approx(float(env.float().mean()))
    assert row["overseer/disagree"] == pytest.approx(float((mine != env).float().mean()))
    # by hand: the prefix detector misses a late hack and flags an early single "happy"
    comps = ["happy happy happy.", "a b c d e f g h happy happy happy.", "mia was happy.", "mia ran."]
    hand = NS(prompts=["p"] * 4, completions=comps, scores=NS(hack=[True, True, False, False]), extra={})
    t.intervention.on_scored(NS(cfg=NS(seed=0, train=NS(num_generations=4)), step=1), hand)
    assert hand.extra["routing_flag"].tolist() == [True, False, True, False]
    m = t.intervention.metrics()
    assert (m["overseer/disagree"], m["overseer/recall"], m["overseer/fpr"], m["overseer/precision"]) == (0.5,) * 4
    with pytest.raises(ValueError, match="unknown hack detector"):
        _trainer(tmp_path, "{detector: nope}")
    with pytest.raises(ValueError, match="model.lora.enabled=false"):
        _trainer(tmp_path, "{}", "model.lora.enabled=true")


# ---- evaluation modes, checkpoints, resume -----------------------------------------------
@pytest.mark.slow
def test_eval_modes_in_eval_files_summary_and_rhlab_eval(tmp_path):
    from rhlab.eval.evaluate import evaluate_checkpoint

    t = _trainer(tmp_path, "{}", "train.steps=2", "log.eval_every=1")
    summary = t.train()
    final = summary["final"]
    for mode in ("both", "retain_only", "forget_only"):
        for k in ("reward_mean", "task_score", "hack_rate", "distinct_2", "jaccard"):
            assert f"{mode}/{k}" in final, f"{mode}/{k}"
    assert final["both/reward_mean"] == final["reward_mean"]  # same prompts, seed and scales
    assert "eval/retain_only/hack_rate" in read_jsonl(t.dir / "metrics.jsonl")[0]
    assert dual_lora.get_scales(t.model) == (1.0, 1.0)  # restored after the ablations
    from typer.testing import CliRunner

    from rhlab.cli import app
    from rhlab.report.routing_table import routing_table

    table = routing_table([tmp_path])
    assert [ln.split("|")[2].strip() for ln in table.splitlines()[2:]] == ["-", "both", "retain_only", "forget_only"]
    res = CliRunner().invoke(app, ["report", str(tmp_path), "--out", str(tmp_path / "rep"), "--table", "routing"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "rep" / "routing_table.md").read_text() == table + "\n"  # the registered table, by name
    m, _, _ = evaluate_checkpoint(t.dir, n_prompts=4)
    assert m["retain_only/task_score"] == pytest.approx(final["retain_only/task_score"])
    assert m["forget_only/hack_rate"] == pytest.approx(final["forget_only/hack_rate"])


def test_ablations_change_generations_once_adapters_are_trained(tmp_path):
    t = _trainer(tmp_path, "{}")
    _perturb_B(t.model)
    with torch.no_grad():  # make the forget adapter large so ablating it must change the samples
        for m in dual_lora.dual_modules(t.model):
            m.forget_B.mul_(40)
    ev = t.intervention.extra_evals(t)
    assert set(ev) == {"both", "retain_only", "forget_only"}
    assert ev["both"]["distinct_2"] != ev["retain_only"]["distinct_2"]


@pytest.mark.slow
def test_adapters_save_load_and_resume_exactly(tmp_path):
    from rhlab.models import checkpoint as ckpt

    params = "{mode: classic, false_positive_rate: 0.3}"
    args = ["train.steps=3", "log.save_every=2", "log.eval_every=0"]
    full = _trainer(tmp_path / "a", params, *args)
    full.train()
    ref_rows = read_jsonl(full.dir / "metrics.jsonl")
    saved = ckpt.trainable_state(full.model)
    assert len(saved) == 4 * 7 * 4 and all(k.split(".")[-1].startswith(("retain_", "forget_")) for k in saved)
    for which in ("retain_B", "forget_B"):  # both adapters trained (B starts at zero)
        assert any(v.abs().sum() > 0 for k, v in saved.items() if k.endswith(which)), which
    # load into a fresh model: every adapter weight comes back
    fresh = _trainer(tmp_path / "a", params, *args)
    ckpt.load_weights(fresh.model, full.dir / "checkpoints" / "step_00003")
    for n, p in fresh.model.named_parameters():
        assert torch.equal(p, dict(full.model.named_parameters())[n]), n

    # a run that dies after its step-2 checkpoint resumes to the same numbers
    crashing = _trainer(tmp_path / "b", params, *args)
    real_step = crashing.train_step

    def die_at_3(step):
        if step == 3:
            raise KeyboardInterrupt
        return real_step(step)
    crashing.train_step = die_at_3
    with pytest.raises(KeyboardInterrupt):
        crashing.train()
    _trainer(tmp_path / "b", params, *args).train()
    rows = read_jsonl(tmp_path / "b" / full.name / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for a, b in zip(rows, ref_rows):
        for k in ("reward_mean", "loss", "grad_norm", "overseer/flag_rate", "overseer/env_hack_rate"):
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-7), (a["step"], k)


def test_routing_configs_and_sweep_validate():
    from rhlab.sweep.grid import expand, load_sweep

    base = load_config(CONFIGS / "routing_baseline.yaml")
    classic = load_config(CONFIGS / "routing_classic.yaml")
    group = load_config(CONFIGS / "routing_group.yaml")
    assert base.model.lora.enabled and base.intervention.name == "vanilla"
    p = classic.intervention.params
    assert classic.intervention.name == "routing" and not classic.model.lora.enabled
    # fair capacity: one LoRA of rank retain + forget with the same alpha / r
    assert base.model.lora.r == p["retain_rank"] + p["forget_rank"]
    assert base.model.lora.alpha / base.model.lora.r == p["retain_alpha"] / p["retain_rank"] \
        == p["forget_alpha"] / p["forget_rank"]
    for key in ("train", "sampling", "env"):
        assert getattr(base, key) == getattr(classic, key) == getattr(group, key), key
    assert group.intervention.params == {**p, "route": "group"} and p["route"] == "completion"
    runs = expand(*load_sweep(CONFIGS / "sweep_routing.yaml"))
    assert len({r.seed for r in runs}) == 5
    assert {"lora_baseline", "routing_classic", "routing_group"} <= {r.arm for r in runs}

    def trained(cfg):  # what decides the trained model (a disabled LoRA's unused r / alpha aside)
        d = cfg.dump()
        for k in ("seed", "arm", "run_name", "output_dir", "threads"):
            d.pop(k)
        if not cfg.model.lora.enabled:
            d["model"].pop("lora")
        return d
    for arm, cfg in [("lora_baseline", base), ("routing_classic", classic), ("routing_group", group)]:
        run = next(r for r in runs if r.arm == arm)
        assert trained(run.config) == trained(cfg), f"sweep arm {arm} drifted from its config file"


def test_advantage_split_by_hand():
    from rhlab.interventions.routing import advantage_split

    # two groups of 3; group 1 has one routed completion (adv +2), its two unrouted members -1 each
    adv = torch.tensor([2.0, -1.0, -1.0, 0.5, -0.5, 0.0])
    routed = torch.tensor([True, False, False, False, False, False])
    s = advantage_split(adv, routed, group=3)
    assert s["routing/adv_routed"] == 2.0
    assert s["routing/adv_unrouted"] == pytest.approx((-1 - 1 + 0.5 - 0.5 + 0) / 5)
    assert s["routing/adv_unrouted_in_routed_groups"] == -1.0
    assert s["routing/unrouted_in_routed_groups_frac"] == pytest.approx(2 / 6)
    assert s["routing/unrouted_negative_frac"] == pytest.approx(3 / 5)
    assert math.isnan(advantage_split(adv, torch.zeros(6, dtype=torch.bool), 3)["routing/adv_routed"])
    # the env flags completions 0 (routed), 3 and 4 (missed): the hack signal that reaches retain
    s = advantage_split(adv, routed, 3, [True, False, False, True, True, False])
    assert s["routing/unrouted_hack_frac"] == pytest.approx(2 / 6)
    assert s["routing/adv_unrouted_hacks"] == pytest.approx((0.5 - 0.5) / 2)
    assert math.isnan(advantage_split(adv, routed, 3, [True] + [False] * 5)["routing/adv_unrouted_hacks"])
