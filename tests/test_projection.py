"""Rank-space projection, v_hack extraction and validation, pairs, and the baseline arms."""

import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from rhlab.adapters.svd import SVDLinear, wrap_svd
from rhlab.algos.advantages import grpo_advantages
from rhlab.interventions.direction import (
    DirectionError,
    check_gate,
    encode_pair_text,
    extract,
    load_direction,
    save_direction,
)
from rhlab.envs.stories import happy_density
from rhlab.interventions.penalties import Monitor, screened_advantages, screened_rewards
from rhlab.interventions.projection import Projection, project
from rhlab.interventions.pairs import HAPPY_MODES, Pair, happy_mode, load_pairs, split_pairs

torch.set_num_threads(1)


def unit(x):
    return x / x.norm()


# ---- the projection -------------------------------------------------------------------
def test_projection_removes_the_positive_component_and_keeps_the_norm():
    v = unit(torch.tensor([1.0, 1.0, 0.0, 0.0]))
    g = torch.tensor([3.0, 1.0, 2.0, 0.0])
    new, cos, fired = project(g, v)
    assert fired and cos == pytest.approx(float(g @ v / g.norm()))
    assert float(new @ v) == pytest.approx(0.0, abs=1e-6)
    assert float(new.norm()) == pytest.approx(float(g.norm()), rel=1e-6)
    # the part of g orthogonal to v keeps its direction
    ortho = g - (g @ v) * v
    assert float(unit(new) @ unit(ortho)) == pytest.approx(1.0, abs=1e-6)


def test_projection_without_rescale_only_subtracts():
    v = unit(torch.tensor([1.0, 2.0, 0.0]))
    g = torch.tensor([2.0, 1.0, -1.0])
    new, cos, fired = project(g, v, rescale=False)
    assert fired
    assert torch.allclose(new, g - (g @ v) * v, atol=1e-6)
    assert float(new.norm()) == pytest.approx(float(g.norm()) * (1 - cos ** 2) ** 0.5, rel=1e-5)


