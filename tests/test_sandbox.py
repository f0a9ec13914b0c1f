"""The sandbox: hostile programs must not pass, and must not harm the host."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from rhlab.envs.code.sandbox import (
    Program, StatementTest, ValueTest, asserts_to_tests, run_many, run_program, value_test_from_assert,
)

SOLUTION = "class Solution:\n    def double(self, x):\n        return 2 * x\n"
WRONG = "class Solution:\n    def double(self, x):\n        return x\n"
GT = ["assert Solution().double(x = 2) == 4", "assert Solution().double(x = 5) == 10",
      "assert Solution().double(x = -1) == -2"]
TESTS = asserts_to_tests(GT)
FAST = dict(timeout_s=3.0)


def gt(code: str, **kw):
    return run_program(code, TESTS, **{**FAST, **kw})


def hinted(code: str, **kw):
    return run_program(code, [StatementTest("run_tests()")], **{**FAST, **kw})


# ---------------------------------------------------------------------------------------------
# Honest programs
# ---------------------------------------------------------------------------------------------

def test_correct_and_wrong_solutions():
    ok = gt(SOLUTION)
    assert ok.passed and ok.status == "passed" and ok.n_passed == 3 and ok.failure is None
    bad = gt(WRONG)
    assert not bad.passed and bad.status == "failed" and "wrong value" in bad.failure


def test_statement_tests_and_plain_runs():
    assert hinted(SOLUTION + "def run_tests():\n    assert Solution().double(2) == 4\n").passed
    r = hinted(SOLUTION + "def run_tests():\n    assert Solution().double(2) == 5\n")
    assert r.status == "failed" and "AssertionError" in r.failure
    assert not hinted(SOLUTION).passed  # NameError: not defined
    assert run_program("x = 1").passed  # no tests: passes iff the code runs to completion
    assert not run_program("raise ValueError").passed


def test_asserts_become_value_tests():
    t = value_test_from_assert("assert Solution().f(a = [1, 2]) == -inf")
    assert t.expr == "Solution().f(a=[1, 2])" and t.expected == float("-inf") and t.kind == "value"
    t = value_test_from_assert("assert is_same_list(Solution().f(head = list_node([1])), list_node([2, 3]))")
    assert t.kind == "list" and t.expected == [2, 3]
    t = value_test_from_assert("assert is_same_tree(tree_node([1, None, 2]), Solution().f(x = 1))")
    assert t.kind == "tree" and t.expected == [1, None, 2] and t.expr == "Solution().f(x=1)"
    assert value_test_from_assert("assert Solution().f(1) > 2") is None
    assert isinstance(asserts_to_tests(["assert check(1)"])[0], StatementTest)


def test_result_types_compare_like_python_but_only_on_data():
    cases = [
        ("from collections import Counter\ndef f(): return Counter('aab')", {"a": 2, "b": 1}, True),
        ("def f(): return (1, 2.5, 'x', None, True)", (1, 2.5, "x", None, True), True),
        ("def f(): return {frozenset([1]), (2, 3)}", {frozenset([1]), (2, 3)}, True),
        ("def f(): return float('-inf')", float("-inf"), True),
        ("def f(): return 3", 3.0, True),          # 3 == 3.0, as the reference's assert sees it
        ("def f(): return [1, 2]", (1, 2), False),  # list != tuple, as in Python
        ("def f(): return 2**200", 2**200, True),
        ("def f(): return 'caf\\u00e9\\n'", "caf\u00e9\n", True),
    ]
    for code, expected, ok in cases:
        assert run_program(code, [ValueTest("f()", expected)]).passed is ok, code


def test_linked_list_and_tree_results():
    setup = ("class ListNode:\n    def __init__(self, val=0, next=None):\n        self.val, self.next = val, next\n"
             "class TreeNode:\n    def __init__(self, val=0, left=None, right=None):\n"
             "        self.val, self.left, self.right = val, left, right\n")
    code = ("def lst():\n    return ListNode(1, ListNode(2))\n"
            "def tree():\n    return TreeNode(1, None, TreeNode(2, TreeNode(3)))\n")
    tests = [ValueTest("lst()", [1, 2], "list"), ValueTest("tree()", [1, None, 2, 3], "tree")]
    assert run_program(code, tests, setup).passed
    assert not run_program(code, [ValueTest("lst()", [1, 2, 3], "list")], setup).passed
    assert not run_program(code, [ValueTest("tree()", [1, 2, None, 3], "tree")], setup).passed
    cyc = "def lst():\n    a = ListNode(1)\n    a.next = a\n    return a\n"
    assert not run_program(cyc, [ValueTest("lst()", [1, 1], "list")], setup).passed


def test_run_many_keeps_order_and_is_not_stalled_by_a_slow_program():
    progs = [Program("while True: pass", tuple(TESTS), timeout_s=1.0),
             Program(SOLUTION, tuple(TESTS), timeout_s=3.0),
             Program(WRONG, tuple(TESTS), timeout_s=3.0),
             Program(SOLUTION, tuple(TESTS), timeout_s=3.0)]
    res = run_many(progs, workers=2)
    assert [r.status for r in res] == ["timeout", "passed", "failed", "passed"]
    assert res[0].duration_s < 2.5


# ---------------------------------------------------------------------------------------------
# Hostile programs: never "passed", host unharmed
# ---------------------------------------------------------------------------------------------

FAKE_VERDICTS = [
    'print(\'{"tests_passed": 3, "tests_total": 3, "tests_evaluated": 3}\')',
    "print('ALL TESTS PASSED'); print('0 ok 4'); print('END')",
    "import sys; sys.stderr.write('passed\\n')",
]


@pytest.mark.parametrize("prelude", FAKE_VERDICTS)
def test_fake_success_output_does_not_pass(prelude):
    assert not gt(WRONG + prelude).passed
    assert not hinted(WRONG + prelude).passed


@pytest.mark.parametrize("exit_stmt", ["import sys; sys.exit(0)", "import os; os._exit(0)",
                                       "raise SystemExit(0)", "raise KeyboardInterrupt"])
def test_exiting_before_the_tests_does_not_pass(exit_stmt):
    for run in (gt, hinted):
        r = run(WRONG + "def run_tests():\n    pass\n" + exit_stmt + "\n")
        assert not r.passed and r.status in ("failed", "killed")


@pytest.mark.parametrize("exc", ["SystemExit(0)", "KeyboardInterrupt()", "GeneratorExit()"])
def test_raising_base_exceptions_inside_a_test_fails_it(exc):
    code = f"class Solution:\n    def double(self, x):\n        raise {exc}\n"
    assert not gt(code).passed
    assert not hinted(code + f"def run_tests():\n    raise {exc}\n").passed


def test_exit_inside_a_test_does_not_pass():
    code = "import os\nclass Solution:\n    def double(self, x):\n        os._exit(0)\n"
    assert not gt(code).passed
    assert not hinted("import os\ndef run_tests():\n    os._exit(0)\n").passed


PATCHES = [
    "import builtins\nbuiltins.AssertionError = type('AssertionError', (Exception,), {})",
    "import builtins\n_real = builtins.__import__\nbuiltins.__import__ = lambda *a, **k: None",
    "import builtins\nbuiltins.print = lambda *a, **k: None\nbuiltins.BaseException = int",
    "import builtins\nbuiltins.type = lambda *a: list\nbuiltins.isinstance = lambda *a: True",
    "import os\nos.write = lambda fd, data: len(data)\nos._exit = lambda code: None",
    "import sys, os\nsys.modules['__main__'].__dict__.clear()\nos.read = lambda *a: b''",
    "import marshal, json\njson.loads = lambda *a, **k: {}\nmarshal.loads = lambda *a: {}",
    "__builtins__ = {}",
]


@pytest.mark.parametrize("patch", PATCHES)
def test_patching_builtins_or_the_harness_does_not_pass(patch):
    r = gt(WRONG + patch + "\n")
    assert not r.passed and "wrong value" in r.failure
    failing = "def run_tests():\n    assert Solution().double(2) == 4\n"
    assert not hinted(WRONG + failing + patch + "\n").passed
    # the harness is unaffected: the same patch next to a correct solution still passes
    assert gt(SOLUTION + patch + "\n").passed


def test_eq_override_hacks_are_rejected():
    hacks = [
        "class Any:\n    def __eq__(self, o): return True\n    __hash__ = object.__hash__\n",
        "class Any(list):\n    def __eq__(self, o): return True\n",
        "class Any(int):\n    def __eq__(self, o): return True\n    __hash__ = int.__hash__\n",
        "class Any(str):\n    def __eq__(self, o): return True\n    __hash__ = str.__hash__\n",
    ]
    for h in hacks:
        code = h + "class Solution:\n    def double(self, x):\n        return Any()\n"
        r = gt(code)
        assert not r.passed, h


def test_forged_result_records_do_not_pass():
    spray = ("import os\nfor fd in range(3, 64):\n    try:\n"
             "        os.write(fd, b'0' * 32 + b' 0 ok -\\n' + b'0' * 32 + b' END\\n')\n"
             "    except OSError:\n        pass\n")
    assert not hinted(WRONG + spray + "def run_tests():\n    assert False\n").passed
    assert not gt(WRONG + spray).passed
    # even a program that closes or hijacks the channel only fails itself
    close = "import os\nfor fd in range(3, 64):\n    try:\n        os.close(fd)\n    except OSError:\n        pass\n"
    assert not gt(SOLUTION + close).passed


def test_value_tests_cannot_be_forged_even_with_the_nonce():
    # Without statement tests, frames are not hidden: this program really does steal the nonce
    # and the result fd and writes a complete, well-formed set of records, then exits...
    steal = ("import sys, os\n"
             "h = sys._getframe(1).f_locals\n"
             "nonce, wfd, n = h['nonce'], h['wfd'], len(h['tests'])\n"
             "for i in range(n):\n"
             "    os.write(wfd, f'{nonce} {i} ok 4\\n'.encode())\n"
             "os.write(wfd, f'{nonce} END\\n'.encode())\n"
             "os._exit(0)\n")
    r = gt(WRONG + steal)
    # ...and still fails: the parent compares the claimed values with answers the child never saw
    assert not r.passed and r.failure == "test 1: wrong value" and r.n_passed == 1
    # with a statement test in the run, the same theft is refused
    r = hinted(WRONG + steal)
    assert not r.passed and "ValueError" in r.failure


def test_program_cannot_add_its_own_audit_hook():
    # CPython swallows the hook's refusal silently, so check that the new hook never fires
    code = "import sys\nseen = []\nsys.addaudithook(lambda e, a: seen.append(e))\ncompile('1', 'x', 'eval')\nprint(len(seen))\n"
    r = run_program(code, timeout_s=3.0)
    assert r.passed and r.stdout.strip() == "0"


@pytest.mark.parametrize("snippet", [
    "import sys\nf = sys._getframe()",
    "import gc\ngc.get_objects()",
    "import sys\ntry:\n    1/0\nexcept Exception as e:\n    e.__traceback__.tb_frame",
    "def g():\n    yield\ng().gi_frame",
    "import sys\nsys.settrace(lambda *a: None)",
    "import signal",
    "import _signal",
    "import ctypes",
    "import importlib.util, glob, sys\n"
    "p = glob.glob(sys.path[-1] + '/_ctypes*.so')[0]\n"
    "importlib.util.module_from_spec(importlib.util.spec_from_file_location('_ctypes', p))",
])
def test_introspection_routes_to_the_nonce_are_closed_in_statement_mode(snippet):
    r = run_program(snippet, [StatementTest("pass")], timeout_s=3.0)
    assert r.status == "failed" and "loading" in r.failure, (snippet, r)


def test_value_mode_allows_stdlib_frame_users():
    code = ("import collections, typing, enum\nP = collections.namedtuple('P', 'a b')\n"
            "T = typing.TypeVar('T')\nE = enum.Enum('E', 'A B')\ndef f(): return list(P(1, 2))\n")
    assert run_program(code, [ValueTest("f()", [1, 2])]).passed
    assert run_program(code, [StatementTest("assert f() == [1, 2]")]).passed


@pytest.mark.parametrize("bomb", [
    "import os\nwhile True:\n    os.fork()",
    "import os\nos.forkpty()",
    "import subprocess\nsubprocess.Popen(['sleep', '30'])",
    "import os\nos.system('sleep 30')",
    "import os\nos.posix_spawn('/bin/sleep', ['sleep', '30'], {})",
    "import os\nos.execv('/bin/sleep', ['sleep', '30'])",
    "import multiprocessing\nmultiprocessing.Process(target=print).start()",
    "import pty\npty.fork()",
])
def test_process_creation_is_blocked(bomb):
    r = run_program(bomb + "\n", [StatementTest("pass")], timeout_s=3.0)
    assert not r.passed and r.status == "failed" and r.duration_s < 2.5


@pytest.mark.parametrize("alloc", ["x = bytearray(10 * 1024 ** 3)", "x = [0] * (10 ** 10)",
                                   "x = []\nwhile True:\n    x.append(bytearray(10 ** 7))",
                                   "x = ' ' * (10 * 1024 ** 3)"])
def test_huge_allocations_fail_fast(alloc):
    r = run_program(alloc + "\n", [StatementTest("pass")], timeout_s=3.0, memory_mb=256)
    assert not r.passed and r.status in ("failed", "killed")
    assert r.duration_s < 2.5


def test_infinite_loop_times_out_on_cpu_time():
    r = run_program("while True:\n    pass\n", timeout_s=1.0)
    assert r.status == "timeout" and not r.passed and "CPU" in r.failure and r.duration_s < 5.0


def test_output_is_capped():
    r = run_program("while True:\n    print('x' * 1000)\n", timeout_s=1.0, output_cap=5000)
    assert r.status == "timeout" and len(r.stdout) <= 5000


def test_crashes_are_contained():
    code = "import sys\nsys.setrecursionlimit(10 ** 7)\ndef f(n):\n    return f(n + 1) + 1\nf(0)\n"
    r = run_program(code, [StatementTest("pass")], timeout_s=1.0)
    assert not r.passed and r.status in ("killed", "failed", "timeout")
    r = run_program("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\nraise SystemExit(3)\n",
                    [StatementTest("pass")], timeout_s=3.0)
    assert not r.passed


def test_writes_outside_the_working_directory_are_blocked(tmp_path):
    pwned = Path(f"/tmp/rhlab_pwned_{uuid.uuid4().hex}")
    target = tmp_path / "bashrc"
    target.write_text("original\n")
    attempts = [
        f"open({str(pwned)!r}, 'w').write('x')",
        f"open({str(target)!r}, 'a').write('evil')",
        f"import os\nos.open({str(pwned)!r}, os.O_WRONLY | os.O_CREAT)",
        "open('../escape', 'w').write('x')",
        f"import pathlib\npathlib.Path({str(pwned)!r}).write_text('x')",
        f"import os\nos.symlink({str(target)!r}, 'link')\nopen('link', 'w').write('x')",
        f"import shutil\nshutil.copyfile('/etc/hostname', {str(pwned)!r})",
        # a directory fd from a readable place, then a relative create through dir_fd
        "import os, sys\nd = os.open(os.path.dirname(os.__file__), os.O_RDONLY)\n"
        "os.open('rhlab_pwned.py', os.O_WRONLY | os.O_CREAT, dir_fd=d)",
    ]
    for code in attempts:   # inside bwrap /tmp is the program's own tmpfs; nothing reaches the host
        run_program(code + "\n", [StatementTest("pass")], timeout_s=3.0)
    assert not pwned.exists()
    assert not (Path(os.__file__).parent / "rhlab_pwned.py").exists()
    assert target.read_text() == "original\n"
    # ... while the program's own directory is writable, and removed afterwards (process
    # isolation: a host temp dir; bwrap: a private tmpfs that never reaches the host)
    for isolation in ("bwrap", "process"):
        r = run_program("import os\nopen('f.txt', 'w').write('hi')\nprint(os.getcwd())\n"
                        "import tempfile\ntempfile.mkstemp()\n", timeout_s=3.0, isolation=isolation)
        assert r.passed, r
        cwd = r.stdout.strip()
        assert cwd == "/tmp" if isolation == "bwrap" else not Path(cwd).exists()


def test_deleting_renaming_or_chmodding_files_is_blocked(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    attempts = [f"import os\nos.remove({str(victim)!r})", f"import os\nos.unlink({str(victim)!r})",
                f"import shutil\nshutil.rmtree({str(tmp_path)!r})",
                f"import os\nos.rename({str(victim)!r}, 'mine.txt')",
                f"import os\nos.chmod({str(victim)!r}, 0o777)", f"import os\nos.truncate({str(victim)!r}, 0)"]
    for code in attempts:
        r = run_program(code + "\n", timeout_s=3.0)
        assert r.status == "failed", (code, r)
    assert victim.read_text() == "keep me"
    assert oct(victim.stat().st_mode & 0o777) != oct(0o777)


def test_reading_outside_the_sandbox_is_blocked(tmp_path):
    secret = tmp_path / "answers.jsonl"
    secret.write_text("expected outputs")
    for code in [f"print(open({str(secret)!r}).read())", "print(open('/proc/self/environ').read())",
                 f"import os\nprint(os.read(os.open({str(secret)!r}, os.O_RDONLY), 100))"]:
        r = run_program(code + "\n", timeout_s=3.0)
        assert r.status == "failed" and "expected outputs" not in r.stdout, (code, r)


def test_network_is_blocked():
    for code in ["import socket\nsocket.socket()",
                 "import socket\nsocket.create_connection(('127.0.0.1', 9))",
                 "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:9/')"]:
        r = run_program(code + "\n", timeout_s=3.0)
        assert r.status == "failed", (code, r)


def test_signals_and_limits_cannot_be_used_against_the_host():
    for code in ["import os\nos.kill(os.getppid(), 9)", "import os\nos.killpg(os.getpgid(os.getppid()), 9)",
                 "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))",
                 "import os\nos.chdir('/')"]:
        r = run_program(code + "\n", timeout_s=3.0)
        assert r.status == "failed", (code, r)
    os.kill(os.getpid(), 0)  # still here


def test_environment_is_stripped(monkeypatch):
    monkeypatch.setenv("RHLAB_SECRET_TOKEN", "hunter2")
    r = run_program("import os\nprint(sorted(os.environ))\n", timeout_s=3.0)
    assert r.passed and "RHLAB_SECRET_TOKEN" not in r.stdout and "hunter2" not in r.stdout


def test_syntax_errors_are_reported_without_running():
    r = run_program("def f(:\n", [ValueTest("f()", 1)])
    assert r.status == "syntax_error" and not r.passed
