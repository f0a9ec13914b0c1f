"""Run untrusted, model-written Python in a separate, resource-limited process.

Layers (see docs/code_env.md for the threat model and its limits):
  * a fresh interpreter per program (no site, no user site, no cwd on sys.path, no bytecode
    writes), with an environment that carries none of the parent's variables;
  * rlimits set by the harness before any untrusted code runs: address space, CPU seconds,
    file size, process count (effective only for non-root users), no core files;
  * a wall-clock deadline enforced by the parent, which kills the whole process group;
  * a fresh temporary working directory, deleted afterwards;
  * an audit hook (which the program cannot remove) that refuses process creation, signals
    to other processes, sockets, ctypes, rlimit changes, writes outside the working
    directory and reads outside the standard library and the working directory;
  * a verdict the program cannot forge: for value tests (`assert EXPR == LITERAL`, the form of
    every ground-truth test) the child only reports the *value* of EXPR and the parent, which
    never sends the expected value, compares. Statement tests (`run_tests()`) can only report
    "ran without raising"; those records carry a per-run nonce and the harness blocks the
    introspection routes to it, which makes forging hard but not impossible.

Only the standard library is used.
"""

from __future__ import annotations

import ast
import json
import marshal
import math
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence, Union

from .isolation import HARNESS_MOUNT, bwrap_command, check_isolation, child_env, compiled_script, probe

STATUSES = ("passed", "failed", "timeout", "killed", "syntax_error", "error")

# -S no site, -s no user site, -P no script dir / cwd on sys.path, -B no .pyc writes, -u unbuffered
# so that a program's prints are not lost when it is killed.
_PY_FLAGS = ("-S", "-s", "-P", "-B", "-u")

_READ_CHUNK = 1 << 16
_MAX_RECORD_BYTES = 16 << 20  # more result bytes than this is an attack or a bug: fail the run
_MAX_LINE_BYTES = 4 << 20     # one test's reply
# The time limit is CPU seconds (RLIMIT_CPU, so a verdict does not depend on machine load); the
# wall clock only backs it up, for programs that sleep or block: WALL_FACTOR * limit + WALL_SLACK_S.
WALL_FACTOR, WALL_SLACK_S = 2.0, 5.0
_CPU_SIGNALS = (signal.SIGXCPU, signal.SIGKILL)   # what RLIMIT_CPU sends

_default_isolation: str = "bwrap"


def set_default_isolation(value: str) -> None:
    """The isolation of runs that do not name one (a run config's sandbox.isolation sets it)."""
    global _default_isolation
    _default_isolation = check_isolation(value)


def default_isolation() -> str:
    return _default_isolation


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ValueTest:
    """Passes iff `expr`, evaluated in the program's namespace, equals `expected`.

    `expected` stays in the parent. kind: "value" (plain data: None/bool/int/float/str/bytes/
    complex and list/tuple/set/frozenset/dict of those, compared with ==), "list" (a linked list
    of .val/.next nodes compared to a Python list, like is_same_list(x, list_node(L))) or "tree"
    (a binary tree of .val/.left/.right nodes compared to a level-order list, like
    is_same_tree(x, tree_node(L))).
    """
    expr: str
    expected: Any
    kind: str = "value"

    def __post_init__(self) -> None:
        assert self.kind in ("value", "list", "tree"), f"unknown ValueTest kind {self.kind!r}"


@dataclass(frozen=True)
class StatementTest:
    """Passes iff `code` runs to completion without raising (e.g. "run_tests()")."""
    code: str


SandboxTest = Union[ValueTest, StatementTest]


@dataclass(frozen=True)
class Program:
    code: str
    tests: tuple = ()
    setup: str = ""
    timeout_s: float = 5.0
    memory_mb: int = 512

    def key(self) -> str:
        """A hashable identity, so a batch can run identical programs once."""
        return repr((self.code, self.setup, self.timeout_s, self.memory_mb,
                     tuple((type(t).__name__, repr(t)) for t in self.tests)))


@dataclass
class SandboxResult:
    passed: bool
    status: str
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    n_tests: int = 0
    n_passed: int = 0
    failure: str | None = None  # first reason the run did not pass, for humans
    returncode: int | None = None

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


# --------------------------------------------------------------------------------------------
# Turning ground-truth asserts into value tests
# --------------------------------------------------------------------------------------------

_SAFE_NAMES = {"inf": math.inf, "nan": math.nan, "None": None, "True": True, "False": False}


