"""Small shared helpers: atomic writes, JSON lines, seeding. Light to import (torch only inside seed_everything)."""

from __future__ import annotations

import json
import os
import random
import tempfile
import types
from pathlib import Path
from typing import Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

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


def read_jsonl(path: str | Path, torn_tail: bool = False) -> list[dict]:
    """The rows (JSON objects) of a JSONL file; a missing file reads as empty, blank lines are skipped.

    torn_tail: drop an unparsable last line that lacks its newline (append_jsonl writes each row and
    its newline at once: such a line is a row being written, or one cut off by a kill). Without it,
    and for any other bad line, ValueError naming the file and line."""
    path = Path(path)
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    rows = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if torn_tail and i == len(lines) and not text.endswith("\n"):
                break
            raise ValueError(f"{path}: line {i} is not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}: line {i} must be a JSON object, got {type(row).__name__}")
        rows.append(row)
    return rows


def truncate_jsonl(path: str | Path, max_step: int) -> None:
    """Keep rows with step <= max_step (and drop a torn last row): a resumed run recomputes the rest exactly once."""
    rows = [r for r in read_jsonl(path, torn_tail=True) if r["step"] <= max_step]
    atomic_write_text(path, "".join(json.dumps(r, default=float) + "\n" for r in rows))


def format_validation_error(err: ValidationError, model: type[BaseModel] | None = None, prefix: str = "",
                            what: str = "") -> str:
    """A pydantic error as one line, `key: message; key: message`: each key the dotted path under `prefix`;
    an unknown key names the allowed ones (those of `model` at that path), a bad value shows what was
    given. `what` names the component whose params these are (e.g. "reward 'happy_count'")."""
    parts = []
    for e in err.errors():
        key = ".".join([prefix] * bool(prefix) + [str(p) for p in e["loc"]]) or "<root>"
        if e["type"] == "extra_forbidden":
            allowed = ", ".join(_allowed_at(model, e["loc"])) if model is not None else ""
            msg = f"unknown key{f' for {what}' if what else ''}; allowed: {allowed or 'none'}"
        elif e["type"] == "missing":
            msg = f"required by {what}" if what else e["msg"]
        else:
            msg = e["msg"].removeprefix("Value error, ")
            if "input" in e and not isinstance(e["input"], dict):
                msg += f" (got {e['input']!r})"
        parts.append(f"{key}: {msg}")
    return "; ".join(parts)


def unwrap_optional(ann):
    """X for an annotation Optional[X]; any other annotation as it is."""
    args = [a for a in get_args(ann) if a is not type(None)]
    return args[0] if get_origin(ann) in (Union, types.UnionType) and len(args) == 1 else ann


def _allowed_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The keys of the (sub)model that holds the last key of loc."""
    for key in loc[:-1]:
        if isinstance(key, int):  # an index into a list of sections
            continue
        ann = unwrap_optional(getattr(model.model_fields.get(key), "annotation", None))
        if get_origin(ann) is list:
            ann = get_args(ann)[0]
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return sorted(model.model_fields)


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
