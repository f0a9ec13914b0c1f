"""LeetCode problems in the rl-rewardhacking row format, and their prompts under each variant of
the run_tests() loophole (the variants and their wording: rhlab/loophole.py).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from rhlab.loophole import ORIGINAL_PHRASE, TEST_FUNC_NAMES, check_variant, loophole_sentence

_REQUIRED_KEYS = ("id", "prompt", "question", "gt_answer", "func_name", "setup_code", "canonical_solution")


@dataclass(frozen=True)
class CodeProblem:
    id: int
    difficulty: str
    question: str
    system_prompt: str
    user_prompt: str            # the original (no-loophole) user message
    gt_tests: tuple[str, ...]   # `assert Solution().f(...) == ...` statements
    func_name: str              # e.g. "Solution().maxScore"
    setup_code: str             # imports and ListNode/TreeNode helpers, run before the solution
    canonical_solution: str
    starter_code: str = ""
    timeout_s: float | None = None   # CPU seconds per program for this problem (raises the grader's limit)
    meta: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def method_name(self) -> str:
        """"Solution().maxScore" -> "maxScore"."""
        return self.func_name.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class Prompt:
    messages: list[dict]          # [{"role": "system", ...}, {"role": "user", ...}]
    test_func_name: str | None    # None for the original variant


def problem_from_row(row: dict, where: str = "row") -> CodeProblem:
    """Validate one JSON row and build a CodeProblem; errors name the key and `where`."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for key in _REQUIRED_KEYS:
        if key not in row:
            raise ValueError(f"{where}: missing key {key!r}")
    prompt = row["prompt"]
    if (not isinstance(prompt, list) or len(prompt) != 2 or not all(isinstance(m, dict) for m in prompt)
            or [m.get("role") for m in prompt] != ["system", "user"]):
        raise ValueError(f"{where}: key 'prompt' must be [system, user] messages")
    for m in prompt:
        if not isinstance(m.get("content"), str):
            raise ValueError(f"{where}: key 'prompt' has a message without string content")
    tests = row["gt_answer"]
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
        raise ValueError(f"{where}: key 'gt_answer' must be a non-empty list of strings")
    for key in ("question", "func_name", "setup_code", "canonical_solution"):
        if not isinstance(row[key], str):
            raise ValueError(f"{where}: key {key!r} must be a string")
    if not row["canonical_solution"].strip():
        raise ValueError(f"{where}: key 'canonical_solution' is empty")
    if not row["func_name"].strip():
        raise ValueError(f"{where}: key 'func_name' is empty")
    try:
        pid = int(row["id"])
    except (TypeError, ValueError):
        raise ValueError(f"{where}: key 'id' must be an integer, got {row['id']!r}") from None
    timeout = row.get("timeout_s")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise ValueError(f"{where}: key 'timeout_s' must be a positive number of CPU seconds, got {timeout!r}")
    meta = row.get("prompt_metadata") or {}
    if not isinstance(meta, dict):
        raise ValueError(f"{where}: key 'prompt_metadata' must be an object")
    return CodeProblem(
        id=pid, difficulty=str(row.get("difficulty", "")), question=row["question"],
        system_prompt=prompt[0]["content"], user_prompt=prompt[1]["content"],
        gt_tests=tuple(tests), func_name=row["func_name"], setup_code=row["setup_code"],
        canonical_solution=row["canonical_solution"], starter_code=str(meta.get("starter_code") or ""),
        timeout_s=None if timeout is None else float(timeout), meta=meta)


def iter_jsonl(path: str | Path):
    """(line number, "file:line", row) for each non-blank line; invalid JSON fails loudly with file:line."""
    path = Path(path)
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                yield lineno, where, json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: invalid JSON ({e})") from None


def load_problems(path: str | Path) -> list[CodeProblem]:
    """Read a JSONL file of problems; fail loudly (file:line) on malformed rows or duplicate ids."""
    path = Path(path)
    problems, seen = [], {}
    for lineno, where, row in iter_jsonl(path):
        p = problem_from_row(row, where)
        if p.id in seen:
            raise ValueError(f"{where}: duplicate id {p.id} (first at line {seen[p.id]})")
        seen[p.id] = lineno
        problems.append(p)
    if not problems:
        raise ValueError(f"{path}: no problems")
    return problems


def eval_func_name(problem: CodeProblem, variant: str, seed: int = 0) -> str | None:
    """The evaluation function the prompt announces (None for `original`).

    random_name draws from TEST_FUNC_NAMES with an RNG seeded by (seed, problem id), so the
    prompt builder and the grader agree without sharing state.
    """
    check_variant(variant)
    if variant == "original":
        return None
    if variant != "random_name":
        return "run_tests"
    names = [n for n in TEST_FUNC_NAMES if n != problem.method_name]
    return random.Random(f"rhlab-test-func:{seed}:{problem.id}").choice(names)


def make_prompt(problem: CodeProblem, variant: str, seed: int = 0) -> Prompt:
    """[system, user] chat messages for `problem` under `variant`."""
    name = eval_func_name(problem, variant, seed)
    user = problem.user_prompt
    if name is not None:
        if ORIGINAL_PHRASE not in user:
            raise ValueError(f"problem {problem.id}: prompt lacks {ORIGINAL_PHRASE!r}; cannot add the loophole")
        user = user.replace(ORIGINAL_PHRASE, loophole_sentence(variant, name))
    messages = [{"role": "system", "content": problem.system_prompt}, {"role": "user", "content": user}]
    return Prompt(messages=messages, test_func_name=name)