def safe_literal(node: ast.AST) -> Any:
    """ast.literal_eval plus the names inf/nan (the setup code defines inf) and float('inf')."""
    if isinstance(node, ast.Name) and node.id in _SAFE_NAMES:
        return _SAFE_NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = safe_literal(node.operand)
        if type(v) not in (int, float, complex):
            raise ValueError("unary operator on a non-number")
        return -v if isinstance(node.op, ast.USub) else +v
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "float"
            and len(node.args) == 1 and not node.keywords and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)):
        return float(node.args[0].value)
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        items = [safe_literal(e) for e in node.elts]
        return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("dict unpacking is not a literal")
        return {safe_literal(k): safe_literal(v) for k, v in zip(node.keys, node.values)}
    return ast.literal_eval(node)


def _helper_call(node: ast.AST, name: str) -> ast.AST | None:
    """The literal argument of `name(<literal>)`, else None."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name
            and len(node.args) == 1 and not node.keywords):
        return node.args[0]
    return None


def value_test_from_assert(src: str) -> ValueTest | None:
    """`assert E == LIT`, `assert is_same_list(E, list_node(L))`, `assert is_same_tree(E,
    tree_node(L))` (either argument order) -> ValueTest; anything else -> None."""
    try:
        mod = ast.parse(src)
    except (SyntaxError, ValueError):
        return None
    if len(mod.body) != 1 or not isinstance(mod.body[0], ast.Assert):
        return None
    test = mod.body[0].test
    try:
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
            left, right = test.left, test.comparators[0]
            try:
                return ValueTest(ast.unparse(left), safe_literal(right))
            except (ValueError, TypeError, SyntaxError):
                return ValueTest(ast.unparse(right), safe_literal(left))
        if (isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and len(test.args) == 2
                and not test.keywords):
            kind, maker = {"is_same_list": ("list", "list_node"),
                           "is_same_tree": ("tree", "tree_node")}.get(test.func.id, (None, None))
            if kind is None:
                return None
            a, b = test.args
            for subject, other in ((a, b), (b, a)):
                lit = _helper_call(other, maker)
                if lit is not None:
                    values = safe_literal(lit)
                    if not isinstance(values, list):
                        return None
                    return ValueTest(ast.unparse(subject), values, kind)
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return None
    return None


def asserts_to_tests(asserts: Sequence[str]) -> list[SandboxTest]:
    """Value tests where the assert has a recognised form, statement tests otherwise."""
    return [value_test_from_assert(a) or StatementTest(a) for a in asserts]


# --------------------------------------------------------------------------------------------
# Decoding the child's value encoding (the child side lives in _HARNESS below)
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Linked:
    vals: tuple


@dataclass(frozen=True)
class _Tree:
    preorder: tuple  # ("V", val) per node and ("N",) per missing child


class _Mismatch(Exception):
    """The reply cannot equal the expected value (or is malformed, too large or too deep)."""


_MAX_NODES = 2_000_000   # JSON nodes one reply may make the parent look at


def _leaf(x: Any) -> Any:
    """A scalar of the child's encoding as a Python value; _Mismatch for anything else."""
    if x is None or type(x) in (bool, int, str):
        return x
    if type(x) is dict and len(x) == 1:
        (tag, v), = x.items()
        if type(v) is str:
            if tag == "f":
                return float(v)
            if tag == "c":
                return complex(v)
            if tag == "b":
                return bytes.fromhex(v)
    raise _Mismatch


def _tagged(x: Any, tag: str) -> list:
    if type(x) is dict and len(x) == 1 and type(x.get(tag)) is list:
        return x[tag]
    raise _Mismatch


def _hashable(x: Any, budget: list) -> Any:
    """A set element or dict key of the reply as a Python value (scalars, tuples, frozensets);
    only ever looked up in the trusted expected container, never hashed into a new one."""
    budget[0] -= 1
    if budget[0] < 0:
        raise _Mismatch
    if type(x) is dict and len(x) == 1 and ("t" in x or "fs" in x):
        items = x.get("t", x.get("fs"))
        if type(items) is not list:
            raise _Mismatch
        vals = [_hashable(e, budget) for e in items]
        if "t" in x:
            return tuple(vals)
        if len(vals) > 64:   # an expected frozenset element is small; a big one is an attack
            raise _Mismatch
        return frozenset(vals)
    return _leaf(x)


def _same_members(items: list, expected: set | frozenset | dict, budget: list) -> list:
    """Each reply element found in `expected`, no two the same; returns the matched keys."""
    if len(items) != len(expected):
        raise _Mismatch
    seen: set = set()   # holds only values equal to trusted elements: their hashes are trusted too
    out = []
    for e in items:
        k = _hashable(e, budget)
        if k not in expected or k in seen:
            raise _Mismatch
        seen.add(k)
        out.append(k)
    return out


