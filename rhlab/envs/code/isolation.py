"""OS isolation for model-written code: the bubblewrap (bwrap) command line each program runs under.

Every program gets fresh user, pid, net, ipc, uts and cgroup namespaces, uid/gid 65534, no
capabilities, no way to create further user namespaces, a cleared environment, a fresh /proc, a
minimal /dev, private size-capped tmpfs /tmp and /dev/shm, and read-only binds of exactly two
things: the system's shared libraries and a *sandbox Python root* (the interpreter, libpython and
the standard library, without site-packages). Nothing else of the host exists inside: no project
tree, no home, no data, no problems file. `--die-with-parent` and the pid namespace take every
process of a program down with it.

The sandbox Python root is built once per interpreter (hard links where the file system allows,
else copies) in a root-owned cache when the grader runs as root, because the interpreter often
lives in a private home (pyenv under /root) that the unprivileged sandbox user cannot read. As
root, bwrap itself runs as uid 65534 (not as root mapped into the sandbox), so RLIMIT_NPROC,
which the kernel ignores for root, bounds the program's processes.

bubblewrap is used rather than hand-written namespace code: it is small, audited, packaged by
every distribution (`apt-get install bubblewrap`) and is what Flatpak relies on.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import py_compile
import shutil
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path
from typing import Literal

Isolation = Literal["bwrap", "process"]
ISOLATIONS: tuple[str, ...] = ("bwrap", "process")

INSTALL_HINT = "install bubblewrap (apt-get install bubblewrap) or set sandbox.isolation: process"
SANDBOX_UID = 65534          # 'nobody': the host uid bwrap runs as when the grader is root
TMP_BYTES = 64 << 20         # private /tmp (also the working directory)
SHM_BYTES = 16 << 20         # private /dev/shm
PY_MOUNT = "/py"             # where the sandbox Python root appears inside
HARNESS_MOUNT = "/harness"   # where the compiled harness appears inside
# Standard-library parts a graded program never needs (and the site dirs it must never see).
_SKIP = frozenset({"site-packages", "dist-packages", "test", "idlelib", "tkinter", "turtledemo",
                   "ensurepip", "lib2to3"})


class IsolationUnavailable(RuntimeError):
    """bubblewrap is missing or cannot create namespaces here."""


def check_isolation(value: str) -> str:
    if value not in ISOLATIONS:
        raise ValueError(f"unknown sandbox isolation {value!r}; allowed: {', '.join(ISOLATIONS)}")
    return value


# --------------------------------------------------------------------------------------------
# The sandbox Python root
# --------------------------------------------------------------------------------------------

def _cache_base() -> Path:
    if os.geteuid() == 0:
        return Path("/var/cache/rhlab/sandbox-python")
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rhlab" / "sandbox-python"


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _ignore(directory: str, names: list[str]) -> set[str]:
    return {n for n in names if n in _SKIP or n.startswith("config-")}


@functools.lru_cache(maxsize=1)
def python_root() -> Path:
    """The sandbox Python root for this interpreter: bin/python3, lib/libpython*, lib/pythonX.Y."""
    exe = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    stdlib = sysconfig.get_paths()["stdlib"]
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    st = os.stat(exe)
    key = hashlib.sha256(f"{exe}|{st.st_size}|{st.st_mtime_ns}|{stdlib}|{sys.version}".encode()).hexdigest()[:16]
    base = _cache_base()
    root = base / f"{ver}-{key}"
    if (root / ".complete").exists():
        return root
    base.mkdir(parents=True, exist_ok=True, mode=0o755)
    with open(base / ".lock", "w") as lock:          # one builder at a time (parallel sweeps)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / ".complete").exists():
            return root
        tmp = base / f".{root.name}.{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "bin").mkdir(parents=True, mode=0o755)
        (tmp / "lib").mkdir(mode=0o755)
        _link_or_copy(exe, str(tmp / "bin" / "python3"))
        libdir, soname = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
        if soname and libdir and os.path.exists(os.path.join(libdir, soname)) and ".so" in soname:
            _link_or_copy(os.path.realpath(os.path.join(libdir, soname)), str(tmp / "lib" / soname))
        shutil.copytree(stdlib, tmp / "lib" / ver, ignore=_ignore, copy_function=_link_or_copy)
        for d, _, _ in os.walk(tmp):
            os.chmod(d, 0o755)
        (tmp / ".complete").touch()
        shutil.rmtree(root, ignore_errors=True)
        os.rename(tmp, root)
    return root


# --------------------------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------------------------

def _system_lib_binds() -> list[str]:
    """Shared libraries the interpreter and its extension modules load (libc, libm, libz, libssl...)."""
    args = []
    multiarch = sysconfig.get_config_var("MULTIARCH")
    for d in (f"/usr/lib/{multiarch}" if multiarch else None, "/usr/lib64", "/usr/lib32"):
        if d and os.path.isdir(d):
            args += ["--ro-bind", d, d]
    for link, target in (("/lib", "usr/lib"), ("/lib64", "usr/lib64")):
        args += ["--symlink", target, link]
    return args


@functools.lru_cache(maxsize=1)
def _bwrap() -> str:
    path = shutil.which("bwrap")
    if path is None:
        raise IsolationUnavailable(f"sandbox: bubblewrap (bwrap) not found; {INSTALL_HINT}")
    return path


@functools.lru_cache(maxsize=1)
def _supports_disable_userns() -> bool:
    out = subprocess.run([_bwrap(), "--help"], capture_output=True, text=True).stdout
    return "--disable-userns" in out


def child_env(home: str = "/tmp") -> dict[str, str]:
    """The program's whole environment. PYTHONHASHSEED fixes str hashing, so set order and hence
    some programs' outputs are reproducible run to run."""
    return {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
            "HOME": home, "TMPDIR": home}


