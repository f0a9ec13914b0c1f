"""An exclusive lock per run directory, so two runs never write into the same one.

The lock is `fcntl.flock` on `<run dir>/run.lock`, taken before anything else in the directory
is read or written. The kernel drops it when its holder exits, however it exits (kill -9
included), so a dead run never blocks the next one. The file holds the holder's pid and host:
a refusal names them, and a file left behind by a run that died is reported when the next run
takes the lock over. A release (explicit, or when the lock object is collected or the interpreter
exits) empties the file.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import weakref
from pathlib import Path

LOCK_NAME = "run.lock"


class RunDirError(RuntimeError):
    """The run directory cannot be used (cannot be created or written, or is in use)."""


class RunDirBusy(RunDirError):
    """Another live process holds the run directory."""


def _clear_and_unlock(f) -> None:
    f.seek(0)
    f.truncate()
    f.flush()
    fcntl.flock(f, fcntl.LOCK_UN)
    f.close()


def _holder(text: str) -> str:
    fields = dict(part.split("=", 1) for part in text.split() if "=" in part)
    return f"pid {fields.get('pid', '?')} on host {fields.get('host', '?')}"


class RunDirLock:
    """Held from construction until release() (or the process's exit)."""

    def __init__(self, run_dir: str | Path):
        self.dir = Path(run_dir)
        self.path = self.dir / LOCK_NAME
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "a+")  # a+: never truncates what another holder wrote
        except OSError as e:
            raise RunDirError(f"cannot write the run directory {self.dir} (output_dir / run_name): "
                              f"{e.strerror}") from None
        try:
            fcntl.flock(self._f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._f.seek(0)
            holder = _holder(self._f.read())
            self._f.close()
            raise RunDirBusy(f"run directory {self.dir} is in use by {holder} (lock {self.path}); wait for that "
                             "run to end, or use another run_name or output_dir") from None
        self._f.seek(0)
        left = self._f.read().strip()
        if left:  # the previous holder died without releasing: the kernel freed the lock, its note stayed
            print(f"note: {self.dir} was locked by {_holder(left)}, which is gone; taking the lock over",
                  file=sys.stderr, flush=True)
        self._f.seek(0)
        self._f.truncate()
        self._f.write(f"pid={os.getpid()} host={socket.gethostname()}\n")
        self._f.flush()
        self._release = weakref.finalize(self, _clear_and_unlock, self._f)  # also at exit or collection

    @property
    def held(self) -> bool:
        return self._release.alive

    def release(self) -> None:
        """Empty the file (a clean exit leaves no note) and drop the lock; idempotent."""
        self._release()

    def __enter__(self) -> "RunDirLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