def _same(got: Any, exp: Any, budget: list) -> bool:
    """Python's `reply == exp` on the child's JSON encoding, in time linear in the reply: no
    container of attacker-chosen values is built or hashed (a hash flood cannot slow the parent)."""
    budget[0] -= 1
    if budget[0] < 0:
        raise _Mismatch
    t = type(exp)
    if t is list:
        if type(got) is not list or len(got) != len(exp):
            return False
        return all(_same(g, e, budget) for g, e in zip(got, exp))
    if t is tuple:
        items = _tagged(got, "t")
        return len(items) == len(exp) and all(_same(g, e, budget) for g, e in zip(items, exp))
    if t in (set, frozenset):
        items = got.get("s", got.get("fs")) if type(got) is dict and len(got) == 1 else None
        if type(items) is not list:
            return False
        _same_members(items, exp, budget)
        return True
    if t is dict:
        pairs = _tagged(got, "d")
        if not all(type(p) is list and len(p) == 2 for p in pairs):
            raise _Mismatch
        keys = _same_members([p[0] for p in pairs], exp, budget)
        return all(_same(p[1], exp[k], budget) for p, k in zip(pairs, keys))
    if t is _Linked:
        items = _tagged(got, "ln")
        return len(items) == len(exp.vals) and all(_same(g, e, budget) for g, e in zip(items, exp.vals))
    if t is _Tree:
        items = _tagged(got, "tr")
        if len(items) != len(exp.preorder):
            return False
        for g, e in zip(items, exp.preorder):
            if e == ("N",):
                if g is not None:
                    return False
            elif not (type(g) is dict and len(g) == 1 and "v" in g and _same(g["v"], e[1], budget)):
                return False
        return True
    if exp is None and got is None:
        return True
    if type(got) is list or (type(got) is dict and not ({"f", "c", "b"} & got.keys())):
        return False   # a container never equals a scalar
    return bool(_leaf(got) == exp)


def _expected_linked(values: list) -> _Linked | None:
    return _Linked(tuple(values)) if values else None  # list_node([]) is None


def _expected_tree(values: list) -> _Tree | None:
    """Pre-order of the tree that the dataset's tree_node(values) builds (level order, None = hole)."""
    if not values:
        return None
    nodes = [[values[0], None, None]]
    queue, i = [nodes[0]], 1
    head = 0
    while head < len(queue):
        node = queue[head]
        head += 1
        for side in (1, 2):
            if i < len(values) and values[i] is not None:
                child = [values[i], None, None]
                node[side] = child
                queue.append(child)
            i += 1
    out, stack = [], [nodes[0]]
    while stack:
        n = stack.pop()
        if n is None:
            out.append(("N",))
            continue
        out.append(("V", n[0]))
        stack.append(n[2])
        stack.append(n[1])
    return _Tree(tuple(out))


def _expected_for(test: ValueTest) -> Any:
    if test.kind == "list":
        return _expected_linked(test.expected)
    if test.kind == "tree":
        return _expected_tree(test.expected)
    return test.expected


def _value_matches(payload: str, expected: Any) -> bool:
    """The reply (bounded JSON, parsed into builtin types) equals the expected value."""
    if len(payload) > _MAX_LINE_BYTES:
        return False
    try:
        return _same(json.loads(payload), expected, [_MAX_NODES])
    except Exception:  # any malformed payload is a wrong answer; it must never crash the grader
        return False


# --------------------------------------------------------------------------------------------
# The harness: runs in the child, first, before any untrusted code. Kept as source text so the
# child needs nothing but the standard library (not even this package) on its path.
# --------------------------------------------------------------------------------------------

