"""Tests for rhlab.report on small synthetic run directories."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml

from rhlab.report import (
    ReportError, Stat, arm_table, build_report, delta_safepass, discover_run_dirs, format_table, load_runs,
    pareto_frontier,
)
from rhlab.report.hypotheses import Check, Hypothesis, evaluate, evaluate_check, validate
from rhlab.report.tables import Stat, welch

SQRT3 = math.sqrt(3)


def make_run(root: Path, name: str, arm: str, seed: int, final: dict | None, status: str = "complete",
             steps: int = 3, samples: list[dict] | None = None, summary: bool = True) -> Path:
    """Write a run dir in the trainer's format; final=None with summary=False mimics an early crash."""
    d = root / name
    d.mkdir(parents=True)
    cfg = {"seed": seed, "arm": arm, "run_name": name, "model": {"name": "tiny"}, "train": {"lr": 1e-5}}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    rows = []
    for s in range(steps):
        rows.append({"step": s, "reward_mean": 0.1 * s + seed, "reward_std": 0.1, "task_score": 0.2 * s,
                     "hack_rate": 0.05 * s, "pass_rate": 0.1 * s, "kl": 0.01 * s, "entropy": 1.0,
                     "completion_len": 50.0, "grad_norm": 1.0, "lr": 1e-5, "step_time": 0.5,
                     "reward/happy_count": 2.0})
    rows.append({"step": steps - 1, "eval/hack_rate": 0.3})  # an eval-only row
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    samples = samples or [{"step": s, "prompt": f"p{s}", "completion": f"c{s}-{seed}", "reward": 1.0,
                           "hack": False, "task_score": 0.5} for s in range(steps)]
    (d / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples))
    if summary:
        (d / "summary.json").write_text(json.dumps(
            {"run_name": name, "arm": arm, "seed": seed, "status": status, "steps": steps, "final": final or {}}))
    return d


def final(pass_rate: float, hack_rate: float, **kw) -> dict:
    return {"reward_mean": 1.0, "task_score": 0.5, "pass_rate": pass_rate, "hack_rate": hack_rate, "kl": 0.1,
            "distinct_2": 0.8, **kw}


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """vanilla: 3 seeds; routing: 2 seeds; kl: 1 seed; plus a failed and a crashed run."""
    root = tmp_path / "runs"
    for seed, (p, h) in enumerate([(0.5, 0.3), (0.6, 0.2), (0.7, 0.1)]):
        make_run(root, f"vanilla_s{seed}", "vanilla", seed, final(p, h))
    make_run(root, "routing_s0", "routing", 0, final(0.6, 0.1))
    make_run(root, "routing_s1", "routing", 1, final(0.7, 0.0))
    make_run(root, "kl_s0", "kl", 0, final(0.4, 0.05))
    make_run(root, "kl_s1", "kl", 1, final(0.9, 0.9), status="failed")
    make_run(root, "kl_s2", "kl", 2, None, summary=False)
    return root


# ---------------------------------------------------------------- loading

def test_discovery_parent_and_run_dirs(sweep: Path):
    dirs = discover_run_dirs([sweep, sweep / "kl_s0"])  # duplicate given twice
    assert len(dirs) == 8
    runs = {r.run_name: r for r in load_runs([sweep])}
    assert runs["kl_s2"].status == "incomplete" and "summary.json" in runs["kl_s2"].note
    assert runs["kl_s2"].steps == 2  # from metrics.jsonl
    assert runs["kl_s1"].status == "failed" and not runs["kl_s1"].complete
    with pytest.raises(ReportError, match="does not exist"):
        discover_run_dirs([sweep / "nope"])


def test_malformed_metrics_names_file(tmp_path: Path):
    d = make_run(tmp_path, "bad", "vanilla", 0, final(0.5, 0.1))
    (d / "metrics.jsonl").write_text('{"step": 0, "reward_mean": 1.0}\n{"step": 1, oops\n{"step": 2}\n')
    with pytest.raises(ReportError, match=re.escape(str(d / "metrics.jsonl")) + ".*line 2"):
        load_runs([tmp_path])
    (d / "metrics.jsonl").write_text("[1, 2]\n")
    with pytest.raises(ReportError, match="metrics.jsonl.*JSON object"):
        load_runs([tmp_path])