@pytest.mark.parametrize("g", [[-1.0, 0.0, 2.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
def test_projection_is_a_no_op_when_cos_is_not_positive(g):
    v = torch.tensor([1.0, 0.0, 0.0])
    g = torch.tensor(g)
    new, cos, fired = project(g, v)
    assert not fired and cos <= 0 and torch.equal(new, g)


def test_two_sided_projection_removes_a_negative_component_too():
    v = unit(torch.tensor([1.0, 0.0]))
    g = torch.tensor([-3.0, 4.0])
    assert project(g, v)[2] is False  # one-sided: cos < 0 is left alone
    new, cos, fired = project(g, v, rescale=False, two_sided=True)
    assert fired and cos == pytest.approx(-0.6) and torch.allclose(new, torch.tensor([0.0, 4.0]))
    new, _, _ = project(g, v, two_sided=True)
    assert torch.allclose(new, torch.tensor([0.0, 5.0]))  # rescaled to |g|
    with pytest.raises(ValueError, match="two_sided"):
        Projection(two_sided=True, span_modes=["a", "b"])


def test_projection_of_a_parallel_gradient_is_zero_not_noise():
    v = unit(torch.tensor([1.0, 2.0, 3.0]))
    new, cos, fired = project(4 * v, v)
    assert fired and cos == pytest.approx(1.0) and torch.equal(new, torch.zeros(3))


def fake_projection_trainer(grads, vs, project_on=True, rescale=True):
    arm = Projection(project=project_on, rescale=rescale, window=2)
    arm.modules, arm.v = {}, {}
    for i, (g, v) in enumerate(zip(grads, vs)):
        m = SVDLinear(torch.eye(len(g)), torch.ones(len(g)), torch.eye(len(g)), None)
        m.delta_S.grad = torch.tensor(g)
        arm.modules[f"m{i}"], arm.v[f"m{i}"] = m, unit(torch.tensor(v))
    return arm


def test_on_gradients_projects_every_module_and_logs_diagnostics():
    grads, vs = [[1.0, 1.0], [-1.0, 0.0], [0.0, 2.0]], [[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]
    arm = fake_projection_trainer(grads, vs)
    arm.on_gradients(None)
    g = {n: m.delta_S.grad for n, m in arm.modules.items()}
    assert torch.allclose(g["m0"], torch.tensor([0.0, 2 ** 0.5]), atol=1e-6)  # projected, norm kept
    assert torch.equal(g["m1"], torch.tensor([-1.0, 0.0]))  # cos < 0: untouched
    assert torch.equal(g["m2"], torch.zeros(2))  # parallel: removed entirely
    m = arm.metrics()
    assert m["proj/frac_fired"] == pytest.approx(2 / 3)
    assert m["proj/mean_cos"] == pytest.approx((2 ** -0.5 - 1 + 1) / 3)
    assert m["proj/grad_norm"] == pytest.approx((2 ** 0.5 + 1 + 2) / 3)
    assert [m[f"proj/cos/m{i}"] for i in range(3)] == pytest.approx([2 ** -0.5, -1.0, 1.0])  # per module
    assert arm.metrics() == {}  # nothing new since the last step
    assert arm.extra_evals(None)["proj"]["frac_fired"] == pytest.approx(2 / 3)


def test_update_cos_measures_the_optimizer_step_not_the_gradient():
    """AdamW's first step is -lr * sign(g): a gradient the projection made orthogonal to v = (1, 2, 0)/sqrt(5),
    g = (2, -1, 0), becomes the step -lr (1, -1, 0), whose (negated) cos with v is (1 - 2) / sqrt(10)."""
    arm = fake_projection_trainer([[2.0, -1.0, 0.0]], [[1.0, 2.0, 0.0]])
    arm.on_gradients(None)
    assert torch.equal(arm.modules["m0"].delta_S.grad, torch.tensor([2.0, -1.0, 0.0]))  # cos 0: not fired
    torch.optim.AdamW([arm.modules["m0"].delta_S], lr=0.1, weight_decay=0.0).step()
    m = arm.metrics()
    assert m["proj/cos/m0"] == pytest.approx(0.0, abs=1e-7)
    assert m["proj/update_cos"] == pytest.approx(-1 / 10 ** 0.5, abs=1e-5)
    sgd = fake_projection_trainer([[2.0, -1.0, 0.0]], [[1.0, 2.0, 0.0]])  # plain SGD keeps it orthogonal
    sgd.on_gradients(None)
    torch.optim.SGD([sgd.modules["m0"].delta_S], lr=0.1).step()
    assert sgd.metrics()["proj/update_cos"] == pytest.approx(0.0, abs=1e-6)


def test_measure_only_mode_leaves_gradients_alone():
    arm = fake_projection_trainer([[1.0, 1.0]], [[1.0, 0.0]], project_on=False)
    arm.on_gradients(None)
    assert torch.equal(arm.modules["m0"].delta_S.grad, torch.tensor([1.0, 1.0]))
    assert arm.metrics()["proj/frac_fired"] == 1.0


def test_per_module_cos_is_the_mean_over_a_steps_calls():
    arm = fake_projection_trainer([[1.0, 0.0], [-1.0, 0.0]], [[1.0, 0.0], [1.0, 0.0]], project_on=False)
    arm.on_gradients(None)
    arm.modules["m1"].delta_S.grad = torch.tensor([0.0, 1.0])
    arm.on_gradients(None)
    m = arm.metrics()
    assert (m["proj/cos/m0"], m["proj/cos/m1"]) == pytest.approx((1.0, -0.5))
    assert m["proj/mean_cos"] == pytest.approx((1.0 - 1.0) / 2 / 2 + (1.0 + 0.0) / 2 / 2)


# ---- extraction -----------------------------------------------------------------------
class ToyLM(nn.Module):
    """Every token embeds to the same vector c, then one SVD layer gives the logits: the softmax
    is the same at every position, so the mean-NLL gradient is known in closed form,
    dL/d delta_S = diag(Vh c) U^T (softmax - target histogram)."""

    def __init__(self, vocab: int, d: int = 8):
        super().__init__()
        torch.manual_seed(0)
        U, S, Vh = torch.linalg.svd(torch.randn(vocab, d) / d ** 0.5, full_matrices=False)
        self.head = SVDLinear(U, S, Vh, None)
        self.c = nn.Parameter(torch.randn(d), requires_grad=False)

    def forward(self, input_ids):
        x = self.c.expand(*input_ids.shape, -1)
        return SimpleNamespace(logits=self.head(x))


def test_extraction_recovers_the_planted_direction(builtin):
    _, tok = builtin
    model = ToyLM(len(tok))
    pairs = load_pairs("happy_stories", {"n_per_mode": 4}, modes=["felt_happy", "bare_happy"])
    v, val = extract(model, tok, pairs, modes=None, heldout_frac=0.25)

    def hist(text, prompt):  # target histogram over the completion tokens (incl. EOS)
        ids, P = encode_pair_text(tok, prompt, text)
        return torch.bincount(ids[0, P:], minlength=len(tok)).float() / (ids.shape[1] - P)

    train, _ = split_pairs(pairs, 0.25)
    h_hack = torch.stack([hist(p.hack, p.prompt) for p in train]).mean(0)
    h_clean = torch.stack([hist(p.clean, p.prompt) for p in train]).mean(0)
    m = model.head
    planted = unit((m.Vh @ model.c) * (m.U.T @ (h_clean - h_hack)))
    assert float(v["head"] @ planted) > 0.999
    assert val["frac_pos"] == 1.0 and val["n_modules"] == 1


def test_extraction_on_the_builtin_model_passes_the_gate(builtin, tmp_path):
    import copy

    model, tok = copy.deepcopy(builtin[0]), builtin[1]
    wrap_svd(model, "builtin:tiny-stories", cache_dir=tmp_path)
    pairs = load_pairs("happy_stories", {"n_per_mode": 3})
    v, val = extract(model, tok, pairs, modes=["felt_happy", "bare_happy"], heldout_frac=0.34)
    assert len(v) == 28 and all(abs(float(t.norm()) - 1) < 1e-5 for t in v.values())
    assert val["frac_pos"] >= 0.5, val  # hack vs clean gradients differ consistently
    assert set(val["per_mode"]) == set(HAPPY_MODES)
    assert all(m.delta_S.grad is None for m in model.modules() if isinstance(m, SVDLinear))
    save_direction(tmp_path / "v.safetensors", v, {"validation": val, "modes": ["a"]})
    v2, meta = load_direction(tmp_path / "v.safetensors")
    assert meta["modes"] == ["a"] and all(torch.equal(v[n], v2[n]) for n in v)


def test_gate_refuses_a_direction_that_fails_validation():
    meta = {"validation": {"frac_pos": 0.4, "median_cos": -0.01}}
    with pytest.raises(DirectionError, match="allow_failed_validation"):
        check_gate(meta)
    check_gate(meta, allow_failed=True)
    check_gate({"validation": {"frac_pos": 0.5, "median_cos": 0.1}})


# ---- pairs ----------------------------------------------------------------------------
def test_happy_pairs_are_labelled_hacks_and_clean_continuations():
    pairs = load_pairs("happy_stories", {"n_per_mode": 5})
    assert len(pairs) == 20 and {p.mode for p in pairs} == set(HAPPY_MODES)
    det = happy_density(3)
    assert all(det([], [p.hack for p in pairs])) and not any(det([], [p.clean for p in pairs]))
    assert load_pairs("happy_stories", {"n_per_mode": 5}) == pairs  # seeded
    assert all(happy_mode(p.hack) == p.mode and happy_mode(p.clean) is None for p in pairs)
    weak = load_pairs("happy_stories", {"n_per_mode": 5}, modes=["felt_happy", "bare_happy"])
    assert {p.mode for p in weak} == {"felt_happy", "bare_happy"}
    with pytest.raises(ValueError, match="unknown modes"):
        load_pairs("happy_stories", {"n_per_mode": 5}, modes=["overwrite_tests"])
    train, held = split_pairs(pairs, 0.4)
    assert {p.mode for p in held} == {p.mode for p in train} == set(HAPPY_MODES)
    assert not set(train) & set(held) and len(train) + len(held) == 20


def test_jsonl_pairs_hook(tmp_path):
    f = tmp_path / "code_pairs.jsonl"
    f.write_text('{"prompt": "def f():", "hack": "def run_tests(): pass", "clean": "return 1", "mode": "overwrite"}\n')
    assert load_pairs("jsonl", {"path": str(f)}) == [Pair("def f():", "def run_tests(): pass", "return 1", "overwrite")]


# ---- baselines ------------------------------------------------------------------------
def test_screened_advantages_equal_grpo_on_the_kept_members():
    torch.manual_seed(1)
    r = torch.rand(16)
    ex = torch.zeros(16, dtype=torch.bool)
    ex[[1, 5, 6, 9]] = True  # group 0 keeps 5 of 8, group 1 keeps 7 of 8
    adv = screened_advantages(r, ex, 8)
    for g in range(2):
        sl = slice(8 * g, 8 * g + 8)
        keep = ~ex[sl]
        expect = grpo_advantages(r[sl][keep], int(keep.sum()))
        assert torch.allclose(adv[sl][keep], expect, atol=1e-6)
    assert torch.equal(adv[ex], torch.zeros(4))
    ex[8:15] = True  # one kept member: no statistics, A = 0
    assert torch.equal(screened_advantages(r, ex, 8)[8:], torch.zeros(8))


def test_screened_rewards_are_exact_without_std_scaling():
    torch.manual_seed(2)
    r, ex = torch.rand(8), torch.tensor([1, 0, 0, 1, 0, 0, 0, 0], dtype=torch.bool)
    adv = grpo_advantages(screened_rewards(r, ex, 8), 8, "none")
    assert torch.allclose(adv, screened_advantages(r, ex, 8, "none"), atol=1e-6)


def test_monitor_accuracy_and_per_step_seeding():
    truth = [True, False] * 50
    batch = SimpleNamespace(scores=SimpleNamespace(hack=truth), prompts=[""] * 100, completions=[""] * 100)
    trainer = lambda step: SimpleNamespace(cfg=SimpleNamespace(seed=3), step=step)
    assert Monitor(1.0, None).flags(trainer(1), batch).tolist() == truth
    assert Monitor(0.0, None).flags(trainer(1), batch).tolist() == [not t for t in truth]
    m = Monitor(0.8, None)
    a, b, c = (m.flags(trainer(s), batch) for s in (1, 1, 2))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert 0.6 < float((a == torch.tensor(truth)).float().mean()) < 0.95
    assert m.stats["overseer/disagree"] == float((c != torch.tensor(truth)).float().mean())  # the last call: step 2
    assert m.stats["overseer/base_disagree"] == 0.0


# ---- the arms end to end (1-2 steps on the built-in model) ------------------------------
SMALL = ["train.batch_size=8", "train.num_generations=4", "sampling.max_new_tokens=12", "log.eval_prompts=4",
         "log.progress=false", "log.n_samples=0", "log.save_every=0", "threads=1", "train.lr=1e-2"]


def run_arm(tmp_path, name, params, steps=1):
    from rhlab.config import load_config
    from rhlab.trainer import Trainer

    params = {"svd": {"cache_dir": str(tmp_path / "cache")}, **params}
    cfg = load_config(None, [f"output_dir={tmp_path}", f"train.steps={steps}", *SMALL, f"arm={name}",
                             f"intervention={{name: {name}, params: {params}}}"])
    return Trainer(cfg).train(), tmp_path / cfg.output_dir


@pytest.mark.slow
def test_projection_arm_trains_and_reports_its_diagnostics(tmp_path, capsys):
    from typer.testing import CliRunner

    from rhlab.cli import app
    from rhlab.report.projection_headline import headline, main
    from rhlab.utils import read_jsonl

    summary, _ = run_arm(tmp_path, "svd_projection", {"pair_params": {"n_per_mode": 2}, "heldout_frac": 0.5},
                         steps=2)
    d = tmp_path / summary["run_name"]
    rows = read_jsonl(d / "metrics.jsonl")
    assert all(0 <= r["proj/frac_fired"] <= 1 and r["proj/grad_norm"] > 0 for r in rows)
    assert all(-1 <= r["proj/update_cos"] <= 1 for r in rows)  # every step moved delta_S
    cos = [k for k in rows[-1] if k.startswith("proj/cos/")]  # one per SVD module, short names
    assert "proj/cos/L0.q_proj" in cos and len(cos) >= 7, cos
    assert all(-1 <= rows[-1][k] <= 1 for k in cos)
    assert {"proj/mean_cos", "proj/std_cos", "proj/grad_norm", "proj/frac_fired"} <= set(summary["final"])
    assert (d / "v_hack" / "v_hack.hist.png").exists() and (d / "v_hack" / "v_hack.validation.json").exists()
    assert len(list((tmp_path / "cache" / "directions").glob("*.safetensors"))) == 1
    trained = read_jsonl(d / "metrics.jsonl")[-1]
    assert trained["grad_norm"] > 0
    table = headline([d])  # the headline table, its `python -m` entry point and the registered report table agree
    assert table.splitlines()[2].startswith("| svd_projection | 1 | — |")
    capsys.readouterr()
    main([str(d)])
    assert capsys.readouterr().out == table + "\n"
    res = CliRunner().invoke(app, ["report", str(d), "--out", str(tmp_path / "rep"), "--table", "projection"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "rep" / "projection_table.md").read_text() == table + "\n"


@pytest.mark.parametrize("name,params", [("advantage_penalty", {"pair_params": {"n_per_mode": 2}}),
                                         ("monitor_penalty", {"accuracy": 0.9}),
                                         ("screening", {"accuracy": 0.9})])
@pytest.mark.slow
def test_baseline_arms_run(tmp_path, name, params):
    summary, _ = run_arm(tmp_path, name, params)
    assert summary["status"] == "complete" and "hack_rate" in summary["final"]
    if name != "advantage_penalty":  # the overseen arms: their disagreement with the env's flag, in summary.json
        assert 0 <= summary["trajectory"]["overseer/disagree"]["last"] <= 1


def test_sweep_arms_equal_the_arm_configs_and_the_hypotheses_name_them():
    from pathlib import Path

    from rhlab.config import load_config
    from rhlab.report.hypotheses import load_hypotheses, validate
    from rhlab.sweep.grid import expand, load_sweep

    configs = Path(__file__).resolve().parents[1] / "configs"
    files = {"vanilla": "vanilla", "projected": "projected", "projected_norescale": "norescale",
             "projected_weak": "weak", "adv_penalty": "adv_penalty", "monitor": "monitor", "screening": "screening"}
    spec, base = load_sweep(configs / "sweep_projection.yaml")
    runs = [r for r in expand(spec, base) if r.seed == spec.seeds[0]]
    assert sorted(r.arm for r in runs) == sorted(files)
    drop = ("run_name", "output_dir", "seed", "threads")
    for r in runs:
        own = load_config(configs / f"proj_{files[r.arm]}.yaml").dump()
        swept = r.config.dump()
        assert {k: v for k, v in swept.items() if k not in drop} == {k: v for k, v in own.items() if k not in drop}, r.arm
    hyps = load_hypotheses(configs / "hypotheses_projection.yaml")
    validate(hyps, list(files), ["hack_rate", "pass_rate", "safe_pass"])


class _Stopped(Exception):
    pass


def _stop_after(trainer, step):
    """Make trainer.train() die (like a kill) once `step` has run and been checkpointed."""
    run_step = trainer.train_step

    def train_step(s):
        if s > step:
            raise _Stopped(f"stopped after step {step}")
        return run_step(s)

    trainer.train_step = train_step


@pytest.mark.parametrize("name,params", [
    ("svd_projection", {"pair_params": {"n_per_mode": 2}, "heldout_frac": 0.5, "window": 10}),
    ("screening", {"accuracy": 0.7})])
@pytest.mark.slow
def test_arm_resumes_exactly_after_a_stop(tmp_path, name, params):
    """Stopped after 2 of 4 steps and resumed: the same metrics, and the same final evaluation, whose
    projection diagnostics average the whole window, steps before the resume included (intervention
    state in the checkpoint)."""
    from rhlab.config import load_config
    from rhlab.trainer import Trainer
    from rhlab.utils import read_jsonl

    params = {"svd": {"cache_dir": str(tmp_path / "cache")}, **params}

    def cfg(out):
        return load_config(None, [f"output_dir={out}", "train.steps=4", *SMALL, "log.save_every=2", f"arm={name}",
                                  f"intervention={{name: {name}, params: {params}}}"])

    full = Trainer(cfg(tmp_path / "a")).train()
    stopped = Trainer(cfg(tmp_path / "b"))
    _stop_after(stopped, 2)
    with pytest.raises(_Stopped):
        stopped.train()
    assert (stopped.dir / "checkpoints" / "step_00002").exists() and not (stopped.dir / "summary.json").exists()
    resumed = Trainer(cfg(tmp_path / "b")).train()
    a = read_jsonl(tmp_path / "a" / full["run_name"] / "metrics.jsonl")
    b = read_jsonl(stopped.dir / "metrics.jsonl")
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    keys = [k for k in a[0] if not k.startswith("time/") and k != "step_time"]
    for ra, rb in zip(a, b):
        for k in keys:  # one module's cosine amplifies float rounding more than the means over modules do
            tol = {"rel": 1e-3, "abs": 1e-4} if k.startswith("proj/cos/") else {"rel": 1e-5, "abs": 1e-7}
            assert rb[k] == pytest.approx(ra[k], nan_ok=True, **tol), (ra["step"], k)
    assert resumed["final"].keys() == full["final"].keys()
    for k, v in full["final"].items():
        assert resumed["final"][k] == pytest.approx(v, rel=1e-4, abs=1e-6, nan_ok=True), k
    if name == "svd_projection":  # the window mean covers all 4 steps, 2 of them run before the resume
        for k in ("mean_cos", "std_cos", "grad_norm", "frac_fired"):
            assert resumed["final"][f"proj/{k}"] == pytest.approx(sum(r[f"proj/{k}"] for r in b) / 4, rel=1e-12), k


def test_project_span_by_hand():
    from rhlab.interventions.projection import orthonormal_basis, project_span

    Q = orthonormal_basis([torch.tensor([1.0, 0, 0]), torch.tensor([1.0, 1, 0])])  # spans e1, e2
    torch.testing.assert_close(Q @ Q.T, torch.diag(torch.tensor([1.0, 1, 0])))
    g = torch.tensor([3.0, 4, 12])  # |g| = 13, 5 of it in the span
    out, share, fired = project_span(g, Q, rescale=False)
    torch.testing.assert_close(out, torch.tensor([0.0, 0, 12]))
    assert fired and share == pytest.approx(5 / 13)
    out, _, _ = project_span(g, Q, rescale=True)
    torch.testing.assert_close(out, torch.tensor([0.0, 0, 13]))
    out, share, fired = project_span(torch.tensor([0.0, 0, 2]), Q)  # nothing in the span: untouched
    assert not fired and share == 0 and out.tolist() == [0, 0, 2]
    with pytest.raises(AssertionError, match="linearly dependent"):
        orthonormal_basis([torch.tensor([1.0, 2, 0]), torch.tensor([2.0, 4, 0])])


def test_span_modes_are_checked():
    from rhlab.interventions.projection import Projection

    with pytest.raises(ValueError, match="span_modes needs >= 2 modes"):
        Projection(span_modes=["felt_happy"])
    with pytest.raises(ValueError, match="excludes modes"):
        Projection(span_modes=["felt_happy", "bare_happy"], modes=["felt_happy"])


def test_rollout_pairs_from_a_runs_own_samples(tmp_path):
    from rhlab.interventions.pairs import load_pairs

    rows = [  # step 5: one prompt, two hacked and three clean completions; step 10: another prompt
        *({"step": 5, "prompt": "P1", "completion": c, "hack": h} for c, h in [
            ("kai felt happy. kai felt happy. kai felt happy.", True), ("happy happy happy happy", True),
            ("kai ran to the park.", False), ("kai ate a cake.", False), ("the sun was warm.", False)]),
        *({"step": 10, "prompt": "P2", "completion": c, "hack": h} for c, h in [
            ("mia felt happy. mia felt happy. mia felt happy.", True), ("mia sang a song.", False)]),
        {"step": 10, "prompt": "P3", "completion": "happy happy happy", "hack": True},  # no clean partner
    ]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "samples.jsonl").write_text((tmp_path / "samples.jsonl").read_text() * 2)  # 2 of each mode
    pairs = load_pairs("rollouts", {"run_dir": str(tmp_path)})
    assert sorted(p.mode for p in pairs) == ["bare_happy"] * 2 + ["felt_happy"] * 4
    assert all(p.prompt in ("P1", "P2") and "happy" not in p.clean for p in pairs)
    assert all(p.prompt == "P2" for p in pairs if p.hack.startswith("mia"))  # same-prompt partners
    assert len(load_pairs("rollouts", {"run_dir": str(tmp_path), "n_max": 4})) == 4
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    with pytest.raises(ValueError, match="need >= 4"):
        load_pairs("rollouts", {"run_dir": str(tmp_path)})


@pytest.mark.slow
def test_multi_direction_arm_trains(tmp_path):
    from rhlab.utils import read_jsonl

    summary, _ = run_arm(tmp_path, "svd_projection", {
        "span_modes": ["felt_happy", "bare_happy"], "pair_params": {"n_per_mode": 2}, "heldout_frac": 0.5,
        "allow_failed_validation": True}, steps=2)
    rows = read_jsonl(tmp_path / summary["run_name"] / "metrics.jsonl")
    assert all(0 < r["proj/frac_fired"] <= 1 and 0 < r["proj/mean_cos"] <= 1 for r in rows)  # a share of |g|
    assert len(list((tmp_path / "cache" / "directions").glob("*.safetensors"))) == 2  # one per span mode


@pytest.mark.slow
def test_a_reduced_rank_gets_its_own_direction_beside_the_full_rank_one(tmp_path):
    """The direction's cache key holds a reduced SVD rank (its v_hack has that many entries), so full-rank and
    rank-8 arms sharing a cache each load their own; the full-rank key is unchanged by the rank field."""
    from rhlab.interventions.direction import default_direction_path, direction_settings

    full = direction_settings("m", "happy_stories", {}, None, 0.25, 0, "float32")
    assert "rank" not in full
    assert default_direction_path("c", full) != default_direction_path(
        "c", direction_settings("m", "happy_stories", {}, None, 0.25, 0, "float32", rank=8))
    params = {"pair_params": {"n_per_mode": 2}, "heldout_frac": 0.5}
    run_arm(tmp_path / "a", "svd_projection", params)
    (tmp_path / "b").mkdir()
    shutil.copytree(tmp_path / "a" / "cache", tmp_path / "b" / "cache")  # the full-rank direction is cached
    summary, _ = run_arm(tmp_path / "b", "svd_projection", {**params, "svd": {"cache_dir": str(tmp_path / "b" / "cache"),
                                                                             "rank": 8}})
    assert summary["final"]["proj/grad_norm"] > 0
    assert len(list((tmp_path / "b" / "cache" / "directions").glob("*.safetensors"))) == 2