_HARNESS = r'''
def _rhlab_harness():
    globals().pop("_rhlab_harness", None)
    import builtins, marshal, os, sys, resource
    import types   # reads a traceback's tb_frame at import, which strict mode forbids later
    from _json import encode_basestring_ascii as jstr

    # Capture everything used after untrusted code starts: later patches of builtins or of
    # module attributes (os.write = ...) must not reach the harness.
    write, _exit, read, getcwd, stat = os.write, os._exit, os.read, os.getcwd, os.stat
    _type, _len, _id, _exec, _eval, _compile = type, len, id, exec, eval, compile
    _getattr, _issubclass, _enumerate, _range = getattr, issubclass, enumerate, range
    BaseExc, PermErr, ImpErr, ValErr, AttrErr = BaseException, PermissionError, ImportError, ValueError, AttributeError
    tname = type.__dict__["__name__"].__get__
    int_repr, float_repr, complex_repr = int.__repr__, float.__repr__, complex.__repr__
    int_copy, float_copy, str_copy = int.__int__, float.__float__, str.__str__
    list_copy, dict_copy, set_copy, fset_copy = list.copy, dict.copy, set.copy, frozenset.copy
    tuple_getitem, bytes_hex, bytearray_hex = tuple.__getitem__, bytes.hex, bytearray.hex
    ALL = slice(None)
    wfd = int(sys.argv[1])

    chunks = []
    while True:
        b = read(0, 1 << 20)
        if not b:
            break
        chunks.append(b)
    job = marshal.loads(b"".join(chunks))
    del chunks, b
    nonce = job["nonce"]
    strict, stop = job["strict"], job["stop"]
    setup_src, code_src, test_srcs = job["setup"], job["code"], job["tests"]
    mem, cpu, fsize = job["mem"], job["cpu"], job["fsize"]
    del job

    def limit(which, value):
        soft, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        try:
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError):
            pass
    limit(resource.RLIMIT_AS, mem)
    limit(resource.RLIMIT_CPU, cpu)   # soft = hard: SIGKILL at the limit (pid 1 of a namespace ignores SIGXCPU)
    limit(resource.RLIMIT_FSIZE, fsize)
    limit(resource.RLIMIT_NPROC, 0)   # no fork, no thread (the kernel ignores it for host root only)
    limit(resource.RLIMIT_CORE, 0)

    def emit(line):
        data = (nonce + " " + line + "\n").encode("utf-8", "backslashreplace")
        while data:
            try:
                n = write(wfd, data)
            except BaseExc:
                _exit(3)   # channel closed or replaced by the program: nothing more to say
            data = data[n:]

    # ---- policy ----------------------------------------------------------------------------
    cwd = getcwd()
    def norm(p):
        # Pure string normalisation; no filesystem calls (those could be patched, and the
        # program cannot create symlinks or hard links, so strings are enough).
        t = _type(p)
        if t is bytes:
            p = p.decode("utf-8", "surrogateescape")
        elif t is not str:
            return None
        if "\x00" in p:
            return None
        if not p.startswith("/"):
            p = cwd + "/" + p
        parts = [x for x in p.split("/") if x and x != "."]
        if ".." in parts:
            return None
        return "/" + "/".join(parts)
    def under(p, roots):
        if p is None:
            return False
        for r in roots:
            if p == r or p.startswith(r + "/"):
                return True
        return False
    write_roots = (cwd, "/dev/null")
    read_roots = tuple(norm(os.path.realpath(x)) for x in sys.path if x) + (
        cwd, "/dev/null", "/dev/urandom", "/usr/share/zoneinfo", "/etc/localtime")
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC

    deny = frozenset((
        "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
        "os.kill", "os.killpg", "signal.pthread_kill", "subprocess.Popen", "pty.spawn",
        "resource.setrlimit", "resource.prlimit", "sys.addaudithook", "os.chdir", "os.chroot",
        "os.symlink", "os.link", "os.mkfifo", "os.mknod", "os.setxattr", "os.removexattr",
        "fcntl.ioctl", "os.startfile", "webbrowser.open", "sys.remote_exec"))
    deny_prefix = ("socket.", "ctypes.", "_ctypes.", "ssl.", "syslog.")
    path_events = {"os.remove": (0,), "os.rmdir": (0,), "os.rename": (0, 1), "os.mkdir": (0,),
                   "os.chmod": (0,), "os.chown": (0,), "os.truncate": (0,), "os.utime": (0,),
                   "shutil.rmtree": (0,), "shutil.copyfile": (0, 1), "shutil.copymode": (0, 1),
                   "shutil.copystat": (0, 1), "shutil.move": (0, 1), "shutil.copytree": (0, 1)}
    bad_modules = frozenset(("ctypes", "_ctypes", "_posixsubprocess", "_testcapi", "_testinternalcapi",
                             "_testbuffer", "_testmultiphase", "_testimportmultiple", "_testsinglephase",
                             "_xxsubinterpreters", "_xxinterpchannels", "_xxtestfuzz", "cffi",
                             "_cffi_backend"))
    strict_modules = frozenset(("signal", "_signal"))
    strict_deny = frozenset(("sys._current_frames", "sys.settrace", "sys.setprofile",
                             "gc.get_objects", "gc.get_referrers", "gc.get_referents"))
    frame_attrs = frozenset(("tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"))
    armed = [False]

    def hook(event, args):
        if not armed[0]:
            return
        if event == "open":
            path, mode, flags = args
            if _type(path) is int:
                return   # wraps an fd the program already holds
            p = norm(path)
            writing = (_type(flags) is int and flags & write_flags) or (
                _type(mode) is str and ("w" in mode or "a" in mode or "x" in mode or "+" in mode))
            if not under(p, write_roots if writing else read_roots):
                raise PermErr("rhlab sandbox: open(%r) is not allowed" % (path,))
            if not writing and not under(p, (cwd,)):
                # A directory fd outside the working directory would let os.open(..., dir_fd=)
                # create files there (the 'open' event does not report dir_fd).
                try:
                    isdir = (stat(p).st_mode & 0o170000) == 0o040000
                except OSError:
                    isdir = False
                if isdir:
                    raise PermErr("rhlab sandbox: opening directory %r is not allowed" % (path,))
        elif event in deny or event.startswith(deny_prefix):
            raise PermErr("rhlab sandbox: " + event + " is not allowed")
        elif event == "import":
            name = args[0].rpartition(".")[2] if _type(args[0]) is str else ""
            if name in bad_modules or (strict and name in strict_modules):
                raise ImpErr("rhlab sandbox: import of " + name + " is not allowed")
        elif event in path_events:
            for i in path_events[event]:
                if not under(norm(args[i]), write_roots):
                    raise PermErr("rhlab sandbox: " + event + " outside the working directory")
            last = args[-1]
            if event != "os.truncate" and _type(last) is int and last != -1 and event.startswith("os."):
                raise PermErr("rhlab sandbox: " + event + " with dir_fd is not allowed")
        elif strict:
            # Statement verdicts rely on the nonce staying out of reach: no frame walking.
            if event == "sys._getframe":
                raise ValErr("rhlab sandbox: frame introspection is disabled")  # stdlib callers tolerate ValueError
            if event in strict_deny:
                raise PermErr("rhlab sandbox: " + event + " is not allowed")
            if event == "object.__getattr__" and args[1] in frame_attrs:
                raise AttrErr("rhlab sandbox: " + args[1] + " is disabled")

    # ---- value encoding (see sandbox._decode) ----------------------------------------------
    def enc(x, out, depth, budget):
        budget[0] -= 1
        if budget[0] < 0 or depth > 200:
            raise ValErr("result too large or too deep")
        t = _type(x)
        if x is None:
            out.append("null")
        elif t is bool:
            out.append("true" if x else "false")
        elif _issubclass(t, int):
            out.append(int_repr(int_copy(x)))
        elif _issubclass(t, float):
            out.append('{"f":"' + float_repr(float_copy(x)) + '"}')
        elif _issubclass(t, str):
            out.append(jstr(str_copy(x)))
        elif _issubclass(t, (list, tuple, set, frozenset)):
            if _issubclass(t, list):
                items, head, tail = list_copy(x), "[", "]"
            elif _issubclass(t, tuple):
                items, head, tail = tuple_getitem(x, ALL), '{"t":[', "]}"
            elif _issubclass(t, set):
                items, head, tail = set_copy(x), '{"s":[', "]}"
            else:
                items, head, tail = fset_copy(x), '{"fs":[', "]}"
            out.append(head)
            first = True
            for v in items:
                if not first:
                    out.append(",")
                first = False
                enc(v, out, depth + 1, budget)
            out.append(tail)
        elif _issubclass(t, dict):
            out.append('{"d":[')
            first = True
            for k, v in dict_copy(x).items():
                if not first:
                    out.append(",")
                first = False
                out.append("[")
                enc(k, out, depth + 1, budget)
                out.append(",")
                enc(v, out, depth + 1, budget)
                out.append("]")
            out.append("]}")
        elif _issubclass(t, complex):
            out.append('{"c":"' + complex_repr(x) + '"}')
        elif _issubclass(t, bytes):
            out.append('{"b":"' + bytes_hex(x) + '"}')
        elif _issubclass(t, bytearray):
            out.append('{"b":"' + bytearray_hex(x) + '"}')
        else:
            raise ValErr("unsupported result type")

    def enc_linked(x, out, budget):
        if x is None:
            out.append("null")
            return
        seen = set()
        out.append('{"ln":[')
        first = True
        while x is not None:
            if _id(x) in seen:
                raise ValErr("cycle in linked list")
            seen.add(_id(x))
            if not first:
                out.append(",")
            first = False
            enc(_getattr(x, "val"), out, 1, budget)
            x = _getattr(x, "next")
        out.append("]}")

    def enc_tree(x, out, budget):
        if x is None:
            out.append("null")
            return
        seen = set()
        out.append('{"tr":[')
        stack = [x]
        first = True
        while stack:
            n = stack.pop()
            if not first:
                out.append(",")
            first = False
            if n is None:
                out.append("null")
                continue
            if _id(n) in seen:
                raise ValErr("cycle in tree")
            seen.add(_id(n))
            out.append('{"v":')
            enc(_getattr(n, "val"), out, 1, budget)
            out.append("}")
            stack.append(_getattr(n, "right"))
            stack.append(_getattr(n, "left"))
        out.append("]}")

    def encode(x, kind):
        out, budget = [], [5_000_000]
        if kind == "value":
            enc(x, out, 0, budget)
        elif kind == "list":
            enc_linked(x, out, budget)
        else:
            enc_tree(x, out, budget)
        return "".join(out)

    # ---- run -------------------------------------------------------------------------------
    setup_obj = _compile(setup_src, "<setup>", "exec")
    code_obj = _compile(code_src, "<solution>", "exec")
    tests = [(kind, _compile(src, "<test>", "eval" if kind != "stmt" else "exec"))
             for kind, src in test_srcs]
    del setup_src, code_src, test_srcs
    ns = {"__name__": "__solution__", "__builtins__": builtins}
    try:
        _exec(setup_obj, ns)   # trusted dataset code (imports, ListNode helpers): runs unhooked
    except BaseExc as e:
        emit("L err " + jstr("setup:" + tname(_type(e))))
        _exit(0)
    if strict:
        for m in ("signal", "_signal"):
            sys.modules.pop(m, None)
    sys.addaudithook(hook)
    armed[0] = True
    try:
        _exec(code_obj, ns)
    except BaseExc as e:
        emit("L err " + jstr(tname(_type(e))))
        _exit(0)
    for i, (kind, obj) in _enumerate(tests):
        try:
            if kind == "stmt":
                _exec(obj, ns)
                value = None
            else:
                value = _eval(obj, ns)
        except BaseExc as e:
            emit(str(i) + " err " + jstr(tname(_type(e))))
            if stop:
                _exit(0)
            continue
        try:
            payload = "-" if kind == "stmt" else encode(value, kind)
        except BaseExc as e:
            emit(str(i) + " err " + jstr("unusable result (" + tname(_type(e)) + ")"))
            if stop:
                _exit(0)
            continue
        emit(str(i) + " ok " + payload)
    emit("END")
    _exit(0)

_rhlab_harness()
'''


