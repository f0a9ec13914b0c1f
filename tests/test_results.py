"""Doc tables are generated from the committed artifacts in results/ (rhlab.report.results)."""

import json
import shutil

import pytest

from rhlab.report.results import BLOCK, ROOT, arms_block, demo_block, doc_files, render, sync_docs
from rhlab.report.runs import ReportError


def test_every_doc_block_is_current():
    stale = sync_docs(check=True)
    assert not stale, "stale results blocks (run `make docs`): " + "; ".join(stale)


def test_blocks_exist_and_name_their_artifacts():
    specs = [m["spec"] for doc in doc_files() for m in BLOCK.finditer(doc.read_text())]
    assert "demo results/demo" in specs
    for spec in specs:
        assert (ROOT / spec.split()[1]).exists(), spec


def test_an_edited_artifact_changes_its_table(tmp_path):
    shutil.copytree(ROOT / "results" / "demo", tmp_path / "demo")
    before = demo_block(tmp_path / "demo")
    s = tmp_path / "demo" / "seed3" / "summary.json"
    summary = json.loads(s.read_text())
    summary["final"]["task_score"] += 0.1
    s.write_text(json.dumps(summary))
    assert demo_block(tmp_path / "demo") != before


def test_unknown_kind_and_bad_options_fail_loudly():
    with pytest.raises(ReportError, match="unknown kind 'nope'; allowed: arms"):
        render("nope results/demo")
    with pytest.raises(ReportError, match="expected key=value"):
        render("arms results/demo hack_rate")


def test_an_edited_run_artifact_changes_the_arm_and_overopt_tables(tmp_path, monkeypatch):
    import rhlab.report.results as results

    monkeypatch.setattr(results, "ROOT", tmp_path)
    shutil.copytree(ROOT / "results" / "pref_overopt", tmp_path / "exp")
    spec = "arms exp metrics=hack_rate,task_score reference=rm1000_beta0"
    before, fits = render(spec), render("overopt exp")
    assert "| rm250_beta0 | 5 |" in before and "Welch 95 % interval" in before
    run = next(p for p in (tmp_path / "exp" / "runs").iterdir() if p.name.endswith("beta0.05_lr4e-4_schedconstant_g8_steps150_s1"))
    s = json.loads((run / "summary.json").read_text())
    s["final"]["hack_rate"] = 0.99
    (run / "summary.json").write_text(json.dumps(s))
    assert render(spec) != before
    rows = (run / "metrics.jsonl").read_text().splitlines()
    last = json.loads(rows[-1])
    last["reward/gold"] -= 1.0
    (run / "metrics.jsonl").write_text("\n".join(rows[:-1] + [json.dumps(last)]) + "\n")
    assert render("overopt exp") != fits
