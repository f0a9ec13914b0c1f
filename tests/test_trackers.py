"""Optional trackers, each for real: tensorboard event files, wandb offline runs, trackio's local store;
and a failing tracker never kills a run."""

import pytest

from rhlab.config import load_config
from rhlab.tracking import Trackers
from rhlab.trainer import Trainer

SMALL = ["train.batch_size=4", "train.num_generations=2", "sampling.max_new_tokens=8", "train.steps=2",
         "log.eval_prompts=2", "log.progress=false", "threads=1"]


def _run(tmp_path, tracker):
    cfg = load_config(None, [f"output_dir={tmp_path}", *SMALL, f"log.report_to=[{tracker}]"])
    t = Trainer(cfg)
    t.train()
    return t.dir


@pytest.mark.slow
def test_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    d = _run(tmp_path, "tensorboard")
    acc = EventAccumulator(str(d / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("reward_mean")] == [1, 2]
    assert "eval/hack_rate" in acc.Tags()["scalars"]


@pytest.mark.slow
def test_wandb_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    d = _run(tmp_path, "wandb")
    runs = list((d / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), "no offline run file written"


@pytest.mark.slow
def test_trackio_local(tmp_path, monkeypatch):
    pytest.importorskip("trackio")
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio_store"))
    import trackio.utils

    monkeypatch.setattr(trackio.utils, "TRACKIO_DIR", tmp_path / "trackio_store", raising=False)
    d = _run(tmp_path, "trackio")
    import trackio.sqlite_storage as store

    metrics = store.SQLiteStorage.get_logs(project=d.parent.name, run=d.name)
    steps = [m["step"] for m in metrics if "reward_mean" in m]
    assert steps == [1, 2]


def test_a_failing_tracker_is_switched_off_not_fatal(tmp_path, capsys):
    class Boom:
        def log(self, row, step):
            raise RuntimeError("disk full")

        def close(self):
            pass

    tr = Trackers([], tmp_path, "x", {})
    tr.active["boom"] = Boom()
    tr.log({"reward_mean": 1.0}, 1)
    assert "boom" not in tr.active and "disk full" in capsys.readouterr().err
    with pytest.raises(ValueError, match="allowed: tensorboard, wandb, trackio"):
        Trackers(["mlflw"], tmp_path, "x", {})