# --------------------------------------------------------------------------------------------
# Parent side
# --------------------------------------------------------------------------------------------

def _compiles(src: str, mode: str) -> bool:
    try:
        compile(src, "<check>", mode)
        return True
    except (SyntaxError, ValueError, MemoryError, RecursionError, OverflowError):
        return False


def _stop(proc: subprocess.Popen, finished: bool) -> None:
    """End the child and everything it started, and reap it.

    A program that finished gets a moment to exit by itself. Otherwise the sandbox's own pid 1
    (bwrap's child) is killed first: the kernel then kills every process of the pid namespace and
    the outer bwrap reaps it, so nothing is left for the host's init. The process group kill
    covers process isolation and an outer bwrap that does not exit.
    """
    if finished:
        try:
            proc.wait(timeout=1.0)
            return
        except subprocess.TimeoutExpired:
            pass
    try:
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    except OSError:
        children = []
    for child in children:
        try:
            os.kill(int(child), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        pass
    try:   # before the final wait(): the group id cannot be reused until the leader is reaped
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _start(isolation: str, wfd: int) -> tuple[subprocess.Popen, str | None]:
    """The child process (and, without bwrap, the host directory it works in)."""
    pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(wfd,),
                 start_new_session=True)
    if isolation == "bwrap":
        script = compiled_script(_HARNESS)
        cmd = bwrap_command([*_PY_FLAGS, f"{HARNESS_MOUNT}/{script.name}", str(wfd)], script)
        return subprocess.Popen(cmd, cwd="/", env={}, **pipes), None
    args = [*_PY_FLAGS, "-c", _HARNESS, str(wfd)]
    workdir = tempfile.mkdtemp(prefix="rhlab-sbx-")
    try:
        return subprocess.Popen([sys.executable, *args], cwd=workdir, env=child_env(workdir), **pipes), workdir
    except OSError:
        shutil.rmtree(workdir, ignore_errors=True)
        raise