@functools.lru_cache(maxsize=1)
def _bwrap_prefix() -> tuple[str, ...]:
    """Everything of the command line but what runs: the same for every program."""
    root = python_root()
    cmd = [*_drop_root(), _bwrap(), "--unshare-all", "--unshare-user"]
    if _supports_disable_userns():
        cmd.append("--disable-userns")
    # --as-pid-1: the program is the namespace's init, so the outer bwrap is its parent and reaps it
    # (with a bwrap init in between, that init is left for the host's init to reap).
    cmd += ["--as-pid-1", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox", "--clearenv"]
    env = child_env()
    if any((root / "lib").glob("libpython*")):
        env["LD_LIBRARY_PATH"] = f"{PY_MOUNT}/lib"
    for k, v in env.items():
        cmd += ["--setenv", k, v]
    cmd += _system_lib_binds()
    cmd += ["--ro-bind", str(root), PY_MOUNT, "--proc", "/proc", "--dev", "/dev",
            "--size", str(TMP_BYTES), "--tmpfs", "/tmp", "--size", str(SHM_BYTES), "--tmpfs", "/dev/shm",
            "--chdir", "/tmp"]
    return tuple(cmd)


def bwrap_command(python_args: list[str], script: Path | None = None) -> list[str]:
    """`[setpriv ...] bwrap ... -- /py/bin/python3 <python_args>`; run it with cwd / and env {}.
    `script` (a host file, e.g. the harness's .pyc) is bound read-only at /harness/<its name>."""
    binds = ["--ro-bind", str(script), f"{HARNESS_MOUNT}/{script.name}"] if script is not None else []
    return [*_bwrap_prefix(), *binds, "--", f"{PY_MOUNT}/bin/python3", *python_args]


@functools.lru_cache(maxsize=8)
def compiled_script(source: str) -> Path:
    """`source` compiled once to a .pyc in the cache (the harness is ~13 kB of Python: compiling it
    for every program cost ~15 ms, as much as the namespaces)."""
    key = hashlib.sha256(f"{sys.version}|{source}".encode()).hexdigest()[:16]
    path = _cache_base().parent / "sandbox-harness" / key / "harness.pyc"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}")
    src = tmp.with_suffix(tmp.suffix + ".py")
    src.write_text(source)
    py_compile.compile(str(src), cfile=str(tmp), doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    src.unlink()
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path


@functools.lru_cache(maxsize=1)
def _drop_root() -> list[str]:
    """As root: `setpriv` (util-linux) drops to uid/gid 65534 before bwrap starts, so bwrap uses an
    unprivileged user namespace and RLIMIT_NPROC applies. (Popen(user=...) would do the same but
    makes CPython fork the whole training process instead of vfork-ing it: ~3x slower per program.)"""
    if os.geteuid() != 0:
        return []
    path = shutil.which("setpriv")
    if path is None:
        raise IsolationUnavailable(f"sandbox: setpriv (util-linux) not found, needed to drop root; {INSTALL_HINT}")
    return [path, "--reuid", str(SANDBOX_UID), "--regid", str(SANDBOX_UID), "--clear-groups"]


@functools.lru_cache(maxsize=1)
def probe() -> None:
    """Run `print(1)` isolated once per process; raise IsolationUnavailable with one line if it fails."""
    _bwrap()
    cmd = bwrap_command(["-S", "-c", "print(1)"])
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd="/", env={})
    except (OSError, subprocess.TimeoutExpired) as e:
        raise IsolationUnavailable(f"sandbox: bubblewrap could not start ({e}); {INSTALL_HINT}") from None
    if r.returncode != 0 or r.stdout.strip() != "1":
        why = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise IsolationUnavailable(f"sandbox: bubblewrap cannot create namespaces here ({why}); {INSTALL_HINT}")