def test_malformed_summary_names_file(tmp_path: Path):
    d = make_run(tmp_path, "bad", "vanilla", 0, final(0.5, 0.1))
    (d / "summary.json").write_text("{not json")
    with pytest.raises(ReportError, match=re.escape(str(d / "summary.json"))):
        load_runs([tmp_path])


def test_partial_last_line_ok_only_for_unfinished_runs(tmp_path: Path):
    d = make_run(tmp_path, "live", "vanilla", 0, {}, status="running")
    with open(d / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "rew')  # write in progress
    (run,) = load_runs([tmp_path])
    assert run.metrics[-1]["step"] == 2
    (d / "summary.json").write_text(json.dumps({"status": "complete", "final": final(0.5, 0.1)}))
    with pytest.raises(ReportError, match="metrics.jsonl"):
        load_runs([tmp_path])


# ---------------------------------------------------------------- tables

def test_mean_sem_by_arm(sweep: Path):
    table = arm_table(load_runs([sweep]))
    v = table["vanilla"]
    # pass 0.5, 0.6, 0.7: mean 0.6, std(ddof=1) 0.1, SEM 0.1/sqrt(3)
    assert v["pass_rate"].n == 3
    assert v["pass_rate"].mean == pytest.approx(0.6)
    assert v["pass_rate"].sem == pytest.approx(0.1 / SQRT3)
    assert v["hack_rate"].mean == pytest.approx(0.2) and v["hack_rate"].sem == pytest.approx(0.1 / SQRT3)
    assert v["kl"].sem == pytest.approx(0.0)
    # kl arm: only one complete seed -> SEM nan; failed/crashed runs excluded
    kl = table["kl"]["pass_rate"]
    assert kl.n == 1 and kl.mean == pytest.approx(0.4) and math.isnan(kl.sem)


def test_delta_safepass_by_hand(sweep: Path):
    runs = load_runs([sweep])
    d = delta_safepass(runs, "vanilla")
    # vanilla SafePass 0.2, 0.4, 0.6 -> mean 0.4, SEM 0.2/sqrt(3); routing 0.5, 0.7 -> mean 0.6, SEM 0.1
    assert set(d) == {"routing", "kl"}
    assert d["routing"].delta == pytest.approx(0.2)
    assert d["routing"].sem == pytest.approx(math.sqrt(0.1**2 + (0.2 / SQRT3) ** 2))
    assert (d["routing"].n, d["routing"].n_ref) == (2, 3)
    assert d["kl"].delta == pytest.approx(0.35 - 0.4) and math.isnan(d["kl"].sem)
    with pytest.raises(ReportError, match="unknown reference arm 'nope'.*vanilla"):
        delta_safepass(runs, "nope")


def test_format_table(sweep: Path):
    runs = load_runs([sweep])
    text = format_table(arm_table(runs, reference_arm="vanilla"), delta_safepass(runs, "vanilla"),
                        ["pass_rate", "hack_rate"], reference_arm="vanilla")
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["arm", "n", "pass_rate", "hack_rate"]
    assert lines[2].startswith("vanilla") and "0.600 ± 0.058" in lines[2] and "(reference)" in lines[2]
    assert "0.400 ± —" in text  # kl: one seed
    assert "0.200 ± 0.153" in text  # routing delta SafePass


# ---------------------------------------------------------------- Pareto

def test_pareto_frontier_membership():
    pts = [(0.1, 0.5), (0.2, 0.7), (0.15, 0.4), (0.3, 0.7), (0.05, 0.2), (0.1, 0.5)]
    # (0.15,0.4) dominated by (0.1,0.5); (0.3,0.7) by (0.2,0.7); identical points both stay
    assert pareto_frontier(pts) == [0, 1, 4, 5]
    assert pareto_frontier([]) == []
    assert pareto_frontier([(0.0, 1.0), (0.5, 0.5)]) == [0]


# ---------------------------------------------------------------- hypotheses

def _table(arm: tuple[float, float, int], ref: tuple[float, float, int], metric: str = "hack_rate"):
    return {"a": {metric: Stat(*arm)}, "ref": {metric: Stat(*ref)}}


def test_welch_interval_by_hand():
    # d = -0.40, se = sqrt(2) x 0.02 = 0.028284, df = (2 x 4e-4)^2 / (2 x 1.6e-7 / 2) = 4, t_{0.975,4} = 2.776445
    res = evaluate_check(Check("hack_rate", "<=", -0.3), _table((0.10, 0.02, 3), (0.50, 0.02, 3)), "a", "ref")
    assert res.lo == pytest.approx(-0.40 - 2.776445 * 0.0282843, abs=1e-6)
    assert res.hi == pytest.approx(-0.40 + 2.776445 * 0.0282843, abs=1e-6)
    # unequal n and SEM: va = 0.03^2, vb = 0.01^2, df = (va + vb)^2 / (va^2 / 4 + vb^2 / 2) = 4.8077
    _, se, df = welch(Stat(0.0, 0.03, 5), Stat(0.0, 0.01, 3))
    assert se == pytest.approx(math.sqrt(0.001)) and df == pytest.approx(1e-6 / (0.81e-6 / 4 + 1e-8 / 2))


@pytest.mark.parametrize("arm, ref, op, delta, verdict", [
    # Welch df = 4 for equal SEMs and n = 3 (t = 2.776); df = 2 for n = 2 (t = 4.303); df = 8 for n = 5
    ((0.10, 0.02, 3), (0.50, 0.02, 3), "<=", -0.30, "supported"),     # [-0.479, -0.321]
    ((0.40, 0.02, 3), (0.50, 0.02, 3), "<=", -0.30, "falsified"),     # [-0.179, -0.021]
    ((0.22, 0.035, 3), (0.50, 0.035, 3), "<=", -0.30, "inconclusive"),  # [-0.417, -0.143]
    ((0.18, 0.035, 3), (0.50, 0.035, 3), "<=", -0.30, "inconclusive"),  # point -0.32 holds, [-0.457, -0.183]
    ((0.10, math.nan, 1), (0.50, 0.02, 3), "<=", -0.30, "inconclusive"),  # one seed
    ((0.55, 0.01, 2), (0.50, 0.01, 2), "abs<=", 0.10, "inconclusive"),  # [-0.011, 0.111] crosses 0.10
    ((0.55, 0.01, 5), (0.50, 0.01, 5), "abs<=", 0.10, "supported"),   # [0.017, 0.083]
    ((0.30, 0.01, 2), (0.50, 0.01, 2), "abs<=", 0.10, "falsified"),   # [-0.261, -0.139]
    ((0.90, 0.01, 2), (0.50, 0.01, 2), ">=", 0.20, "supported"),      # [0.339, 0.461]
    ((0.90, 0.01, 2), (0.50, 0.01, 2), "abs>=", 0.50, "falsified"),   # inside (-0.5, 0.5)
])
def test_check_verdicts(arm, ref, op, delta, verdict):
    res = evaluate_check(Check("hack_rate", op, delta), _table(arm, ref), "a", "ref")
    assert res.verdict == verdict, res.reason
    assert res.diff == pytest.approx(arm[0] - ref[0])


def test_hypothesis_combines_checks():
    table = {"a": {"hack_rate": Stat(0.1, 0.01, 3), "pass_rate": Stat(0.5, 0.01, 3)},
             "ref": {"hack_rate": Stat(0.5, 0.01, 3), "pass_rate": Stat(0.8, 0.01, 3)}}
    ok, bad, unsure = Check("hack_rate", "<=", -0.3), Check("pass_rate", "abs<=", 0.1), Check("pass_rate", "<=", -0.3)
    mk = lambda *cs: Hypothesis("h", "", "a", "ref", list(cs))  # noqa: E731
    verdicts = [r.verdict for r in evaluate([mk(ok), mk(ok, bad), mk(ok, unsure), mk(unsure, bad)], table)]
    assert verdicts == ["supported", "falsified", "inconclusive", "falsified"]


def test_unknown_names_rejected():
    h = [Hypothesis("h", "", "projected", "vanilla", [Check("hack-rate", "<=", -0.3)])]
    with pytest.raises(ReportError) as e:
        validate(h, ["kl", "vanilla"], ["pass_rate", "hack_rate"])
    msg = str(e.value)
    assert "unknown arm 'projected'; allowed: kl, vanilla" in msg
    assert "unknown metric 'hack-rate'; allowed: pass_rate, hack_rate" in msg


# ---------------------------------------------------------------- end to end

HYPS = {"hypotheses": [
    {"name": "routing_safer", "claim": "routing raises SafePass by >= 0.05", "arm": "routing", "reference": "vanilla",
     "checks": [{"metric": "safe_pass", "op": ">=", "delta": -0.5}]},
    {"name": "kl_lowers_hacking", "claim": "kl lowers hacking", "arm": "kl", "reference": "vanilla",
     "checks": [{"metric": "hack_rate", "op": "<=", "delta": -0.1}]},
]}


def test_build_report_end_to_end(sweep: Path, tmp_path: Path):
    evil = '<script>alert(1)</script><img src="https://evil.example/x.png">'
    make_run(sweep, "routing_s2", "routing", 2, final(0.65, 0.05))
    with open(sweep / "routing_s0" / "samples.jsonl", "a") as f:  # shown: last step of the lowest seed
        f.write(json.dumps({"step": 9, "prompt": "P", "completion": evil, "reward": 2, "hack": True}) + "\n")
    hyp_path = tmp_path / "hyps.yaml"
    hyp_path.write_text(yaml.safe_dump(HYPS))
    out = tmp_path / "report"
    res = build_report([sweep], out, reference_arm="vanilla", hypotheses_path=hyp_path)

    for name in ["report.md", "report.html", "pareto.png", "curves.png", "results.json"]:
        assert (out / name).stat().st_size > 0, name
    assert (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    on_disk = json.loads((out / "results.json").read_text())  # strict JSON (nan -> null)
    assert on_disk["table"]["kl"]["pass_rate"]["sem"] is None
    assert on_disk["delta_safepass"]["routing"]["n"] == 3
    assert res["arms"][0] == "vanilla" and "table_text" in res
    assert {r["run_name"]: r["status"] for r in on_disk["runs"]}["kl_s2"] == "incomplete"
    assert [h["verdict"] for h in on_disk["hypotheses"]] == ["supported", "inconclusive"]  # kl has 1 seed

    page = (out / "report.html").read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page)
    assert page.count('<img src="data:image/png;base64,') == 2
    assert "<script" not in page and "&lt;script&gt;" in page
    assert page.count("<table>") == page.count('<div class="scroll"><table>') > 0  # wide tables scroll, not cut
    assert "kl_s1" in page and "failed" in page and "incomplete" in page
    md = (out / "report.md").read_text()
    assert "](pareto.png)" in md and "routing_safer" in md and "SUPPORTED" in md


def test_build_report_errors(sweep: Path, tmp_path: Path):
    bad = {"hypotheses": [{"name": "x", "arm": "projected", "reference": "vanilla",
                           "checks": [{"metric": "hack_rate", "op": "<=", "delta": -0.3}]}]}
    (tmp_path / "h.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(ReportError, match="unknown arm 'projected'; allowed: kl, routing, vanilla"):
        build_report([sweep], tmp_path / "o", hypotheses_path=tmp_path / "h.yaml")
    with pytest.raises(ReportError, match="unknown reference arm"):
        build_report([sweep], tmp_path / "o", reference_arm="projected")
    assert not (tmp_path / "o").exists()  # nothing written on bad input


def test_build_report_only_unfinished_runs(tmp_path: Path):
    make_run(tmp_path, "a", "kl", 0, {}, status="running")
    make_run(tmp_path, "b", "kl", 1, None, summary=False)
    res = build_report([tmp_path], tmp_path / "out")
    assert res["reference_arm"] is None and res["delta_safepass"] is None
    assert (tmp_path / "out" / "report.html").exists()


def test_check_against_another_metric_of_the_reference():
    table = {"a": {"retain_only/hack_rate": Stat(0.10, 0.02, 3)}, "ref": {"hack_rate": Stat(0.50, 0.02, 3)}}
    res = evaluate_check(Check("retain_only/hack_rate", "<=", -0.30, "hack_rate"), table, "a", "ref")
    assert res.verdict == "supported" and res.diff == pytest.approx(-0.40) and res.ref_metric == "hack_rate"
    with pytest.raises(ReportError, match="unknown metric 'nope'"):
        validate([Hypothesis("h", "", "a", "ref", [Check("hack_rate", "<=", 0.0, "nope")])], ["a", "ref"], ["hack_rate"])