def _exit_signal(rc: int | None, isolation: str) -> int | None:
    """The signal that ended the program: negative returncode directly, 128+N through bwrap."""
    if rc is None:
        return None
    if rc < 0:
        return -rc
    if isolation == "bwrap" and rc > 128:
        return rc - 128
    return None


def _run(program: Program, stop_on_failure: bool, output_cap: int, fsize_mb: int,
         isolation: str) -> SandboxResult:
    t0 = time.monotonic()
    tests = list(program.tests)
    for t in tests:
        assert isinstance(t, (ValueTest, StatementTest)), f"not a test: {t!r}"

    sources = [(program.setup, "exec"), (program.code, "exec")] + [
        (t.expr, "eval") if isinstance(t, ValueTest) else (t.code, "exec") for t in tests]
    if not all(_compiles(src, mode) for src, mode in sources):
        return SandboxResult(False, "syntax_error", n_tests=len(tests), failure="does not compile",
                             duration_s=time.monotonic() - t0)

    nonce = secrets.token_hex(16)
    # Without statement tests the verdict is the parent's value comparison, so the harness can
    # leave frame introspection alone (namedtuple, typing, logging... use it).
    strict = not tests or any(isinstance(t, StatementTest) for t in tests)
    job = marshal.dumps({
        "nonce": nonce, "strict": strict, "stop": stop_on_failure,
        "setup": program.setup, "code": program.code,
        "tests": [(t.kind, t.expr) if isinstance(t, ValueTest) else ("stmt", t.code) for t in tests],
        "mem": int(program.memory_mb) << 20, "cpu": int(math.ceil(program.timeout_s)),
        "fsize": int(fsize_mb) << 20,
    })
    expected = [_expected_for(t) if isinstance(t, ValueTest) else None for t in tests]

    rfd, wfd = os.pipe()
    try:
        proc, workdir = _start(isolation, wfd)
    except OSError as e:
        os.close(rfd)
        os.close(wfd)
        return SandboxResult(False, "error", failure=f"could not start: {e}", n_tests=len(tests),
                             duration_s=time.monotonic() - t0)
    os.close(wfd)

    out = {"stdout": bytearray(), "stderr": bytearray()}
    pending = bytearray()   # result channel bytes not yet terminated by a newline
    total_records = 0
    next_index, n_passed, end_seen, failure, timed_out = 0, 0, False, None, False
    job_view, job_off = memoryview(job), 0

    sel = selectors.DefaultSelector()
    fds = {proc.stdout.fileno(): "stdout", proc.stderr.fileno(): "stderr", rfd: "result"}
    for fd in fds:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    stdin_fd = proc.stdin.fileno()
    os.set_blocking(stdin_fd, False)
    sel.register(stdin_fd, selectors.EVENT_WRITE)

    def on_line(line: bytes) -> str | None:
        """Consume one result record; return a failure reason or None."""
        nonlocal next_index, n_passed, end_seen
        parts = line.decode("utf-8", "replace").split(" ", 3)
        if parts[0] != nonce or len(parts) < 2 or end_seen:
            return "forged or corrupt result record"
        if parts[1] == "END":
            end_seen = True
            return None if next_index == len(tests) else "harness ended early"
        if len(parts) != 4:
            return "forged or corrupt result record"
        if parts[1] == "L":
            return "error while loading the program: " + parts[3][:200]
        if next_index >= len(tests) or parts[1] != str(next_index):
            return "result records out of order"
        i = next_index
        next_index += 1
        if parts[2] == "err":
            return f"test {i} raised {parts[3][:200]}"
        if parts[2] != "ok":
            return "forged or corrupt result record"
        if isinstance(tests[i], ValueTest):
            if not _value_matches(parts[3], expected[i]):
                return f"test {i}: wrong value"
        elif parts[3] != "-":
            return "forged or corrupt result record"
        n_passed += 1
        return None

    deadline = t0 + WALL_FACTOR * program.timeout_s + WALL_SLACK_S
    try:
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in sel.select(remaining):
                fd = key.fd
                if fd == stdin_fd:
                    try:
                        job_off += os.write(fd, job_view[job_off:job_off + _READ_CHUNK])
                    except BlockingIOError:
                        continue
                    except (BrokenPipeError, OSError):
                        job_off = len(job)
                    if job_off >= len(job):
                        sel.unregister(fd)
                        proc.stdin.close()
                    continue
                try:
                    data = os.read(fd, _READ_CHUNK)
                except BlockingIOError:
                    continue
                if not data:
                    sel.unregister(fd)
                    continue
                name = fds[fd]
                if name != "result":
                    buf = out[name]
                    if len(buf) < output_cap:
                        buf += data[:output_cap - len(buf)]
                    continue
                total_records += len(data)
                if total_records > _MAX_RECORD_BYTES or len(pending) > _MAX_LINE_BYTES:
                    failure = failure or "too much result data"
                    break
                pending += data
                while failure is None and b"\n" in data and b"\n" in pending:  # rescan only if new lines came
                    line, _, rest = bytes(pending).partition(b"\n")
                    pending = bytearray(rest)
                    failure = on_line(line)
                if failure is not None and stop_on_failure:
                    break
            if failure is not None and (stop_on_failure or total_records > _MAX_RECORD_BYTES):
                break
    finally:
        _stop(proc, end_seen and failure is None)
        sel.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for f in (proc.stdin, proc.stdout, proc.stderr):
            try:
                f.close()
            except OSError:
                pass
        os.close(rfd)
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)

    rc = proc.returncode
    sig = _exit_signal(rc, isolation)
    if failure is None and pending:
        failure = "forged or corrupt result record"
    if failure is not None:
        status = "failed"
    elif timed_out:
        status, failure = "timeout", f"no verdict within the wall-clock backstop ({deadline - t0:g}s)"
    elif end_seen and n_passed == len(tests):
        status = "passed"
    elif sig in _CPU_SIGNALS:
        status, failure = "timeout", f"CPU time limit ({math.ceil(program.timeout_s)}s) exceeded"
    elif sig is not None:
        status, failure = "killed", f"killed by signal {sig} (resource limit or crash)"
    else:
        status, failure = "failed", f"exited (code {rc}) before the tests finished"
    return SandboxResult(
        passed=status == "passed", status=status,
        stdout=out["stdout"].decode("utf-8", "replace"), stderr=out["stderr"].decode("utf-8", "replace"),
        duration_s=time.monotonic() - t0, n_tests=len(tests), n_passed=n_passed, failure=failure,
        returncode=rc)


