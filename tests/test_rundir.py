"""The run-directory lock: one holder at a time, refusals name it, a dead holder's lock is taken over."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from rhlab.rundir import LOCK_NAME, RunDirBusy, RunDirLock
from rhlab.utils import read_jsonl

HOLD = ("import sys, time; from rhlab.rundir import RunDirLock; lock = RunDirLock(sys.argv[1]); "
        "print('held', flush=True); time.sleep(600)")


def test_second_lock_is_refused_naming_the_holder_until_released(tmp_path):
    first = RunDirLock(tmp_path / "run")
    assert (tmp_path / "run" / LOCK_NAME).read_text() == f"pid={os.getpid()} host={socket.gethostname()}\n"
    with pytest.raises(RunDirBusy, match=f"in use by pid {os.getpid()} on host {socket.gethostname()}"):
        RunDirLock(tmp_path / "run")
    first.release()
    assert (tmp_path / "run" / LOCK_NAME).read_text() == ""  # a clean release leaves no note
    with RunDirLock(tmp_path / "run") as again:
        assert again.held
    assert not again.held


def test_a_killed_holder_blocks_while_alive_and_is_taken_over_when_dead(tmp_path, capfd):
    d = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(d)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "held\n"
        with pytest.raises(RunDirBusy, match=f"in use by pid {proc.pid} on host"):
            RunDirLock(d)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    capfd.readouterr()
    lock = RunDirLock(d)  # the kernel dropped the dead process's lock; its note is reported
    assert f"locked by pid {proc.pid} on host {socket.gethostname()}, which is gone" in capfd.readouterr().err
    assert (d / LOCK_NAME).read_text().startswith(f"pid={os.getpid()} ")
    lock.release()


@pytest.mark.slow
def test_two_concurrent_trains_on_one_run_directory(tmp_path):
    """The second `rhlab train` on a directory in use exits 2 at once naming the holder; the first
    finishes alone: its metrics.jsonl holds steps 1..N exactly once."""
    steps = 30
    (tmp_path / "run.yaml").write_text("run_name: shared\n")  # the built-in model, a few tiny steps
    args = [sys.executable, "-m", "rhlab", "train", str(tmp_path / "run.yaml"), f"output_dir={tmp_path}",
            f"train.steps={steps}", "train.batch_size=4", "train.num_generations=2", "sampling.max_new_tokens=8",
            "log.eval_prompts=2", "log.save_every=0", "log.progress=false", "threads=1"]
    lock = tmp_path / "shared" / LOCK_NAME
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while not (lock.exists() and lock.read_text()):
        assert first.poll() is None and time.time() < deadline, "the first run never took the lock"
        time.sleep(0.05)
    second = subprocess.run(args, capture_output=True, text=True)
    running = first.poll() is None
    out, _ = first.communicate(timeout=600)
    assert running, "the first run ended before the second was refused: make it longer"
    assert second.returncode == 2, second.stderr
    assert second.stderr.strip().splitlines() == [
        f"error: run directory {tmp_path / 'shared'} is in use by pid {first.pid} on host {socket.gethostname()} "
        f"(lock {lock}); wait for that run to end, or use another run_name or output_dir"]
    assert "Traceback" not in second.stdout + second.stderr
    assert first.returncode == 0, out
    assert [r["step"] for r in read_jsonl(tmp_path / "shared" / "metrics.jsonl")] == list(range(1, steps + 1))
    assert lock.read_text() == ""


@pytest.mark.slow
def test_sigterm_says_where_and_the_same_command_resumes(tmp_path):
    """SIGTERM (as Ctrl-C) stops `rhlab train` with "interrupted at step N; resume with the same command";
    the same command resumes from the checkpoint, says so, and the run ends with steps 1..N once.
    Files are written with the user's umask (mkstemp and safetensors alone would make them 0600)."""
    from rhlab.utils import UMASK

    steps = 12
    (tmp_path / "run.yaml").write_text("run_name: r\n")
    args = [sys.executable, "-m", "rhlab", "train", str(tmp_path / "run.yaml"), f"output_dir={tmp_path}",
            f"train.steps={steps}", "train.batch_size=4", "train.num_generations=2", "sampling.max_new_tokens=8",
            "log.eval_prompts=2", "log.save_every=2", "log.progress=false", "threads=1"]
    d = tmp_path / "r"
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while not (d / "checkpoints" / "step_00002" / "state.json").exists():
        assert proc.poll() is None and time.time() < deadline, "run ended before it could be stopped"
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("interrupted at step ") and "; resume with the same command (it continues from the " \
                                                         "checkpoint at step " in line, err
    saved = int(line.rsplit("step ", 1)[1].rstrip(")"))
    assert saved >= 2 and saved % 2 == 0
    assert (d / LOCK_NAME).read_text() == ""  # released on the way out
    again = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert f"resuming from step {saved} " in again.stderr
    assert [r["step"] for r in read_jsonl(d / "metrics.jsonl")] == list(range(1, steps + 1))
    for f in ["config.yaml", "summary.json", f"checkpoints/step_{steps:05d}/weights.safetensors", "metrics.jsonl"]:
        assert (d / f).stat().st_mode & 0o777 == 0o666 & ~UMASK, f


def test_a_lock_never_released_explicitly_is_emptied_at_exit(tmp_path, capfd):
    code = "import sys; from rhlab.rundir import RunDirLock; lock = RunDirLock(sys.argv[1])"  # no release()
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], check=True)
    assert (tmp_path / "run" / LOCK_NAME).read_text() == ""
    RunDirLock(tmp_path / "run").release()
    assert "which is gone" not in capfd.readouterr().err  # a clean exit is not reported as a dead holder
