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