def _resolve(isolation: str | None) -> str:
    """The isolation to use; checks bwrap works (one-line error) or warns about process mode."""
    isolation = check_isolation(isolation or _default_isolation)
    if isolation == "bwrap":
        probe()
    else:
        print("WARNING: sandbox.isolation=process: model-written code runs without OS isolation "
              "(no namespaces, shared /tmp, visible host processes); use it only for trusted code",
              file=sys.stderr, flush=True)
    return isolation


def run_program(code: str, tests: Sequence[SandboxTest] = (), setup: str = "", timeout_s: float = 5.0,
                memory_mb: int = 512, *, stop_on_failure: bool = True, output_cap: int = 10_000,
                fsize_mb: int = 16, isolation: str | None = None) -> SandboxResult:
    """Run `setup` (trusted), then `code` (untrusted), then each test, in a fresh sandboxed process.

    passed iff the code loaded, every test passed (value tests: the parent's comparison;
    statement tests: ran without raising) and the harness reached its end. With no tests,
    passed iff the code ran to completion. `timeout_s` is CPU seconds for the whole program
    (rounded up to whole seconds), with a wall-clock backstop of WALL_FACTOR * timeout_s +
    WALL_SLACK_S. `isolation`: "bwrap" (default) or "process" (no OS isolation; warns).
    """
    assert timeout_s > 0 and memory_mb > 0, f"timeout_s and memory_mb must be > 0, got {timeout_s}, {memory_mb}"
    return _run(Program(code, tuple(tests), setup, timeout_s, memory_mb), stop_on_failure, output_cap,
                fsize_mb, _resolve(isolation))


