"""Small shared helpers: atomic writes, JSON lines, seeding."""

from __future__ import annotations

import json
import os
import random
import tempfile
from pathlib import Path

import numpy as np
import torch

# Read once at import (os.umask can only be read by setting it, which is not thread-safe).
UMASK = os.umask(0)
os.umask(UMASK)


def user_mode(path: str | Path) -> None:
    """Give a file the mode an ordinary open() would (0666 minus the umask): tempfile.mkstemp and
    safetensors create files 0600, which other users of a shared run directory could not read."""
    os.chmod(path, 0o666 & ~UMASK)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write to a temp file in the same directory, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    user_mode(tmp)
    os.replace(tmp, path)


def write_json(path: str | Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, default=float) + "\n")


def append_jsonl(path: str | Path, row: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row, default=float) + "\n")
        f.flush()


def read_jsonl(path: str | Path) -> list[dict]:
    """All complete rows; a torn last line (killed mid-write) is dropped, any other bad line raises."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    rows = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}: line {i + 1} is not valid JSON") from None
    return rows


def truncate_jsonl(path: str | Path, max_step: int) -> None:
    """Keep rows with step <= max_step: a resumed run recomputes the rest exactly once."""
    rows = [r for r in read_jsonl(path) if r["step"] <= max_step]
    atomic_write_text(path, "".join(json.dumps(r, default=float) + "\n" for r in rows))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