def run_many(programs: Sequence[Program], workers: int | None = None, *, stop_on_failure: bool = True,
             output_cap: int = 10_000, fsize_mb: int = 16, isolation: str | None = None) -> list[SandboxResult]:
    """Run programs in parallel (one process each, `workers` at a time); results in input order.

    Every program has its own CPU limit and wall-clock backstop, so a slow one holds one worker for
    a bounded time. Identical programs run once. Raises IsolationUnavailable (one line) when
    bwrap isolation is asked for and cannot work here.
    """
    workers = workers or os.cpu_count() or 1
    assert workers >= 1, f"workers must be >= 1, got {workers}"
    unique: dict[str, Program] = {}
    for p in programs:
        assert isinstance(p, Program), f"not a Program: {p!r}"
        unique.setdefault(p.key(), p)
    keys = list(unique)
    if not keys:
        return []
    isolation = _resolve(isolation)

    def one(key: str) -> SandboxResult:
        try:
            return _run(unique[key], stop_on_failure, output_cap, fsize_mb, isolation)
        except Exception as e:  # an infrastructure fault fails this program, not the batch
            return SandboxResult(False, "error", failure=f"sandbox error: {e!r}")

    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(one, keys))
    by_key = dict(zip(keys, results))
    return [by_key[p.key()] for p in programs]
